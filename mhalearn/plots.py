"""Figures from result Datasets: one function per figure type, each returning a Figure.

Curves are the median across instances with the interquartile range as a band; axes are
logarithmic where the theory speaks in rates. :func:`plot` picks the figure from the
Dataset's ``study`` attribute. Matplotlib is imported lazily (use the Agg backend headless).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

LABELS = {
    "samples": "samples (training examples N)",
    "heads": "heads (m, H)",
    "beta": "β (teacher attention scale ‖Θ_i‖_F)",
    "step": "step",
    "lr": "step size η",
}


def _figure(rows: int, cols: int, width: float = 4.2, height: float = 3.4):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    return fig, axes


def band(ax, da, x: str, label: str | None = None, **style: Any) -> None:
    """Median over ``instance`` of ``da`` (a DataArray with dims ``x`` and ``instance``) vs
    ``x``, with the interquartile band."""
    values = np.asarray(da.transpose(x, "instance").values, dtype=float)
    xs = np.asarray(da[x].values)
    with _quiet():
        mid = np.nanmedian(values, axis=1)
        lo, hi = np.nanpercentile(values, [25, 75], axis=1)
    (line,) = ax.plot(xs, mid, marker="o" if len(xs) < 30 else None, label=label, **style)
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


@contextlib.contextmanager
def _quiet():
    """Silence the all-NaN warnings of medians over missing instances."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _median(da) -> np.ndarray:
    """Median over ``instance`` (NaN-aware), as an array over the other dims."""
    with _quiet():
        return np.nanmedian(da.transpose(..., "instance").values, axis=-1)


def _loglog(axes) -> None:
    for ax in axes:
        ax.set_xscale("log")
        _positive(ax)
        ax.legend(fontsize="small")


def _finish(fig, title: str):
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _positive(ax, which: str = "y") -> None:
    """Log scale on an axis (symlog-free: non-positive values are simply not drawn)."""
    getattr(ax, f"set_{which}scale")("log")


def recovery(ds):
    """Success rate and median normalised prediction error vs samples, a curve per learner,
    a column per head count."""
    heads = ds["heads"].values
    fig, axes = _figure(2, len(heads))
    for j, h in enumerate(heads):
        cell = ds.sel(heads=h)
        for learner in ds["learner"].values:
            one = cell.sel(learner=learner)
            rate = one["success"].mean("instance")
            axes[0, j].plot(ds["samples"].values, rate.values, marker="o", label=str(learner))
            band(axes[1, j], one["prediction_error"], "samples", label=str(learner))
        axes[0, j].set(title=f"heads m = {h}", xlabel=LABELS["samples"], ylabel="success rate")
        axes[0, j].set_ylim(-0.05, 1.05)
        axes[1, j].set(xlabel=LABELS["samples"], ylabel="normalised prediction error")
        for ax in axes[:, j]:
            ax.set_xscale("log")
        _positive(axes[1, j])
    axes[0, 0].legend(fontsize="small")
    return _finish(fig, "Recovering Chen–Li teachers")


def regimes(ds):
    """Share of rows on which every head agrees (log scale) and mean max attention vs β,
    a curve per head count, a column per input distribution (first tokens value)."""
    inputs = ds["inputs"].values
    fig, axes = _figure(2, len(inputs))
    for j, dist in enumerate(inputs):
        cell = ds.sel(inputs=dist).isel(tokens=0)
        for h in ds["heads"].values:
            band(axes[0, j], cell["agreement"].sel(heads=h), "beta", label=f"m = {h}")
            band(axes[1, j], cell["mean_max_attention"].sel(heads=h), "beta", label=f"m = {h}")
        tokens = int(ds["tokens"].values[0])
        axes[0, j].set(
            title=f"{dist} tokens, k = {tokens}",
            xlabel=LABELS["beta"],
            ylabel="rows where all heads agree",
        )
        axes[1, j].set(xlabel=LABELS["beta"], ylabel="mean max attention weight")
        _positive(axes[0, j])
        for ax in axes[:, j]:
            ax.set_xscale("log")
    axes[0, 0].legend(fontsize="small")
    return _finish(fig, "Attention regimes of random teachers")


def heads(ds):
    """Training loss (solid) and test loss (dashed) vs step, a curve per head count, a
    column per step size, a row per noise level; log–log."""
    lrs, noises = ds["lr"].values, ds["noise"].values
    fig, axes = _figure(len(noises), len(lrs))
    steps = ds["step"].values
    shown = steps > 0
    for i, noise in enumerate(noises):
        for j, lr in enumerate(lrs):
            ax = axes[i, j]
            cell = ds.sel(noise=noise, lr=lr).isel(step=np.flatnonzero(shown))
            for h in ds["heads"].values:
                one = cell.sel(heads=h)
                band(ax, one["trace_loss"], "step", label=f"H = {h}")
                color = ax.get_lines()[-1].get_color()
                band(ax, one["trace_test_loss"], "step", color=color, linestyle="--")
            ax.set(
                title=f"η = {lr:g}, noise σ = {noise:g}",
                xlabel=LABELS["step"],
                ylabel="logistic loss (— train, -- test)",
            )
            ax.set_xscale("log")
            _positive(ax)
    axes[0, 0].legend(fontsize="small")
    return _finish(fig, "Classifier training with H heads")


def _guide(ax, x: np.ndarray, y0: float, power: float, label: str) -> None:
    """A dotted c·x^power line through (x[0], y0)."""
    x = np.asarray(x, dtype=float)
    ax.plot(x, y0 * (x / x[0]) ** power, "k:", label=label)


def stepsize(ds):
    """Largest stable step size vs heads; ‖∇²L̂(θ₀)‖ and the weak-convexity ratio vs heads,
    with a 1/√H guide; log–log."""
    fig, axes = _figure(1, 3)
    h = ds["heads"].values
    band(axes[0, 0], ds["largest_stable_lr"], "heads", label="largest stable η")
    norm = _median(ds["hessian_norm"])
    axes[0, 0].plot(h, 2 / norm, "s--", label="2 / ‖∇²L̂(θ₀)‖")
    axes[0, 0].set(xlabel=LABELS["heads"], ylabel="step size η")
    band(axes[0, 1], ds["hessian_norm"], "heads", label="‖∇²L̂(θ₀)‖ (loss)")
    band(axes[0, 1], ds["score_hessian_norm"], "heads", label="‖∇²Φ(X; θ₀)‖ (score, mean)")
    _guide(axes[0, 1], h, float(_median(ds["score_hessian_norm"])[0]), -0.5, "∝ 1/√H")
    axes[0, 1].set(xlabel=LABELS["heads"], ylabel="Hessian spectral norm at init")
    band(axes[0, 2], ds["weak_convexity"], "heads", label="−λ_min(∇²L̂)/L̂")
    _guide(axes[0, 2], h, float(np.abs(_median(ds["weak_convexity"])[0])), -0.5, "∝ 1/√H")
    axes[0, 2].set(xlabel=LABELS["heads"], ylabel="weak-convexity ratio at init")
    _loglog(axes[0])
    return _finish(fig, "Curvature and step size vs heads")


def samples(ds):
    """Test loss vs samples (log–log, with an n^(−1) guide), and the generalisation gap
    beside the stability proxy, a curve per head count."""
    fig, axes = _figure(1, 2)
    n = ds["samples"].values
    for h in ds["heads"].values:
        one = ds.sel(heads=h)
        band(axes[0, 0], one["test_loss"], "samples", label=f"H = {h}")
        band(axes[0, 1], one["gap"], "samples", label=f"gap, H = {h}")
        color = axes[0, 1].get_lines()[-1].get_color()
        band(axes[0, 1], one["stability_proxy"], "samples", color=color, linestyle="--")
    first = float(np.nanmedian(_median(ds["test_loss"].isel(samples=0))))
    _guide(axes[0, 0], n, first, -1.0, "∝ 1/n")
    axes[0, 0].set(xlabel=LABELS["samples"], ylabel="test logistic loss")
    axes[0, 1].set(xlabel=LABELS["samples"], ylabel="gap (—) and (η/n)Σ_t L̂(θ_t) (--)")
    _loglog(axes[0])
    return _finish(fig, "Generalisation vs samples")


def margin(ds):
    """NTK margin at initialisation vs heads, a curve per initialisation (log–log)."""
    fig, axes = _figure(1, 1)
    for init in ds["init"].values:
        band(axes[0, 0], ds["margin"].sel(init=init), "heads", label=str(init))
    axes[0, 0].set(xlabel=LABELS["heads"], ylabel="NTK margin γ at θ₀ (0: not separable)")
    axes[0, 0].set_xscale("log")
    axes[0, 0].legend(fontsize="small")
    return _finish(fig, "NTK margin at initialisation")


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

    fig.savefig(path, dpi=120)
    plt.close(fig)
