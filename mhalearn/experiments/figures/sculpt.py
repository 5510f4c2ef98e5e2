"""The sculpt study's figures (:class:`~mhalearn.experiments.sculpt.Sculpt`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mhalearn import plots
from mhalearn.experiments.figures import register_figure
from mhalearn.learners import chen_li as cl
from mhalearn.metrics.recovery import TILT_DIRECTIONS

#: the figure's rows, in order
FIGURE_ROWS: tuple[str, ...] = ("sigma_w", "truth_in_k", "span", "theta_error", "recovered")


@register_figure("sculpt")
def figure(ds, rows: Sequence[str] = FIGURE_ROWS):
    """The ``rows`` (a subset of :data:`FIGURE_ROWS`, in that order; all by default), a
    column per head count: ``"sigma_w"``, the refined (and crude) ΣW error;
    ``"truth_in_k"``, the truth inside K; ``"span"``, the span angle of each method (at the
    middle β) beside K's tilt; ``"theta_error"``, the pure-mode fit's largest matched Θ
    error; ``"recovered"``, pure-mode recovery and false accepts. Notebook 03 draws the
    convex phases, the span and the pure mode as three figures."""
    unknown = [r for r in rows if r not in FIGURE_ROWS]
    if unknown or not rows:
        raise ValueError(f"rows: expected some of {FIGURE_ROWS}, received {tuple(rows)}")
    rows = [r for r in FIGURE_ROWS if r in rows]
    heads, betas = ds["heads"].values, ds["beta"].values
    n = ds["samples"].values
    fig, grid = plots.panels(len(rows), len(heads))
    axes = dict(zip(rows, grid, strict=True))
    mid = betas[len(betas) // 2]
    cap = plots.config_of(ds).get("max_rows", np.inf)
    shaded = f"K full: median certified rows ≥ {cap}"
    methods = [m for m in cl.SPAN_METHODS if f"span_angle_{m}" in ds]
    tol = ds["success"].attrs.get("tolerance", 1e-3)
    for j, h in enumerate(heads):
        cell = ds.sel(heads=h)
        for i, b in enumerate(betas):
            one = cell.sel(beta=b)
            kw = {"shift": plots.shift(i, len(betas)), **plots.style(i)}
            label = f"β = {b:g}"
            if "sigma_w" in axes:
                plots.band(axes["sigma_w"][j], one["refined_sum_w_error"], "samples", label, **kw)
            if "truth_in_k" in axes:
                plots.rate(axes["truth_in_k"][j], one["truth_in_k"], "samples", label, **kw)
            if "theta_error" in axes:
                plots.band(axes["theta_error"][j], one["theta_error_max"], "samples", label, **kw)
            if "recovered" in axes:
                plots.rate(axes["recovered"][j], one["success"], "samples", label, **kw)
                false = {**kw, "linestyle": ":", "markerfacecolor": "none"}
                plots.rate(axes["recovered"][j], one["false_accept"], "samples", "_", **false)
        one = cell.sel(beta=mid)
        if "sigma_w" in axes:
            ax = axes["sigma_w"][j]
            crude = f"crude M₀ (β = {mid:g})"
            plots.band(ax, one["crude_sum_w_error"], "samples", crude, color="k", linestyle=":")
            ax.set(ylabel="ΣW relative error", yscale="log")
        if "truth_in_k" in axes:
            axes["truth_in_k"][j].set(ylabel="truth inside K (share)", ylim=(-0.05, 1.05))
        if "span" in axes:
            ax = axes["span"][j]
            for i, method in enumerate(methods):
                kw = {"shift": plots.shift(i, len(methods)), **plots.style(i + 3)}
                angle = one[f"span_angle_{method}"]
                plots.band(ax, angle, "samples", f"span: {method}", **kw)
            if "k_tilt" in one:
                plots.band(ax, one["k_tilt"], "samples", "K's tilt at the heads", color="k")
            full = n[one["info_rows_certified"].median("instance").values >= cap]
            if full.size:  # K holds the first max_rows certified rows: it stops growing
                ax.axvspan(full.min(), n.max() * 2, color="0.9", zorder=0, label=shaded)
            ax.axhline(0.1, color="k", linestyle="--", linewidth=0.8)
            ax.set(ylabel=f"span angle, rad (β = {mid:g})", ylim=(0, np.pi / 2 + 0.05))
        if "theta_error" in axes:
            axes["theta_error"][j].axhline(tol, color="k", linestyle="--", linewidth=0.8)
            axes["theta_error"][j].set(ylabel="pure mode: largest Θ_i error", yscale="log")
        if "recovered" in axes:
            ax = axes["recovered"][j]
            ax.set(ylabel="pure mode: recovered (share)", ylim=(-0.05, 1.05))
        grid[0, j].set_title(f"heads m = {h}")
        for ax in grid[:, j]:
            plots.values_axis(ax, n, plots.LABELS["samples"])
    config = plots.config_of(ds)
    said = {
        "sigma_w": "median relative error of the refined ΣW (crude M₀ dotted), band: "
        "interquartile range.",
        "truth_in_k": "share of teachers whose every head satisfies every constraint of K "
        "(Wilson 95% bars).",
        "span": "median largest principal angle from span{Θ_i} to each method's span "
        "estimate, from the same K, band: IQR; black: how far a true head can tilt inside "
        "K in a random direction orthogonal to the span (median over heads and "
        f"{TILT_DIRECTIONS} directions) — K's resolution at the heads, which a span "
        "estimate from K alone cannot be expected to beat; dashed: the 0.1-rad target; "
        "grey: the N where the median teacher certifies at least the max_rows rows K keeps "
        "(the first ones), so that K stops growing with N.",
        "theta_error": "pure mode (the search inside the span by "
        f"{config.get('span_method', '?')}, {config.get('candidates', '?')} candidates × "
        f"20 LM iterations on the first {config.get('search_samples', '?')} samples, W by "
        "least squares, no unrestricted polish): median largest relative error of a "
        "matched Θ_i (band: IQR; dashed: the success tolerance — a fit inside an estimated "
        "span is no closer to Θ than the span is).",
        "recovered": "pure mode: the share of teachers recovered (solid) and of false "
        "accepts (dotted, open markers), Wilson bars.",
    }
    parts = [f"Row {k}: {said[r]}" for k, r in enumerate(rows, start=1)]
    caption = f"{plots.instances(ds)} teachers per point. " + " ".join(parts)
    title = "Certify-and-sculpt (a reconstruction), phase by phase: " + plots.settings(
        ds, ("dim", "tokens", "max_rows")
    )
    return plots.finish(fig, title, caption)
