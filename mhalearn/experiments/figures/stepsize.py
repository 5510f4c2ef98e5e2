"""The stepsize study's figures (:class:`~mhalearn.experiments.stepsize.StepSize`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

import numpy as np

from mhalearn import plots, stats
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.figures.classifier import classifier_settings


@register_figure("stepsize")
def figure(ds):
    """Top: the largest stable step vs heads; the Hessian norms at θ₀ with a 1/√H guide;
    the weak-convexity ratio. Bottom: training-loss curves per head count at each
    instance's own largest stable step and at the fixed step; their fitted rates vs heads
    with 95% bootstrap intervals of the median, beside the theory's −1."""
    fig, axes = plots.panels(2, 3)
    h = ds["heads"].values
    config = plots.config_of(ds)
    plots.band(
        axes[0, 0], ds["largest_stable_lr"], "heads", label="largest stable η", **plots.style(0)
    )
    norm = plots.median(ds["hessian_norm"])
    axes[0, 0].plot(h, 2 / norm, label="2 / median ‖∇²L̂(θ₀)‖", **plots.style(1))
    axes[0, 0].set(ylabel=plots.LABELS["lr"])
    plots.band(axes[0, 1], ds["hessian_norm"], "heads", label="‖∇²L̂(θ₀)‖ (loss)", **plots.style(2))
    plots.band(
        axes[0, 1],
        ds["score_hessian_norm"],
        "heads",
        label="‖∇²Φ(X; θ₀)‖ (score)",
        **plots.style(3),
    )
    plots.guide(axes[0, 1], h, float(plots.median(ds["score_hessian_norm"])[0]), -0.5, "∝ 1/√H")
    axes[0, 1].set(ylabel="Hessian spectral norm at θ₀")
    plots.band(
        axes[0, 2], ds["weak_convexity"], "heads", label="−λ_min(∇²L̂)/L̂ at θ₀", **plots.style(4)
    )
    plots.guide(axes[0, 2], h, float(np.abs(plots.median(ds["weak_convexity"])[0])), -0.5, "∝ 1/√H")
    axes[0, 2].set(ylabel=plots.label_of(ds, "weak_convexity"))
    for ax in axes[0]:
        plots.values_axis(ax, h, plots.LABELS["heads"])
        ax.set_yscale("log")
    fixed = config.get("fixed_lr", "?")
    for ax, run, what in (
        (axes[1, 0], "star", "at each instance's largest stable η"),
        (axes[1, 1], "fixed", f"at η = {fixed}"),
    ):
        curves = ds[f"trace_loss_{run}"].isel(step=slice(1, None))
        for i, heads in enumerate(h):
            plots.band(ax, curves.sel(heads=heads), "step", label=f"H = {heads}", **plots.style(i))
        ax.set(xscale="log", yscale="log", xlabel=plots.LABELS["step"], ylabel="training loss")
        ax.set_title(what, fontsize="medium")
    for i, run in enumerate(("star", "fixed")):
        mid, lo, hi = stats.median_interval(ds[f"rate_{run}"].transpose("heads", "instance").values)
        label = "own largest stable η" if run == "star" else f"η = {fixed}"
        axes[1, 2].errorbar(
            h * plots.shift(i, 2),
            mid,
            yerr=[mid - lo, hi - mid],
            capsize=3,
            label=label,
            **plots.style(i),
        )
    axes[1, 2].axhline(-1, color="k", ls=":", label="theory: −1")
    axes[1, 2].set(ylabel="fitted rate d log L̂ / d log t")
    plots.values_axis(axes[1, 2], h, plots.LABELS["heads"])
    caption = (
        f"Median over {plots.instances(ds)} random problems per head count, band: "
        "interquartile range; rates: 95% bootstrap interval of the median. A step size is "
        f"stable when {config.get('steps', '?')} full-batch steps never raise the training "
        "loss (by more than rise_tol, relative) and stay finite; the largest one is found "
        f"per instance by {config.get('halvings', '?')} halvings of "
        f"[{config.get('lr_low', '?')}, {config.get('lr_high', '?')}] in log η. Curves: "
        f"{config.get('train_steps', '?')} steps; rates fitted from step "
        f"{config.get('rate_from', 0) * config.get('train_steps', 0):g} on. Extreme "
        f"eigenvalues by {config.get('lanczos_matvecs', '?')} Lanczos steps on "
        "Hessian-vector products; the score's norm is averaged over "
        f"{config.get('score_samples', '?')} training sequences."
    )
    title = (
        f"Step size, convergence and curvature vs heads: samples {config.get('samples', '?')}, "
        + classifier_settings(ds)
    )
    return plots.finish(fig, title, caption)
