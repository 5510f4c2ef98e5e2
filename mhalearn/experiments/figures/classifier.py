"""What the classifier studies' figures share: the mixture and model settings in a title."""

from __future__ import annotations

from mhalearn import plots


def classifier_settings(ds) -> str:
    """The classifier studies' mixture and model settings, as a figure's title says them."""
    return plots.settings(
        ds,
        (
            "tokens",
            "dim",
            "relevant_fraction",
            "irrelevant_means",
            "decoys",
            "positions",
            "head_scaling",
        ),
    )
