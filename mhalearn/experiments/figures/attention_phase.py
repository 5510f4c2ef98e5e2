"""The attention_phase study's figures
(:class:`~mhalearn.experiments.attention_phase.AttentionPhase`): functions of its results
Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from mhalearn import plots
from mhalearn.experiments.figures import register_figure

#: the panels: variable and axis label
PANELS = (
    ("test_error", "test error per sequence"),
    ("train_loss", "training loss (with weight decay)"),
    ("m", "positional overlap m = |1ᵀQ|/d"),
    ("theta", "semantic overlap θ = |Q*ᵀQ|/d"),
)


@register_figure("attention_phase")
def figure(ds):
    """Test error, training loss, m and θ vs α, a curve per start, ω and d."""
    fig, axes = plots.panels(2, 2)
    curves = [
        (init, w, d)
        for init in ds["init"].values
        for w in ds["omega"].values
        for d in ds["dim"].values
    ]
    for i, (init, w, d) in enumerate(curves):
        kw = {"shift": plots.shift(i, len(curves)), **plots.style(i)}
        one = ds.sel(init=init, omega=w, dim=d)
        for k, (name, _) in enumerate(PANELS):
            label = f"{init} start, ω={w:g}, d={d}" if k == 0 else None
            plots.band(axes.flat[k], one[name], "alpha", label=label, **kw)
    for ax, (_, what) in zip(axes.flat, PANELS, strict=True):
        ax.set(xlabel="α = n/d", ylabel=what)
    config = plots.config_of(ds)
    caption = (
        f"Median over {plots.instances(ds)} random teachers (and data) per point, band: "
        f"interquartile range. Learner: full-batch gradient descent, lr "
        f"{config.get('lr', '?')}, {config.get('steps', '?')} steps, weight decay "
        f"{config.get('lmbda', '?')}, σ = {config.get('sigma', '?')}, as Cui et al. train it."
    )
    return plots.finish(fig, "Positional vs semantic attention", caption)
