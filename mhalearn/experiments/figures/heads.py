"""The heads study's figures (:class:`~mhalearn.experiments.heads.Heads`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

import numpy as np

from mhalearn import plots
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.figures.classifier import classifier_settings


@register_figure("heads")
def figure(ds):
    """Training loss (solid) and test loss (dashed) vs step, a curve per head count, a
    column per step size, a row per noise level; log–log."""
    lrs, noises, hs = ds["lr"].values, ds["noise"].values, ds["heads"].values
    fig, axes = plots.panels(len(noises), len(lrs))
    steps = ds["step"].values
    shown = np.flatnonzero(steps > 0)
    for r, noise in enumerate(noises):
        for j, lr in enumerate(lrs):
            ax = axes[r, j]
            cell = ds.sel(noise=noise, lr=lr).isel(step=shown)
            for i, h in enumerate(hs):
                one = cell.sel(heads=h)
                plots.band(
                    ax,
                    one["trace_loss"],
                    "step",
                    label=f"H = {h}, train",
                    **plots.style(i, "-"),
                )
                test = plots.style(i, "--", hollow=True)
                plots.band(ax, one["trace_test_loss"], "step", label=f"H = {h}, test", **test)
            ax.set(
                title=f"η = {lr:g}, noise σ = {noise:g}",
                xlabel=plots.LABELS["step"],
                ylabel="logistic loss",
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
    caption = (
        f"Median over {plots.instances(ds)} random training sets and starts per point, band: "
        "interquartile range; solid: training loss, dashed (open markers): test loss on a "
        "held-out draw of the mixture. Full-batch GD, the same problems for every H and η."
    )
    config = plots.config_of(ds)
    title = (
        f"Classifier training with H heads: samples {config.get('samples', '?')}, steps "
        f"{config.get('steps', '?')}, " + classifier_settings(ds)
    )
    return plots.finish(fig, title, caption)
