"""The regimes study's figures (:class:`~mhalearn.experiments.regimes.Regimes`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from mhalearn import plots
from mhalearn.experiments.figures import register_figure


@register_figure("regimes")
def figure(ds):
    """Share of rows on which every head agrees (log scale) and mean max attention vs β,
    a curve per head count, a column per input distribution (first tokens value)."""
    inputs = ds["inputs"].values
    heads = ds["heads"].values
    fig, axes = plots.panels(2, len(inputs))
    tokens = int(ds["tokens"].values[0])
    for j, dist in enumerate(inputs):
        cell = ds.sel(inputs=dist).isel(tokens=0)
        for i, h in enumerate(heads):
            kw = {
                "label": f"heads m = {h}",
                "shift": plots.shift(i, len(heads)),
                **plots.style(i),
            }
            plots.band(axes[0, j], cell["agreement"].sel(heads=h), "beta", **kw)
            plots.band(axes[1, j], cell["mean_max_attention"].sel(heads=h), "beta", **kw)
        axes[0, j].set(title=f"{dist} tokens", ylabel=plots.label_of(ds, "agreement"))
        axes[0, j].set_yscale("log")
        axes[1, j].set(ylabel=plots.label_of(ds, "mean_max_attention"))
        for ax in axes[:, j]:
            plots.values_axis(ax, ds["beta"].values, plots.LABELS["beta"])
    config = plots.config_of(ds)
    caption = (
        f"Median over {plots.instances(ds)} random teachers per point, band: interquartile "
        "range; "
        f"statistics on {config.get('samples', '?')} fresh sequences per teacher. A row agrees "
        f"when every head puts at least 1 − δ = {1 - config.get('delta', float('nan')):g} of "
        "its attention on one token value (rows where none agree are 0 and not drawn on the "
        "log axis)."
    )
    title = f"Attention regimes of random teachers: tokens {tokens}, " + plots.settings(
        ds, ("dim", "family")
    )
    return plots.finish(fig, title, caption)
