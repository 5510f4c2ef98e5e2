"""The max_margin study's figures (:class:`~mhalearn.experiments.max_margin.MaxMargin`):
functions of its results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

import numpy as np

from mhalearn import plots
from mhalearn.experiments.figures import register_figure


@register_figure("max_margin")
def figure(ds):
    """Correlation with W_mm vs step (median, interquartile band) per cell; the softmax
    weight on the selected tokens; the share of instances whose correlation passes 0.99."""
    fig, axes = plots.panels(1, 3)
    axes = axes[0]
    cells = [
        (s, a, h)
        for s in ds["shape"].values
        for a in ds["attention"].values
        for h in ds["heads"].values
    ]
    for i, (s, a, h) in enumerate(cells):
        sel = ds.sel(shape=s, attention=a, heads=h)
        # hollow markers every other curve and a small shift along t: cells whose curves
        # coincide (cross and self attention do, in distribution) stay told apart
        kw = {**plots.style(i, hollow=i % 2 == 1), "label": f"{s} {a} H={h}"}
        kw["shift"] = plots.shift(i, len(cells), 0.08)
        plots.band(axes[0], sel["trace_correlation"], "step", **kw)
        plots.band(axes[1], sel["trace_selected_weight"], "step", **kw)
        passed = (sel["trace_correlation"] > 0.99).astype(float)
        passed = passed.where(np.isfinite(sel["trace_correlation"]))
        plots.rate(axes[2], passed, "step", **kw)
    for ax in axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("normalised GD step t")
    axes[0].set(ylabel="corr(W_t, W_mm), mean over heads")
    axes[1].set(ylabel="softmax weight on the selected token")
    axes[2].set(ylabel="share with corr > 0.99")
    axes[2].set_ylim(-0.05, 1.05)
    config = plots.config_of(ds)
    caption = (
        f"Median over {plots.instances(ds)} random problems per curve, band: interquartile "
        "range; right: Wilson 95% bars. Shapes n×T×d; cross: a query token per sample, "
        "self: the first token queries. W alone trained from 0 by normalised GD (steps of "
        f"length {config.get('lr', '?')}, {config.get('steps', '?')} steps), readouts v_h "
        "fixed; W_mm: each head's Frobenius attention SVM of the tokens it selects at the "
        "end (our convention zᵀWx; the paper's W is its transpose). Curves are shifted "
        "slightly along t, every other one with hollow markers, so that curves that "
        "coincide stay visible."
    )
    return plots.finish(fig, "Attention converges to the attention SVM", caption)
