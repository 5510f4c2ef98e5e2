"""The aim study's figures (:class:`~mhalearn.experiments.aim.AIM`): functions of its results
Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from mhalearn import plots
from mhalearn.experiments.figures import register_figure


@register_figure("aim")
def figure(ds):
    """The error ‖S − S*‖²_F/D and the training loss vs α (log–log), a curve per (D, T, ρ)."""
    fig, axes = plots.panels(1, 2)
    curves = [
        (d, t, r) for d in ds["dim"].values for t in ds["tokens"].values for r in ds["rho"].values
    ]
    for i, (d, t, r) in enumerate(curves):
        kw = {"shift": plots.shift(i, len(curves)), **plots.style(i)}
        one = ds.sel(dim=d, tokens=t, rho=r)
        plots.band(axes.flat[0], one["mse"], "alpha", label=f"D={d}, T={t}, ρ={r:g}", **kw)
        plots.band(axes.flat[1], one["train_loss"], "alpha", **kw)
    axes.flat[0].set(ylabel="‖S − S*‖²_F / D", xscale="log", yscale="log")
    axes.flat[1].set(ylabel="training loss Σ(ŷ − y)²/D", xscale="log", yscale="log")
    for ax in axes.flat:
        ax.set_xlabel("α = n/D²")
    config = plots.config_of(ds)
    caption = (
        f"Median over {plots.instances(ds)} random teachers (and data) per point, band: "
        f"interquartile range. Learner: full-batch Adam, lr {config.get('lr', '?')}, "
        f"{config.get('steps', '?')} steps, from W ~ N(0, {config.get('init_scale', '?')}²), "
        "as Boncoraglio et al. train it."
    )
    return plots.finish(fig, "The attention-indexed model learned by Adam", caption)
