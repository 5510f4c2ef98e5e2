"""The margin study's figures (:class:`~mhalearn.experiments.margin.Margin`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from mhalearn import plots
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.figures.classifier import classifier_settings


@register_figure("margin")
def figure(ds):
    """NTK margin at initialisation vs heads, a curve per initialisation (log x), and the
    share of NTK-separable training sets with Wilson 95% bars."""
    fig, axes = plots.panels(2, 2)
    inits, h = ds["init"].values, ds["heads"].values
    for row, (suffix, what) in enumerate((("", "∂Φ/∂(U, W)"), ("_u", "∂Φ/∂U only"))):
        for i, init in enumerate(inits):
            kw = {"shift": plots.shift(i, len(inits)), **plots.style(i)}
            kw["label"] = str(init) if row == 0 else None
            plots.band(axes[row, 0], ds[f"margin{suffix}"].sel(init=init), "heads", **kw)
            plots.rate(axes[row, 1], ds[f"separable{suffix}"].sel(init=init), "heads", **kw)
        axes[row, 0].set(ylabel=f"NTK margin γ at θ₀, {what}")
        axes[row, 1].set(ylabel=f"share separable, {what}")
        axes[row, 1].set_ylim(-0.05, 1.05)
        for ax in axes[row]:
            plots.values_axis(ax, h, plots.LABELS["heads"])
    config = plots.config_of(ds)
    caption = (
        f"Left: median over {plots.instances(ds)} random training sets of n = "
        f"{config.get('samples', '?')} per point (0: not separable), band: interquartile "
        "range. Right: share separable, bars: Wilson 95% interval. Top: the full NTK "
        "features; bottom: the readout's alone (at W = 0, the mean-pooled linear model). "
        "Inits: zero (W = 0), gaussian (W Gaussian), one_step (one GD step of size "
        f"{config.get('one_step_lr', '?')} from W = 0)."
    )
    return plots.finish(fig, "NTK margin at initialisation: " + classifier_settings(ds), caption)
