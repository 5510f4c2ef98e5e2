"""The phase study's figures (:class:`~mhalearn.experiments.phase.Phase`): functions of its
results Dataset, apart from the study, which computes without plotting."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from mhalearn import plots, stats
from mhalearn.experiments.figures import register_figure
from mhalearn.experiments.phase import Phase
from mhalearn.experiments.recovery import (
    describe_learner,
)


@register_figure("phase")
def figure(ds):
    """Top row: the share of teachers recovered at the largest budget vs N/N_c with Wilson
    95% bars, a panel per head count (or per dim when the study has one head count and
    several dims), a curve per learner × β, N*₅₀/N_c marked with its interval, and the
    share identified (dotted, grey). Below, heatmaps of the shares recovered, failed to
    optimise and non-identified over (N/N_c, heads or dim) at the largest budget, a row per
    learner × β (the first inputs, and the first dim or head count), with a colour bar;
    then N*₅₀/N_c vs budget, a panel per learner, a curve per head count (in a colour
    scale of their own), the statistical threshold as a band of its colour, when there are
    several budgets; at the bottom, N*₅₀/N_c vs heads
    per inputs with its power-law and exponential fits when there are several head counts,
    and vs dim when there are several dims."""
    config = plots.config_of(ds)
    along = "dim" if ds.sizes["heads"] == 1 and ds.sizes["dim"] > 1 else "heads"
    across = "heads" if along == "dim" else "dim"
    top = ds.isel(budget=-1)
    one = top.isel({"inputs": 0, across: 0})
    rows = list(itertools.product(one["learner"].values, one["beta"].values))
    by_heads = ds.sizes["heads"] > 1
    below = by_heads * ds.sizes["inputs"] + (ds.sizes["dim"] > 1)
    ladder = ds.sizes["budget"] > 1
    cols = max(3, below, one.sizes[along], ladder * ds.sizes["learner"])
    fig, axes = plots.panels(1 + len(rows) + ladder + (below > 0), cols, width=4.0, height=2.8)
    _curves(axes[0], one, rows, along)
    for ax in axes[0, one.sizes[along] :]:
        ax.remove()
    for i, (learner, beta) in enumerate(rows, start=1):
        mesh = _heatmaps(
            axes[i], one.sel(learner=learner, beta=beta), f"{learner}, β = {beta:g}", along
        )
        fig.colorbar(mesh, ax=axes[i, 2], label="share of teachers", pad=0.02)
        for ax in axes[i, 3:]:
            ax.remove()
    if ladder:
        row = axes[1 + len(rows)]
        for ax, learner in zip(row, ds["learner"].values, strict=False):
            _thresholds_vs_budget(ax, ds.sel(learner=learner).isel(inputs=0, dim=0, beta=0))
        for ax in row[ds.sizes["learner"] :]:
            ax.remove()
    if below:
        last = axes[1 + len(rows) + ladder]
        if by_heads:
            for j, inputs in enumerate(ds["inputs"].values):
                _thresholds_vs_heads(last[j], top.sel(inputs=inputs).isel(dim=0))
        if ds.sizes["dim"] > 1:
            _thresholds_vs_dim(last[below - 1], top.isel(inputs=0))
        for ax in last[below:]:
            ax.remove()
    n = plots.instances(ds)
    half = stats.wilson(np.array([n // 2]), np.array([n]))
    widest = np.max(half.upper - half.lower)
    study = Phase.from_config(config)
    budget = study.budget
    learners = "; ".join(
        describe_learner(str(v), study.learner_config(str(v)), study.starts(str(v)))
        for v in ds["learner"].values
    )
    caption = (
        f"Top row and heatmaps, at the largest budget ({budget[-1]:g}× each learner's "
        f"default starts): share (in %) of the {n} teachers per cell recovered "
        "(every matched Θ_i "
        f"and W_i within relative error {config.get('success_tol', '?')}), failed with a "
        f"training loss above the teacher's by more than {config.get('fit_tol', '?')}·mean(Y²) "
        "(optimisation failure), or failed with the training data fitted (non-identified); "
        "grey dotted: share of teachers identified (no fit of any learner at the largest "
        "budget explains the training data away from the teacher); "
        "bars on the top row: Wilson 95% intervals (the widest at "
        f"{n} teachers is ±{widest / 2:.2f}). "
        "N_c = 2·heads·dim/tokens. Red triangles, horizontal bars at one half on the top "
        "row and "
        "the lower rows: N*50/N_c, where the logistic "
        "fit (in log N) of the success share crosses one half, with 95% bootstrap intervals "
        "over teachers (at least the two grid points around a jump from 0 to 1); "
        "N*50/N_c vs budget: a curve per head count m, the band of its colour the "
        "statistical threshold's 95% interval. Thin lines: "
        "least-squares fits of log(N*50/N_c) on log m (dashed: power law, rate k) and on m "
        "(dotted: exponential, rate s), 95% bootstrap intervals on the rates in the legend; "
        "'better': the smaller residual sum of squares (both have two parameters), with the "
        "share of bootstrap replicates agreeing ('undecided' below 0.95). A curve "
        "that never crosses one half inside the grid is not drawn. "
        f"Learners: {learners.rstrip('.')}."
    )
    if study.ladder is not None and len(budget) > 1:
        low, high = study.ladder
        caption += (
            f" The budgets above the first ran only at N/N_c in [{low:g}, {high:g}]; "
            "elsewhere every budget shows the first budget's fits."
        )
    title = (
        f"Phase diagram of teacher recovery (heatmaps: inputs {one['inputs'].item()}, "
        f"{across} {one[across].item()}): "
        + plots.settings(ds, ("family", "tokens", "label_noise"))
    )
    return plots.finish(fig, title, caption)


def _thresholds_vs_budget(ax, one) -> None:
    """N*₅₀/N_c vs budget for one learner, a curve per head count, the statistical
    threshold's interval as a band of the same colour."""
    import matplotlib

    budget = np.asarray(one["budget"].values, float)
    # the head counts in a colour scale of their own, apart from the learners' colours
    scale = matplotlib.colormaps["plasma"]
    count = one.sizes["heads"]
    for i, m in enumerate(one["heads"].values):
        color = scale(0.85 * i / max(count - 1, 1))
        c = one.sel(heads=m)
        t = c["threshold_ratio"].values
        if not np.isfinite(t).any():
            continue  # not crossed inside the grid at any budget
        lo, hi = c["threshold_ratio_lower"].values, c["threshold_ratio_upper"].values
        at = budget * plots.shift(i, count, 0.03)
        style = {**plots.style(i), "color": color}
        ax.errorbar(at, t, yerr=[t - lo, hi - t], capsize=3, label=f"m = {m}", **style)
        s_lo = float(c["threshold_statistical_ratio_lower"])
        s_hi = float(c["threshold_statistical_ratio_upper"])
        if np.isfinite(s_lo) and np.isfinite(s_hi):
            ax.axhspan(s_lo, s_hi, color=color, alpha=0.2, lw=0, label="_statistical")
    plots.values_axis(ax, budget, "budget (× default starts)")
    ax.set(ylabel="N*50 / N_c")
    plots.ratio_axis(ax)
    ax.set_title(f"{one['learner'].item()}: N*50/N_c vs budget", fontsize=10)


def _heatmaps(axes, cell, name: str, along: str = "heads"):
    """The three shares of one learner × β over (N/N_c, ``along``: heads or dim), the
    threshold on the first; returns the last mesh (for the colour bar)."""
    ratios, rows = np.asarray(cell["ratio"].values, float), cell[along].values
    kinds = ("success", "failure_optimisation", "failure_identification")
    titles = ("recovered", "optimisation failure", "non-identified (data fitted)")
    for ax, kind, title in zip(axes, kinds, titles, strict=False):
        share = cell[kind].mean("instance").transpose(along, "ratio").values
        mesh = plots.heatmap(ax, share, ratios, rows, vmin=0, vmax=1, cmap="viridis")
        for (r, c), v in np.ndenumerate(share):
            if np.isfinite(v):
                color = "k" if v > 0.6 else "w"
                ax.text(
                    ratios[c],
                    r,
                    f"{100 * v:.0f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color=color,
                )
        ax.set_xticks(ratios, [f"{v:g}" for v in ratios], fontsize=6, rotation=90)
        ax.minorticks_off()
        label = "heads m" if along == "heads" else "token dimension d"
        ax.set(xlabel="N / N_c", ylabel=f"{name}\n{label}", title=title)
    t = cell["threshold_ratio"].values
    lo, hi = cell["threshold_ratio_lower"].values, cell["threshold_ratio_upper"].values
    ok = np.isfinite(t)
    if ok.any():
        axes[0].errorbar(
            t[ok],
            np.arange(len(rows))[ok] + 0.3,
            xerr=[(t - lo)[ok], (hi - t)[ok]],
            fmt="v",
            color="r",
            ms=5,
            capsize=2,
            label="N*50/N_c with its 95% bootstrap interval",
        )
    return mesh


def _curves(axes, one, rows, along: str) -> None:
    """The share recovered vs N/N_c with Wilson bars, a panel per value of ``along`` and a
    curve per (learner, β) of ``rows``; N*₅₀/N_c at one half with its interval."""
    ratios = np.asarray(one["ratio"].values, float)
    for ax, value in zip(axes, one[along].values, strict=False):
        for i, (learner, beta) in enumerate(rows):
            c = one.sel({"learner": learner, "beta": beta, along: value})
            at = plots.shift(i, len(rows))
            plots.rate(ax, c["success"], "ratio", f"{learner}, β = {beta:g}", at, **plots.style(i))
            t = float(c["threshold_ratio"])
            if np.isfinite(t):
                lo, hi = float(c["threshold_ratio_lower"]), float(c["threshold_ratio_upper"])
                ax.errorbar(
                    t, 0.5, xerr=[[t - lo], [hi - t]], fmt="|", ms=12, color=f"C{i}", capsize=4
                )
            if learner == rows[0][0]:
                known = c["identified"]
                plots.rate(
                    ax, known, "ratio", f"identified, β = {beta:g}", color="0.5", ls=":", marker="."
                )
        plots.values_axis(ax, ratios, "N / N_c")
        ax.set(ylim=(-0.03, 1.03), ylabel="share recovered")
        ax.set_title(f"recovered vs N/N_c: {'heads m' if along == 'heads' else 'dim d'} {value}")


def _thresholds_vs_heads(ax, one) -> None:
    """N*₅₀/N_c vs heads, a curve per learner × β, with each curve's two growth fits."""
    m = one["heads"].values.astype(float)
    curves = list(itertools.product(one["learner"].values, one["beta"].values))
    for i, (learner, beta) in enumerate(curves):
        c = one.sel(learner=learner, beta=beta)
        t = c["threshold_ratio"].values
        if not np.isfinite(t).any():
            continue  # no threshold inside the grid at any head count
        lo, hi = c["threshold_ratio_lower"].values, c["threshold_ratio_upper"].values
        label = f"{learner}, β = {beta:g}" + _growth_label(c, "growth")
        _growth_lines(ax, m, t, plots.style(i)["color"])
        at = m + 0.04 * (i - (len(curves) - 1) / 2)
        ax.errorbar(at, t, yerr=[t - lo, hi - t], capsize=3, label=label, **plots.style(i))
    ax.set_xticks(m, [f"{v:g}" for v in m])
    ax.set(xlabel="heads m", ylabel="N*50 / N_c", xlim=(m.min() - 0.4, m.max() + 0.4))
    plots.ratio_axis(ax)
    ax.set_title(f"thresholds vs heads: inputs {one['inputs'].item()}, dim {one['dim'].item()}")


def _thresholds_vs_dim(ax, one) -> None:
    """N*₅₀/N_c vs dim, a curve per learner × β × heads."""
    d = one["dim"].values.astype(float)
    curves = list(itertools.product(*(one[k].values for k in ("learner", "beta", "heads"))))
    for i, (learner, beta, h) in enumerate(curves):
        c = one.sel(learner=learner, beta=beta, heads=h)
        t = c["threshold_ratio"].values
        if not np.isfinite(t).any():
            continue
        lo, hi = c["threshold_ratio_lower"].values, c["threshold_ratio_upper"].values
        ax.errorbar(
            d * plots.shift(i, len(curves), 0.02),
            t,
            yerr=[t - lo, hi - t],
            capsize=3,
            label=f"{learner}, β = {beta:g}, m = {h}",
            **plots.style(i),
        )
    ax.set(ylabel="N*50 / N_c")
    plots.values_axis(ax, d, "token dimension d")
    plots.ratio_axis(ax)
    ax.set_title(f"thresholds vs dim: inputs {one['inputs'].item()}")


def heads_figure(runs: dict[str, Any], learner: str = "varpro"):
    """The thresholds against the heads m, a column per run (a teacher family): on top the
    statistical N*₅₀/N_c (black) with its power-law and exponential fits, and ``learner``'s
    N*₅₀/N_c at each budget (a colour per budget, filled where the two largest budgets agree);
    below, ``learner``'s wall seconds per teacher at each budget (mean over the N of the
    grid). ``runs``: derived Phase Datasets by name (their first inputs, dim and β)."""
    import matplotlib

    fig, axes = plots.panels(2, len(runs), width=4.0, height=3.2)
    scale = matplotlib.colormaps["plasma"]
    for j, (name, ds) in enumerate(runs.items()):
        one = ds.isel(inputs=0, dim=0, beta=0)
        m = one["heads"].values.astype(float)
        top, cost = axes[0, j], axes[1, j]
        stat = one["threshold_statistical_ratio"].values
        lo = one["threshold_statistical_ratio_lower"].values
        hi = one["threshold_statistical_ratio_upper"].values
        label = f"{name}: statistical" + _growth_label(one, "growth_statistical")
        top.errorbar(
            m, stat, yerr=[stat - lo, hi - stat], fmt="s-", color="k", capsize=3, label=label
        )
        _growth_lines(top, m, stat, "k")
        c = one.sel(learner=learner)
        budgets = c["budget"].values
        for b_i, b in enumerate(budgets):
            color = scale(0.85 * b_i / max(len(budgets) - 1, 1))
            t = c["threshold_ratio"].sel(budget=b).values
            t_lo = c["threshold_ratio_lower"].sel(budget=b).values
            t_hi = c["threshold_ratio_upper"].sel(budget=b).values
            at = m + 0.06 * (b_i + 1)
            label = f"{learner}, budget {b:g}"
            if b_i == len(budgets) - 1:  # each panel's own growth fit: named by its panel
                label = f"{name}: {label}" + _growth_label(c, "growth")
            top.errorbar(
                at,
                t,
                yerr=[t - t_lo, t_hi - t],
                fmt="o-",
                color=color,
                capsize=3,
                mfc="none",
                label=label,
            )
            if b_i == len(budgets) - 1 and "budget_converged" in c:
                done = c["budget_converged"].values == 1
                top.plot(at[done], t[done], "o", color=color, label="converged (filled)")
                _growth_lines(top, m, t, color)
            seconds = c["fit_seconds"].sel(budget=b).mean("ratio").values
            cost.plot(m, seconds, "o-", color=color, label="_same colours as above")
        top.axhline(1.0, color="0.5", lw=0.8, ls="--", label="N_c (counting limit)")
        top.set(xlabel="heads m", ylabel="N*50 / N_c", title=name)
        plots.ratio_axis(top)
        cost.set(yscale="log", xlabel="heads m", ylabel=f"{learner}: wall s per teacher")
        for ax in (top, cost):
            ax.set_xticks(m, [f"{v:g}" for v in m])
    ds = next(iter(runs.values()))
    n = plots.instances(ds)
    caption = (
        f"{n} teachers per point. Top: N*50/N_c where the share identified (black squares: no "
        "fit of any learner at the largest budget explains the training data away from the "
        f"teacher) or the share {learner} recovers (circles, a colour per budget: multiples of "
        "its default random starts) crosses one half, by a logistic fit in log N, with 95% "
        "bootstrap intervals over teachers; filled: the largest budget's threshold where it "
        "agrees with the next largest (their intervals overlap). Thin lines: least-squares "
        "fits of log(N*50/N_c) on log m (dashed, power law, rate k) and on m (dotted, "
        "exponential, rate s); in the legend, the rates with 95% bootstrap intervals and the "
        "better fit with the share of replicates agreeing ('undecided' below 0.95). Grey "
        "dashed: N_c = 2·m·d/k. Bottom: wall seconds per teacher of the fits up to each budget "
        "(mean over the N of the grid; 2-core CPU, float64)."
    )
    title = "Statistical and computational thresholds vs heads: " + plots.settings(
        ds, ("dim", "tokens", "beta")
    )
    return plots.finish(fig, title, caption)


def _growth_label(one, prefix: str) -> str:
    """The legend's growth rates of one curve: k and s with their intervals, the better fit."""
    k = float(one[f"{prefix}_power"])
    if not np.isfinite(k):
        return ""
    g = {n: float(one[f"{prefix}_{n}"]) for n in ("power_lower", "power_upper", "exponential")}
    g |= {n: float(one[f"{prefix}_{n}"]) for n in ("exponential_lower", "exponential_upper")}
    share = float(one[f"{prefix}_better_share"])
    better = "exponential" if float(one[f"{prefix}_exponential_better"]) == 1 else "power"
    verdict = f"{better} ({share:.2f})" if share >= 0.95 else f"undecided ({better} {share:.2f})"
    return (
        f"\nk = {k:.2f} [{g['power_lower']:.2f}, {g['power_upper']:.2f}], s = "
        f"{g['exponential']:.2f} [{g['exponential_lower']:.2f}, {g['exponential_upper']:.2f}]"
        f", better: {verdict}"
    )


def _growth_lines(ax, m: np.ndarray, r: np.ndarray, color) -> None:
    """The power-law (dashed) and exponential (dotted) least-squares fits of log r."""
    ok = np.isfinite(r)
    if ok.sum() < 3:
        return
    grid = np.linspace(m.min(), m.max(), 50)
    power = np.polyfit(np.log(m[ok]), np.log(r[ok]), 1)
    expo = np.polyfit(m[ok], np.log(r[ok]), 1)
    ax.plot(grid, np.exp(np.polyval(power, np.log(grid))), "--", color=color, lw=0.8)
    ax.plot(grid, np.exp(np.polyval(expo, grid)), ":", color=color, lw=0.8)
