"""Figure helpers every study's figure is drawn with (each study's figure module under
``mhalearn/experiments/figures/`` registers its figure by the study's name, and ``plot``
there picks it from a Dataset's ``study``).

Every figure says what it draws: a caption under the panels (median of how many instances,
what the band or the bars are), the fixed settings in its title, axis labels from the
variables' ``long_name`` (:mod:`mhalearn.variables`), one legend for the whole figure, a marker
and a line style per curve (and a slight shift along a log x axis, so that coinciding curves
stay visible), and the values themselves as tick labels on sample and head axes. Curves are
medians across instances with the interquartile range as a band (:func:`band`); rates
(success, separable) are shares with Wilson 95% intervals as bars (:func:`rate`).
Matplotlib is imported lazily (use the Agg backend headless).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from mhalearn.stats import wilson

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


def panels(rows: int, cols: int, width: float = 4.2, height: float = 3.4):
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


def heatmap(ax, values: np.ndarray, x: Sequence[float], y: Sequence[float], **kw: Any):
    """``values`` (len(y), len(x)) as coloured cells on a log x axis (cell edges at the
    geometric midpoints of ``x``) and a categorical y axis; returns the mesh (for a
    colorbar). NaN cells stay blank."""
    x = np.asarray(x, dtype=float)
    if len(x) > 1:
        mids = np.sqrt(x[1:] * x[:-1])
        edges = np.concatenate([[x[0] ** 2 / mids[0]], mids, [x[-1] ** 2 / mids[-1]]])
    else:
        edges = np.array([x[0] / 1.4, x[0] * 1.4])
    rows = np.arange(len(y) + 1) - 0.5
    mesh = ax.pcolormesh(edges, rows, np.asarray(values, float), shading="flat", **kw)
    ax.set_xscale("log")
    ax.set_yticks(np.arange(len(y)), [f"{v:g}" for v in y])
    return mesh


def median(da) -> np.ndarray:
    """Median over ``instance`` (NaN-aware), as an array over the other dims."""
    with _quiet():
        return np.nanmedian(da.transpose(..., "instance").values, axis=-1)


def label_of(ds, name: str) -> str:
    return ds[name].attrs.get("long_name", name.replace("_", " "))


def values_axis(ax, values: Sequence[float], label: str) -> None:
    """A log x axis whose ticks are the grid's own values, written out (10, 40, 100, ...)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = [float(v) for v in values]
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    # more than six values do not fit side by side on a panel: written upright, smaller
    crowded = {"rotation": 90, "fontsize": 7} if len(values) > 6 else {}
    ax.set_xticklabels([f"{v:g}" for v in values], **crowded)
    pad = 1.15
    ax.set_xlim(min(values) / pad, max(values) * pad)
    ax.set_xlabel(label)


#: the ticks a log axis of ratios writes out (those inside its limits)
RATIO_TICKS = (0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def ratio_axis(ax) -> None:
    """A log y axis of ratios near 1 (N*/N_c ...) with plain tick labels (1.5, 2, 3), where
    matplotlib would write 3×10⁰ or none at all."""
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    inside = [v for v in RATIO_TICKS if low <= v <= high]
    if len(inside) >= 2:
        ax.set_yticks(inside)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def config_of(ds) -> dict[str, Any]:
    try:
        return json.loads(ds.attrs.get("config", "{}"))
    except ValueError:
        return {}


def settings(ds, names: Sequence[str]) -> str:
    """``name value`` for each fixed setting of the study that wrote ``ds``."""
    config = config_of(ds)
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
    legend_rows, lines = 0, 1
    if labels:
        longest = max(len(line) for label in labels for line in label.split("\n")) + 6
        ncol = max(1, min(len(labels), int(width * 13 // longest)))
        legend_rows = -(-len(labels) // ncol)
        lines = max(label.count("\n") + 1 for label in labels)  # a label may span lines
    legend = 0.24 * legend_rows * lines + (0.1 if labels else 0.0)  # inches, from the bottom up
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


def instances(ds) -> int:
    return int(ds.sizes["instance"])


def guide(ax, x: np.ndarray, y0: float, power: float, label: str) -> None:
    """A dotted c·x^power line through (x[0], y0)."""
    x = np.asarray(x, dtype=float)
    ax.plot(x, y0 * (x / x[0]) ** power, "k:", label=label)


def save(fig, path) -> None:
    """Write ``fig`` as a PNG and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
