"""The studies' figures, apart from the studies: one module per study, each a function of the
study's results Dataset registered under the study's name (:func:`register_figure`), and
:func:`plot`, which draws the figure of whichever study produced a Dataset. A study computes
and never plots; its figure module reads the study's settings back from the Dataset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: every registered figure, by study name
FIGURES: dict[str, Callable[..., Any]] = {}


def register_figure(study: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make the decorated function ``figure(ds, ...)`` (a matplotlib Figure from the results
    ``ds``) the figure of the study named ``study`` for :func:`plot`."""

    def register(figure: Callable[..., Any]) -> Callable[..., Any]:
        if study in FIGURES and FIGURES[study] is not figure:
            raise ValueError(f"a figure of the study {study!r} is registered already")
        FIGURES[study] = figure
        return figure

    return register


def plot(ds):
    """The figure of the study that produced ``ds`` (its ``study`` attribute)."""
    study = ds.attrs.get("study")
    if study not in FIGURES:
        raise ValueError(
            f"the results carry no study with a figure (attribute study={study!r}); "
            f"expected one of {sorted(FIGURES)}"
        )
    return FIGURES[study](ds)


# the built-in studies' figures register themselves
from mhalearn.experiments.figures import (  # noqa: E402
    aim,
    attention_phase,
    heads,
    margin,
    max_margin,
    phase,
    recovery,
    regimes,
    samples,
    sculpt,
    stepsize,
)

__all__ = [
    "FIGURES",
    "aim",
    "attention_phase",
    "heads",
    "margin",
    "max_margin",
    "phase",
    "plot",
    "recovery",
    "regimes",
    "register_figure",
    "samples",
    "sculpt",
    "stepsize",
]
