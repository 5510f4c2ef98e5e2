"""The recovery study's figures (:class:`~mhalearn.experiments.recovery.Recovery`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from typing import Any

from mhalearn import plots
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.recovery import Recovery, budget_starts, describe_learner


@register_figure("recovery")
def figure(ds):
    """Success rate (Wilson 95% bars) and median squared normalised prediction error (IQR
    band) vs samples, a curve per learner, a column per head count."""
    config = plots.config_of(ds)
    heads, learners = ds["heads"].values, ds["learner"].values
    fig, axes = plots.panels(2, len(heads))
    n = ds["samples"].values
    for j, h in enumerate(heads):
        cell = ds.sel(heads=h)
        for i, learner in enumerate(learners):
            one = cell.sel(learner=learner)
            label = _label(str(learner), config)
            kw = {"label": label, "shift": plots.shift(i, len(learners)), **plots.style(i)}
            plots.rate(axes[0, j], one["success"], "samples", **kw)
            plots.band(axes[1, j], one["prediction_error"], "samples", **kw)
        axes[0, j].set(title=f"heads m = {h}", ylabel="share of teachers recovered")
        axes[0, j].set_ylim(-0.05, 1.05)
        axes[1, j].set(ylabel=plots.label_of(ds, "prediction_error"))
        axes[1, j].set_yscale("log")
        for ax in axes[:, j]:
            plots.values_axis(ax, n, plots.LABELS["samples"])
    n_inst = plots.instances(ds)
    tol = ds["success"].attrs.get("tolerance", config.get("success_tol", "?"))
    caption = (
        f"Top: share of the {n_inst} teachers per point recovered (every matched Θ_i "
        f"and W_i within relative Frobenius error {tol:g}), bars: Wilson 95% interval. Bottom: "
        f"median over the {n_inst} teachers of Σ‖F̂(X) − F(X)‖²_F / Σ‖F(X)‖²_F on fresh "
        "inputs, band: interquartile range. Every learner sees the same teachers and samples; "
        "curves are shifted slightly along N so that coinciding ones stay visible."
    )
    title = "Recovering Chen–Li teachers: " + plots.settings(
        ds, ("dim", "tokens", "beta", "family")
    )
    return plots.finish(fig, title, caption)


def _label(name: str, config: dict[str, Any]) -> str:
    """What learner ``name`` ran in the recovery study whose config (JSON) is ``config``."""
    study = Recovery.from_config(config)
    learner = study.learner_config(name)
    return describe_learner(name, learner, budget_starts(learner, (study.budget,)))
