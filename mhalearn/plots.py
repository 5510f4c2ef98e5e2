"""Figures from result Datasets: one function per study, each returning a Figure that a reader
understands without the code.

Every figure says what it draws: a caption under the panels (median of how many instances,
what the band or the bars are), the fixed settings in its title, axis labels from the
variables' ``long_name`` (:mod:`mhalearn.variables`), one legend for the whole figure, a marker
and a line style per curve (and a slight shift along a log x axis, so that coinciding curves
stay visible), and the values themselves as tick labels on sample and head axes. Curves are
medians across instances with the interquartile range as a band; rates (success, separable)
are shares with Wilson 95% intervals as bars. :func:`plot` picks the figure from the Dataset's
``study`` attribute. Matplotlib is imported lazily (use the Agg backend headless).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

LABELS = {
    "samples": "training samples N",
    "heads": "heads (m, H)",
    "beta": "β (teacher attention scale ‖Θ_i‖_F)",
    "step": "step",
    "lr": "step size η",
}

#: (marker, line style) of the i-th curve of a panel
STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--"), ("X", "-.")]


def style(i: int, linestyle: str | None = None, hollow: bool = False) -> dict[str, Any]:
    """The i-th curve's colour, marker and line style (``linestyle`` to impose one, e.g. solid
    for training and dashed for test curves; ``hollow``: open markers)."""
    marker, line = STYLES[i % len(STYLES)]
    out = {"color": f"C{i}", "marker": marker, "linestyle": linestyle or line}
    return {**out, "markerfacecolor": "none"} if hollow else out


def shift(i: int, n: int, spread: float = 0.04) -> float:
    """The factor by which the i-th of n curves is moved along a log x axis (1 for one)."""
    return float(np.exp(spread * (i - (n - 1) / 2)))


def _figure(rows: int, cols: int, width: float = 4.2, height: float = 3.4):
    import matplotlib.pyplot as plt

    size = (max(width * cols, 7.5), height * rows)  # room for the title, legend and caption
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    return fig, axes


@contextlib.contextmanager
def _quiet():
    """Silence the all-NaN warnings of medians over missing instances."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def band(ax, da, x: str, label: str | None = None, shift: float = 1.0, **kw: Any) -> None:
    """Median over ``instance`` of ``da`` (a DataArray with dims ``x`` and ``instance``) vs
    ``x`` (times ``shift``), with the interquartile band."""
    values = np.asarray(da.transpose(x, "instance").values, dtype=float)
    xs = np.asarray(da[x].values, dtype=float) * shift
    with _quiet():
        mid = np.nanmedian(values, axis=1)
        lo, hi = np.nanpercentile(values, [25, 75], axis=1)
    kw.setdefault("marker", "o" if len(xs) < 30 else None)
    (line,) = ax.plot(xs, mid, label=label, **kw)
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


def wilson(successes: np.ndarray, trials: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Wilson 95% intervals (lower, upper) of success shares (NaN where there is no trial)."""
    from scipy import stats

    lower = np.full(np.shape(trials), np.nan)
    upper = np.full(np.shape(trials), np.nan)
    for idx in np.ndindex(np.shape(trials)):
        if trials[idx] > 0:
            ci = stats.binomtest(int(successes[idx]), int(trials[idx])).proportion_ci(
                confidence_level=0.95, method="wilson"
            )
            lower[idx], upper[idx] = ci.low, ci.high
    return lower, upper


def rate(ax, da, x: str, label: str | None = None, shift: float = 1.0, **kw: Any) -> None:
    """The share of instances where the 0/1 ``da`` is 1, vs ``x`` (times ``shift``), with
    Wilson 95% intervals as bars (missing instances are not counted)."""
    values = np.asarray(da.transpose(x, "instance").values, dtype=float)
    trials = np.sum(np.isfinite(values), axis=1)
    hits = np.nansum(values, axis=1)
    with _quiet():
        share = hits / trials
    lo, hi = wilson(hits, trials)
    xs = np.asarray(da[x].values, dtype=float) * shift
    kw.setdefault("marker", "o")
    ax.errorbar(xs, share, yerr=[share - lo, hi - share], label=label, capsize=3, **kw)


def _median(da) -> np.ndarray:
    """Median over ``instance`` (NaN-aware), as an array over the other dims."""
    with _quiet():
        return np.nanmedian(da.transpose(..., "instance").values, axis=-1)


def _label(ds, name: str) -> str:
    return ds[name].attrs.get("long_name", name.replace("_", " "))


def values_axis(ax, values: Sequence[float], label: str) -> None:
    """A log x axis whose ticks are the grid's own values, written out (10, 40, 100, ...)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = [float(v) for v in values]
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in values])
    pad = 1.15
    ax.set_xlim(min(values) / pad, max(values) * pad)
    ax.set_xlabel(label)


def _config(ds) -> dict[str, Any]:
    try:
        return json.loads(ds.attrs.get("config", "{}"))
    except ValueError:
        return {}


def _settings(ds, names: Sequence[str]) -> str:
    """``name value`` for each fixed setting of the study that wrote ``ds``."""
    config = _config(ds)
    shown = []
    for name in names:
        if name in config:
            value = config[name]
            if isinstance(value, list):
                value = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
            elif isinstance(value, float):
                value = f"{value:g}"
            shown.append(f"{name} {value}")
    return ", ".join(shown)


def finish(fig, title: str, caption: str):
    """Title (with the fixed settings), one legend for the figure and the caption below the
    panels; the figure grows to make room for them, so the panels keep their size."""
    import textwrap

    handles, labels = {}, []
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    width, height = fig.get_figwidth(), fig.get_figheight()
    chars = max(60, int(width * 14))
    caption = "\n".join(textwrap.wrap(caption, chars))
    title = "\n".join(textwrap.wrap(title, int(width * 11)))
    legend_rows = 0
    if labels:
        longest = max(len(label) for label in labels) + 6
        ncol = max(1, min(len(labels), int(width * 13 // longest)))
        legend_rows = -(-len(labels) // ncol)
    legend = 0.24 * legend_rows + (0.1 if labels else 0.0)  # inches, from the bottom up
    text = 0.18 * (caption.count("\n") + 1)
    top = 0.22 * (title.count("\n") + 1) + 0.04
    total = height + legend + text + top
    fig.set_figheight(total)
    if labels:
        fig.legend(
            [handles[label] for label in labels],
            labels,
            loc="lower center",
            ncol=ncol,
            fontsize="small",
            frameon=False,
            bbox_to_anchor=(0.5, 0.02 / total),
        )
    fig.text(0.5, (legend + text + 0.1) / total, caption, ha="center", va="top", fontsize="small")
    fig.suptitle(title, fontsize="medium", y=1 - 0.05 / total, va="top")
    fig.tight_layout(rect=(0, (legend + text + 0.15) / total, 1, 1 - top / total))
    return fig


def _instances(ds) -> int:
    return int(ds.sizes["instance"])


def recovery(ds):
    """Success rate (Wilson 95% bars) and median squared normalised prediction error (IQR
    band) vs samples, a curve per learner, a column per head count."""
    from mhalearn.experiments.recovery import learner_label

    config = _config(ds)
    heads, learners = ds["heads"].values, ds["learner"].values
    fig, axes = _figure(2, len(heads))
    n = ds["samples"].values
    for j, h in enumerate(heads):
        cell = ds.sel(heads=h)
        for i, learner in enumerate(learners):
            one = cell.sel(learner=learner)
            label = learner_label(str(learner), config)
            kw = {"label": label, "shift": shift(i, len(learners)), **style(i)}
            rate(axes[0, j], one["success"], "samples", **kw)
            band(axes[1, j], one["prediction_error"], "samples", **kw)
        axes[0, j].set(title=f"heads m = {h}", ylabel="share of teachers recovered")
        axes[0, j].set_ylim(-0.05, 1.05)
        axes[1, j].set(ylabel=_label(ds, "prediction_error"))
        axes[1, j].set_yscale("log")
        for ax in axes[:, j]:
            values_axis(ax, n, LABELS["samples"])
    tol = ds["success"].attrs.get("tolerance", config.get("success_tol", "?"))
    caption = (
        f"Top: share of the {_instances(ds)} teachers per point recovered (every matched Θ_i "
        f"and W_i within relative Frobenius error {tol:g}), bars: Wilson 95% interval. Bottom: "
        f"median over the {_instances(ds)} teachers of Σ‖F̂(X) − F(X)‖²_F / Σ‖F(X)‖²_F on fresh "
        "inputs, band: interquartile range. Every learner sees the same teachers and samples; "
        "curves are shifted slightly along N so that coinciding ones stay visible."
    )
    title = "Recovering Chen–Li teachers: " + _settings(ds, ("dim", "tokens", "beta", "family"))
    return finish(fig, title, caption)


def regimes(ds):
    """Share of rows on which every head agrees (log scale) and mean max attention vs β,
    a curve per head count, a column per input distribution (first tokens value)."""
    inputs = ds["inputs"].values
    heads = ds["heads"].values
    fig, axes = _figure(2, len(inputs))
    tokens = int(ds["tokens"].values[0])
    for j, dist in enumerate(inputs):
        cell = ds.sel(inputs=dist).isel(tokens=0)
        for i, h in enumerate(heads):
            kw = {"label": f"heads m = {h}", "shift": shift(i, len(heads)), **style(i)}
            band(axes[0, j], cell["agreement"].sel(heads=h), "beta", **kw)
            band(axes[1, j], cell["mean_max_attention"].sel(heads=h), "beta", **kw)
        axes[0, j].set(title=f"{dist} tokens", ylabel=_label(ds, "agreement"))
        axes[0, j].set_yscale("log")
        axes[1, j].set(ylabel=_label(ds, "mean_max_attention"))
        for ax in axes[:, j]:
            values_axis(ax, ds["beta"].values, LABELS["beta"])
    config = _config(ds)
    caption = (
        f"Median over {_instances(ds)} random teachers per point, band: interquartile range; "
        f"statistics on {config.get('samples', '?')} fresh sequences per teacher. A row agrees "
        f"when every head puts at least 1 − δ = {1 - config.get('delta', float('nan')):g} of "
        "its attention on one token value (rows where none agree are 0 and not drawn on the "
        "log axis)."
    )
    title = f"Attention regimes of random teachers: tokens {tokens}, " + _settings(
        ds, ("dim", "family")
    )
    return finish(fig, title, caption)


def _classifier_settings(ds) -> str:
    return _settings(ds, ("tokens", "dim", "relevant_fraction", "irrelevant_means", "head_scaling"))


def heads(ds):
    """Training loss (solid) and test loss (dashed) vs step, a curve per head count, a
    column per step size, a row per noise level; log–log."""
    lrs, noises, hs = ds["lr"].values, ds["noise"].values, ds["heads"].values
    fig, axes = _figure(len(noises), len(lrs))
    steps = ds["step"].values
    shown = np.flatnonzero(steps > 0)
    for r, noise in enumerate(noises):
        for j, lr in enumerate(lrs):
            ax = axes[r, j]
            cell = ds.sel(noise=noise, lr=lr).isel(step=shown)
            for i, h in enumerate(hs):
                one = cell.sel(heads=h)
                band(ax, one["trace_loss"], "step", label=f"H = {h}, train", **style(i, "-"))
                test = style(i, "--", hollow=True)
                band(ax, one["trace_test_loss"], "step", label=f"H = {h}, test", **test)
            ax.set(
                title=f"η = {lr:g}, noise σ = {noise:g}",
                xlabel=LABELS["step"],
                ylabel="logistic loss",
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
    caption = (
        f"Median over {_instances(ds)} random training sets and starts per point, band: "
        "interquartile range; solid: training loss, dashed (open markers): test loss on a "
        "held-out draw of the mixture. Full-batch GD, the same problems for every H and η."
    )
    config = _config(ds)
    title = (
        f"Classifier training with H heads: samples {config.get('samples', '?')}, steps "
        f"{config.get('steps', '?')}, " + _classifier_settings(ds)
    )
    return finish(fig, title, caption)


def _guide(ax, x: np.ndarray, y0: float, power: float, label: str) -> None:
    """A dotted c·x^power line through (x[0], y0)."""
    x = np.asarray(x, dtype=float)
    ax.plot(x, y0 * (x / x[0]) ** power, "k:", label=label)


def stepsize(ds):
    """Largest stable step size vs heads; ‖∇²L̂(θ₀)‖ and the weak-convexity ratio vs heads,
    with a 1/√H guide; log–log."""
    fig, axes = _figure(1, 3)
    h = ds["heads"].values
    band(axes[0, 0], ds["largest_stable_lr"], "heads", label="largest stable η (grid)", **style(0))
    norm = _median(ds["hessian_norm"])
    axes[0, 0].plot(h, 2 / norm, label="2 / median ‖∇²L̂(θ₀)‖", **style(1))
    axes[0, 0].set(ylabel=LABELS["lr"])
    band(axes[0, 1], ds["hessian_norm"], "heads", label="‖∇²L̂(θ₀)‖ (loss)", **style(2))
    band(
        axes[0, 1],
        ds["score_hessian_norm"],
        "heads",
        label="‖∇²Φ(X; θ₀)‖ (score)",
        **style(3),
    )
    _guide(axes[0, 1], h, float(_median(ds["score_hessian_norm"])[0]), -0.5, "∝ 1/√H")
    axes[0, 1].set(ylabel="Hessian spectral norm at θ₀")
    band(
        axes[0, 2],
        ds["weak_convexity"],
        "heads",
        label="−λ_min(∇²L̂)/L̂ at θ₀",
        **style(4),
    )
    _guide(axes[0, 2], h, float(np.abs(_median(ds["weak_convexity"])[0])), -0.5, "∝ 1/√H")
    axes[0, 2].set(ylabel=_label(ds, "weak_convexity"))
    for ax in axes[0]:
        values_axis(ax, h, LABELS["heads"])
        ax.set_yscale("log")
    config = _config(ds)
    lrs = config.get("lr", [])
    caption = (
        f"Median over {_instances(ds)} random problems per head count, band: interquartile "
        f"range. A step size is stable when {config.get('steps', '?')} full-batch GD steps "
        "never raise the training loss (by more than rise_tol, relative) and stay finite; the "
        f"grid is {len(lrs)} values from {min(lrs, default=float('nan')):g} to "
        f"{max(lrs, default=float('nan')):g}. Norms by {config.get('power_iterations', '?')} "
        "power iterations on Hessian-vector products; the score's norm is averaged over "
        f"{config.get('score_samples', '?')} training sequences."
    )
    title = (
        f"Curvature and step size vs heads: samples {config.get('samples', '?')}, "
        + _classifier_settings(ds)
    )
    return finish(fig, title, caption)


def samples(ds):
    """Test loss vs samples (log–log, with an n^(−1) guide), and the generalisation gap
    beside the stability proxy, a curve per head count."""
    fig, axes = _figure(1, 2)
    n = ds["samples"].values
    hs = ds["heads"].values
    for i, h in enumerate(hs):
        one = ds.sel(heads=h)
        at = shift(i, len(hs))
        band(axes[0, 0], one["test_loss"], "samples", f"H = {h}", at, **style(i, "-"))
        band(axes[0, 1], one["gap"], "samples", f"H = {h}", at, **style(i, "-"))
        proxy = f"H = {h}, stability proxy (right, dashed)"
        band(axes[0, 1], one["stability_proxy"], "samples", proxy, at, **style(i, "--", True))
    first = float(np.nanmedian(_median(ds["test_loss"].isel(samples=0))))
    _guide(axes[0, 0], n, first, -1.0, "∝ 1/n")
    axes[0, 0].set(ylabel=_label(ds, "test_loss"))
    axes[0, 1].set(ylabel="gap (solid) and stability proxy (dashed)")
    for ax in axes[0]:
        values_axis(ax, n, "training samples n")
        ax.set_yscale("log")
    config = _config(ds)
    caption = (
        f"Median over {_instances(ds)} random training sets and starts per point, band: "
        f"interquartile range. Full-batch GD, η = {config.get('lr', '?')}, "
        f"{config.get('steps', '?')} steps; gap = test loss − training loss (points where it "
        "is negative are not drawn on the log axis)."
    )
    return finish(fig, "Generalisation vs samples: " + _classifier_settings(ds), caption)


def margin(ds):
    """NTK margin at initialisation vs heads, a curve per initialisation (log x), and the
    share of NTK-separable training sets with Wilson 95% bars."""
    fig, axes = _figure(1, 2)
    inits, h = ds["init"].values, ds["heads"].values
    for i, init in enumerate(inits):
        kw = {"label": str(init), "shift": shift(i, len(inits)), **style(i)}
        band(axes[0, 0], ds["margin"].sel(init=init), "heads", **kw)
        rate(axes[0, 1], ds["separable"].sel(init=init), "heads", **kw)
    axes[0, 0].set(ylabel="NTK margin γ at θ₀ (0: not separable)")
    axes[0, 1].set(ylabel="share of NTK-separable training sets")
    axes[0, 1].set_ylim(-0.05, 1.05)
    for ax in axes[0]:
        values_axis(ax, h, LABELS["heads"])
    config = _config(ds)
    caption = (
        f"Left: median over {_instances(ds)} random training sets of n = "
        f"{config.get('samples', '?')} per point, band: interquartile range. Right: share "
        "separable, bars: Wilson 95% interval. Inits: zero (W = 0), gaussian (W Gaussian), "
        f"one_step (one GD step of size {config.get('one_step_lr', '?')} from W = 0)."
    )
    return finish(fig, "NTK margin at initialisation: " + _classifier_settings(ds), caption)


FIGURES: dict[str, Callable[[Any], Any]] = {
    "recovery": recovery,
    "regimes": regimes,
    "heads": heads,
    "stepsize": stepsize,
    "samples": samples,
    "margin": margin,
}


def plot(ds):
    """The figure of the study that produced ``ds``."""
    study = ds.attrs.get("study")
    if study not in FIGURES:
        raise ValueError(
            f"the results carry no known study (attribute study={study!r}); "
            f"expected one of {sorted(FIGURES)}"
        )
    return FIGURES[study](ds)


def save(fig, path) -> None:
    """Write ``fig`` as a PNG and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
