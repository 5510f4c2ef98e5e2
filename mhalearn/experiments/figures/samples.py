"""The samples study's figures (:class:`~mhalearn.experiments.samples.Samples`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

import numpy as np

from mhalearn import plots
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.figures.classifier import classifier_settings


@register_figure("samples")
def figure(ds):
    """Test loss vs samples (log–log, with an n^(−1) guide), and the generalisation gap
    beside the stability proxy, a curve per head count."""
    fig, axes = plots.panels(1, 3)
    n = ds["samples"].values
    hs = ds["heads"].values
    for i, h in enumerate(hs):
        one = ds.sel(heads=h)
        at = plots.shift(i, len(hs))
        slope = (
            f", slope {float(one['test_loss_slope']):.2f} "
            f"[{float(one['test_loss_slope_lower']):.2f}, "
            f"{float(one['test_loss_slope_upper']):.2f}]"
            if "test_loss_slope" in one
            else ""
        )
        plots.band(
            axes[0, 0],
            one["test_loss"],
            "samples",
            f"H = {h}{slope}",
            at,
            **plots.style(i, "-"),
        )
        plots.rate(axes[0, 2], one["proxy_bounds_gap"], "samples", None, at, **plots.style(i))
        plots.band(axes[0, 1], one["gap"], "samples", f"H = {h}", at, **plots.style(i, "-"))
        proxy = f"H = {h}, stability proxy (right, dashed)"
        plots.band(
            axes[0, 1],
            one["stability_proxy"],
            "samples",
            proxy,
            at,
            **plots.style(i, "--", True),
        )
    first = float(np.nanmedian(plots.median(ds["test_loss"].isel(samples=0))))
    plots.guide(axes[0, 0], n, first, -1.0, "∝ 1/n")
    axes[0, 0].set(ylabel=plots.label_of(ds, "test_loss"))
    axes[0, 1].set(ylabel="gap (solid) and stability proxy (dashed)")
    axes[0, 2].set(ylabel="share of runs with gap ≤ proxy", ylim=(-0.05, 1.05))
    for ax in axes[0]:
        plots.values_axis(ax, n, "training samples n")
    for ax in axes[0, :2]:
        ax.set_yscale("log")
    config = plots.config_of(ds)
    caption = (
        f"Median over {plots.instances(ds)} random training sets and starts per point, band: "
        f"interquartile range; shares with Wilson 95% bars; slopes: least squares on the "
        "log medians, 95% bootstrap interval. Full-batch GD, η = "
        f"{config.get('lr', '?')}, until the training loss is at most "
        f"{config.get('target_loss', '?')} (budget {config.get('steps', '?')} steps); gap = "
        "test loss − training loss (points where it is negative are not drawn on the log "
        "axis)."
    )
    return plots.finish(fig, "Generalisation vs samples: " + classifier_settings(ds), caption)
