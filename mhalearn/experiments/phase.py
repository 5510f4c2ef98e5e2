"""``phase``: where learners stop recovering Chen–Li teachers — sample-complexity phase diagrams.

Success vs training samples N, on a log grid in units of the counting limit
N_c = 2·heads·dim/tokens (where the N·tokens·dim equations match the 2·heads·dim² unknowns),
× heads × β (swept inside a cell) × learner × input distribution × dim. Every learner sees the
same teachers and samples (instance i of every cell draws from ``fold_in(key, i)``).

Each failed fit is classified: an **optimisation failure** when its training loss is above the
teacher's by more than ``fit_tol`` (relative to mean(Y²)) — the learner did not fit data the
truth fits — and **non-identified** when it fits the training data as well as the truth does
but its parameters are wrong (the data do not determine the teacher, or the fit found another
solution): computational against statistical failure.

Derived across instances (:meth:`Phase.derive`): the threshold N*₅₀ where the success rate
crosses one half, by a logistic fit in log N (:func:`mhalearn.stats.logistic_crossing`), with a
95% bootstrap interval over teachers (the same resampled teachers for every curve), also as
N*₅₀/N_c; and per learner × inputs × dim × β, N*₅₀/N_c vs heads fitted as a power law and as an
exponential (:func:`mhalearn.stats.growth_fits`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

import equinox as eqx
import jax
import numpy as np

from mhalearn import plots, stats
from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.data import TOKEN_DISTRIBUTIONS
from mhalearn.experiments.base import Study, product_grid, register_study, results_dataset
from mhalearn.experiments.recovery import check_regression_learners
from mhalearn.learners import learner_label, make_learner
from mhalearn.learners.gd import GDConfig
from mhalearn.simulate import simulate
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import TeacherSpec

#: the default grid of N/N_c: ten values, log-spaced from 0.5 to 32
RATIOS = (0.5, 0.794, 1.26, 2.0, 3.17, 5.04, 8.0, 12.7, 20.2, 32.0)

#: the full variable-projection diagram (notebook 09; 33 min on 2 cores): 10 N × heads 1–3 ×
#: β {1, 4, 16} × 1024 teachers, dim 8
FULL: dict[str, Any] = dict(
    learner=("varpro",),
    ratio=RATIOS,
    heads=(1, 2, 3),
    dim=(8,),
    inputs=("boolean",),
    beta=(1.0, 4.0, 16.0),
    steps=3000,
    instances=1024,
    bootstrap=1000,
)
#: notebook 09's small size: the full diagram's learner and budgets on a small grid
SMALL: dict[str, Any] = dict(
    ratio=(0.5, 2.0, 8.0), heads=(1, 2), dim=(4,), beta=(1.0, 4.0), instances=8
)

#: the dimensions every threshold variable has (in this order)
THRESHOLD_DIMS = ("learner", "inputs", "dim", "heads", "beta")


def critical_samples(heads: int, dim: int, tokens: int) -> float:
    """N_c = 2·heads·dim/tokens: where N·tokens·dim equations match 2·heads·dim² unknowns."""
    return 2 * heads * dim / tokens


def samples_at(ratio: float, heads: int, dim: int, tokens: int) -> int:
    """The training samples of a cell: N = round(ratio·N_c), at least 1."""
    return max(1, round(ratio * critical_samples(heads, dim, tokens)))


def describe_learner(name: str, steps: int, stop_loss: float) -> str:
    """What learner ``name`` runs in this study (gradient learners stop at ``stop_loss``)."""
    label = learner_label(name, steps)
    if isinstance(make_learner(name, steps), GDConfig):
        label += f", stops at training loss ≤ {stop_loss:g}"
    return label


@register_study
@dataclasses.dataclass(frozen=True)
class Phase(Study):
    """Success, failure type and thresholds of each learner vs N/N_c, heads and β (static
    grid: learner × inputs × dim × heads × ratio; β swept inside a cell).

    The defaults are ``mhalearn run``'s main job, about a minute on 2 cores: variable
    projection from random starts beside the oracle (variable projection from the perturbed
    teacher) on the same 64 teachers per point, heads 1 and 2, dim 4, β 4, N/N_c from 0.5 to 8.
    The full diagram of notebook 09 is the preset ``"full"`` (:data:`FULL`).
    """

    name = "phase"
    summary = "where teachers stop being recovered: success vs N/N_c × heads × β, per learner"
    static_axes = ("learner", "inputs", "dim", "heads", "ratio")
    headline = "success"
    positive = ("ratio", "beta", "success_tol", "fit_tol")
    precision = "float64"  # variable projection and the pipeline need it
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            learner=("varpro", "adam"),
            ratio=(1.0, 4.0, 16.0),
            heads=(1, 2),
            dim=(4,),
            beta=(1.0, 4.0),
            steps=20,
            instances=4,
            bootstrap=50,
        ),
        # notebook 09's sizes: small (CI) and full, each with its variants
        "small": {**FULL, **SMALL},
        "small_learners": {
            **FULL,
            **SMALL,
            "learner": ("adam", "chen_li"),
            "ratio": (2.0, 8.0),
            "beta": (4.0,),
            "steps": 300,
            "instances": 4,
        },
        "small_gaussian": {
            **FULL,
            **SMALL,
            "inputs": ("gaussian",),
            "ratio": (2.0, 8.0),
            "beta": (4.0,),
            "instances": 4,
        },
        "small_dim": {
            **FULL,
            **SMALL,
            "ratio": (2.0, 8.0),
            "heads": (2,),
            "dim": (3, 4),
            "beta": (4.0,),
            "instances": 4,
        },
        "full": FULL,
        # the slower learners beside variable projection on the same teachers, heads 1–4 at β 4
        "full_learners": {
            **FULL,
            "learner": ("varpro", "adam", "chen_li"),
            "heads": (1, 2, 3, 4),
            "beta": (4.0,),
            "instances": 128,
        },
        "full_gaussian": {**FULL, "inputs": ("gaussian",)},
        # the threshold vs dim at two heads
        "full_dim": {**FULL, "dim": (4, 8, 16), "heads": (2,), "beta": (4.0,), "instances": 256},
    }

    learner: tuple[str, ...] = ("varpro", "oracle")
    """Learners (one cell each), by registered name; every one sees the same teachers and
    samples."""
    ratio: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
    """Training samples in units of N_c = 2·heads·dim/tokens (one cell each; N rounded)."""
    heads: tuple[int, ...] = (1, 2)
    """Heads m of teacher and student (one cell each)."""
    dim: tuple[int, ...] = (4,)
    """Token dimensions d (one cell each)."""
    inputs: tuple[str, ...] = ("boolean",)
    """Token distributions of the inputs, "boolean" and/or "gaussian" (one cell each)."""
    beta: tuple[float, ...] = (4.0,)
    """Teacher attention scales β (‖Θ_i‖_F ≈ β), swept inside a cell."""
    tokens: int = 4
    """Sequence length k."""
    label_noise: float = 0.0
    """Label noise: Y = F(X) + label_noise·N(0, 1) entrywise (0: realizable)."""
    steps: int = 3000
    """Step budget of the gradient learners (adam, gd, ...)."""
    stop_loss: float = 1e-12
    """A gradient learner stops (converged) once its training loss is at most this."""
    success_tol: float = 1e-3
    """A teacher is recovered when every matched Θ_i and W_i is within this relative error."""
    fit_tol: float = 1e-6
    """A fit explains the training data when its training loss exceeds the teacher's by at most
    this times mean(Y²); a failed fit that does is non-identified, one that does not is an
    optimisation failure."""
    instances: int = 64
    """Random teachers per grid point."""
    bootstrap: int = 1000
    """Bootstrap replicates (resampled teachers) for the thresholds' intervals."""
    seed: int = 0
    """Root seed: teacher i of every grid point draws from fold_in(key(seed), i); the bootstrap
    draws from it too."""

    def __post_init__(self):
        super().__post_init__()
        check_regression_learners(self.learner, self.steps)
        if list(self.ratio) != sorted(self.ratio):
            raise ValueError(f"ratio: expected increasing values, received {self.ratio}")
        for inputs in self.inputs:
            choice("inputs", inputs, TOKEN_DISTRIBUTIONS)
        for h, d in itertools.product(self.heads, self.dim):  # shapes and β before any work
            TeacherSpec(heads=h, dim=d, tokens=self.tokens, beta=max(self.beta))

    def learner_config(self, name: str):
        """The config learner ``name`` runs with: the study's step budget, and for gradient
        learners the stop at ``stop_loss``."""
        config = make_learner(name, self.steps)
        if isinstance(config, GDConfig):
            config = eqx.tree_at(lambda c: c.tol, config, self.stop_loss)
        return config

    def annotations(self) -> dict[str, dict[str, Any]]:
        return {
            "success": {"tolerance": self.success_tol},
            "failure_optimisation": {"tolerance": self.fit_tol},
            "failure_identification": {"tolerance": self.fit_tol},
        }

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        """Every β × teacher of one (learner, inputs, dim, heads, N) in one compilation; the
        per-step traces are not kept (the diagram is about where the fits end)."""
        heads, dim = cell["heads"], cell["dim"]
        values, key_ids = product_grid({"beta": self.beta}, self.instances)
        teacher = TeacherSpec(
            heads=heads, dim=dim, tokens=self.tokens, beta=values["beta"], inputs=cell["inputs"]
        )
        task = RegressionTask(
            teacher=teacher,
            samples=samples_at(cell["ratio"], heads, dim, self.tokens),
            test_samples=256,
            label_noise=self.label_noise,
            success_tol=self.success_tol,
        )
        learner = self.learner_config(cell["learner"])
        res = simulate(key, task, learner, len(key_ids), key_ids=key_ids, **engine.kwargs())
        ds = results_dataset(res, {"beta": self.beta}, self.instances)
        ds = ds.drop_vars([v for v in ds.data_vars if str(v).startswith("trace_")])
        ds = ds.drop_dims("step", errors="ignore")
        failed = ds["success"] == 0
        fitted = ds["train_excess"] <= self.fit_tol
        ds["failure_optimisation"] = (failed & ~fitted).astype(np.int8)
        ds["failure_identification"] = (failed & fitted).astype(np.int8)
        return ds

    def derive(self, ds):
        """Adds the coordinates ``samples`` (N of each cell) and ``critical_samples`` (N_c), the
        success rates with Wilson 95% intervals (``success_rate``, ``_lower``, ``_upper``), the
        thresholds (``threshold``: N*₅₀; ``threshold_ratio``: N*₅₀/N_c; each with ``_lower`` and
        ``_upper``, a 95% bootstrap interval over teachers) over learner × inputs × dim ×
        heads × β, and their growth in the heads (``growth_power``, ``growth_exponential``,
        each with bounds; ``growth_exponential_better``, ``growth_better_share``)."""
        heads, dims, ratios = ds["heads"].values, ds["dim"].values, ds["ratio"].values
        n_c = np.array([[critical_samples(h, d, self.tokens) for h in heads] for d in dims])
        samples = np.array(
            [[[samples_at(r, h, d, self.tokens) for r in ratios] for h in heads] for d in dims]
        )
        ds = ds.assign_coords(
            critical_samples=(("dim", "heads"), n_c), samples=(("dim", "heads", "ratio"), samples)
        )
        idx = stats.bootstrap_indices(ds.sizes["instance"], self.bootstrap, self.seed)
        shape = tuple(ds.sizes[d] for d in THRESHOLD_DIMS)
        point = np.full(shape, np.nan)
        jump = np.full((2, *shape), np.nan)
        reps = np.full((self.bootstrap, *shape), np.nan)
        success = ds["success"].transpose(*THRESHOLD_DIMS, "ratio", "instance").values
        hits, trials = np.nansum(success, axis=-1), np.sum(np.isfinite(success), axis=-1)
        low, high = stats.wilson(hits, trials)
        for suffix, values in (("", hits / trials), ("_lower", low), ("_upper", high)):
            ds[f"success_rate{suffix}"] = ((*THRESHOLD_DIMS, "ratio"), values)
        for at in np.ndindex(shape):
            x = np.log(samples[at[2], at[3]])
            point[at] = np.exp(stats.logistic_crossing(x, hits[at], trials[at]))
            jump[(slice(None), *at)] = stats.separated_bracket(x, hits[at], trials[at])
            k, n = stats.resampled_counts(success[at], idx)  # success[at]: (ratio, instance)
            reps[(slice(None), *at)] = np.exp(stats.logistic_crossing(x, k, n))
        lower, upper = stats.percentile_interval(reps)
        # where the rate jumps from 0 to 1 between two grid points, so does every replicate's:
        # the interval is then at least those two points (what the grid resolves)
        lower, upper = np.fmin(lower, np.exp(jump[0])), np.fmax(upper, np.exp(jump[1]))
        per_nc = n_c[None, None, :, :, None]
        for suffix, values in (("", point), ("_lower", lower), ("_upper", upper)):
            ds[f"threshold{suffix}"] = (THRESHOLD_DIMS, values)
            ds[f"threshold_ratio{suffix}"] = (THRESHOLD_DIMS, values / per_nc)
        return self._growth(ds, point / per_nc, reps / per_nc)

    @staticmethod
    def _growth(ds, ratio: np.ndarray, reps: np.ndarray):
        """The growth fits of N*₅₀/N_c in the heads (axis 3 of ``ratio``), per the rest."""
        dims = tuple(d for d in THRESHOLD_DIMS if d != "heads")
        shape = tuple(ds.sizes[d] for d in dims)
        names = ("power", "power_lower", "power_upper", "exponential", "exponential_lower")
        names += ("exponential_upper", "better_share")
        out = {name: np.full(shape, np.nan) for name in (*names, "exponential_better")}
        m = ds["heads"].values
        for at in np.ndindex(shape):
            pick = (*at[:3], slice(None), at[3])
            fits = stats.growth_fits(m, ratio[pick], reps[(slice(None), *pick)])
            for name in names:
                out[name][at] = fits[name]
            if fits["better"]:
                out["exponential_better"][at] = fits["better"] == "exponential"
        for name, values in out.items():
            ds[f"growth_{name}"] = (dims, values)
        return ds

    def summarize(self, ds) -> str:
        """The success rate per point (N/N_c across), the thresholds with their intervals and
        the growth fits."""
        rate = ds["success"].mean("instance").to_series().unstack("ratio")
        cols = ["threshold", "threshold_lower", "threshold_upper", "threshold_ratio"]
        cols += ["threshold_ratio_lower", "threshold_ratio_upper"]
        table = ds[cols].to_dataframe()[cols]
        growth = [str(v) for v in ds.data_vars if str(v).startswith("growth_")]
        lines = [
            f"success (rate over {ds.sizes['instance']} teachers; columns: N/N_c):",
            rate.to_string(float_format=lambda v: f"{v:.3f}"),
            "",
            "threshold N*50 (samples) and N*50/N_c, 95% bootstrap intervals (NaN: not crossed "
            "inside the grid):",
            table.to_string(float_format=lambda v: f"{v:.3g}"),
        ]
        if ds.sizes["heads"] >= 3:
            frame = ds[growth].to_dataframe()[growth]
            frame.columns = [c[len("growth_") :] for c in frame.columns]
            lines += [
                "",
                "growth of N*50/N_c in the heads m: log r = c + k·log m (power) and "
                "log r = c + s·m (exponential):",
                frame.to_string(float_format=lambda v: f"{v:.3g}"),
            ]
        return "\n".join(lines)

    @staticmethod
    def figure(ds):
        """Top row: the share of teachers recovered vs N/N_c with Wilson 95% bars, a panel per
        head count (or per dim when the study has one head count and several dims), a curve per
        learner × β, N*₅₀/N_c marked with its interval. Below, heatmaps of the shares recovered,
        failed to optimise and non-identified over (N/N_c, heads or dim), a row per learner ×
        β (the first inputs, and the first dim or head count), with a colour bar; at the bottom,
        N*₅₀/N_c vs heads per inputs with its power-law and exponential fits when there are
        several head counts, and vs dim when there are several dims."""
        config = plots.config_of(ds)
        along = "dim" if ds.sizes["heads"] == 1 and ds.sizes["dim"] > 1 else "heads"
        across = "heads" if along == "dim" else "dim"
        one = ds.isel({"inputs": 0, across: 0})
        rows = list(itertools.product(one["learner"].values, one["beta"].values))
        by_heads = ds.sizes["heads"] > 1
        below = by_heads * ds.sizes["inputs"] + (ds.sizes["dim"] > 1)
        cols = max(3, below, one.sizes[along])
        fig, axes = plots.panels(1 + len(rows) + (below > 0), cols, width=4.0, height=2.8)
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
        if below:
            last = axes[1 + len(rows)]
            if by_heads:
                for j, inputs in enumerate(ds["inputs"].values):
                    _thresholds_vs_heads(last[j], ds.sel(inputs=inputs).isel(dim=0))
            if ds.sizes["dim"] > 1:
                _thresholds_vs_dim(last[below - 1], ds.isel(inputs=0))
            for ax in last[below:]:
                ax.remove()
        n = plots.instances(ds)
        widest = np.max(np.subtract(*stats.wilson(np.array([n // 2]), np.array([n]))[::-1]))
        steps, stop = config.get("steps", Phase.steps), config.get("stop_loss", Phase.stop_loss)
        learners = "; ".join(describe_learner(str(v), steps, stop) for v in ds["learner"].values)
        caption = (
            f"Top row and heatmaps: share (in %) of the {n} teachers per cell recovered "
            "(every matched Θ_i "
            f"and W_i within relative error {config.get('success_tol', '?')}), failed with a "
            f"training loss above the teacher's by more than {config.get('fit_tol', '?')}·mean(Y²) "
            "(optimisation failure), or failed with the training data fitted (non-identified); "
            "bars on the top row: Wilson 95% intervals (the widest at "
            f"{n} teachers is ±{widest / 2:.2f}). "
            "N_c = 2·heads·dim/tokens. Red triangles, horizontal bars at one half on the top "
            "row and "
            "the bottom row: N*50/N_c, where the logistic "
            "fit (in log N) of the success share crosses one half, with 95% bootstrap intervals "
            "over teachers (at least the two grid points around a jump from 0 to 1). Thin lines: "
            "least-squares fits of log(N*50/N_c) on log m (dashed: power law, rate k) and on m "
            "(dotted: exponential, rate s), 95% bootstrap intervals on the rates in the legend; "
            "'better': the smaller residual sum of squares (both have two parameters). A curve "
            "that never crosses one half inside the grid is not drawn. "
            f"Learners: {learners.rstrip('.')}."
        )
        title = (
            f"Phase diagram of teacher recovery (heatmaps: inputs {one['inputs'].item()}, "
            f"{across} {one[across].item()}): " + plots.settings(ds, ("tokens", "label_noise"))
        )
        return plots.finish(fig, title, caption)


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
        plots.values_axis(ax, ratios, "N / N_c")
        ax.set(ylim=(-0.03, 1.03), ylabel="share recovered")
        ax.set_title(f"recovered vs N/N_c: {'heads m' if along == 'heads' else 'dim d'} {value}")


def _thresholds_vs_heads(ax, one) -> None:
    """N*₅₀/N_c vs heads, a curve per learner × β, with each curve's two growth fits."""
    m = one["heads"].values.astype(float)
    grid = np.linspace(m.min(), m.max(), 50)
    curves = list(itertools.product(one["learner"].values, one["beta"].values))
    for i, (learner, beta) in enumerate(curves):
        c = one.sel(learner=learner, beta=beta)
        t = c["threshold_ratio"].values
        if not np.isfinite(t).any():
            continue  # no threshold inside the grid at any head count
        lo, hi = c["threshold_ratio_lower"].values, c["threshold_ratio_upper"].values
        label = f"{learner}, β = {beta:g}"
        k, s = c["growth_power"].item(), c["growth_exponential"].item()
        if np.isfinite(k) and np.isfinite(s):
            g = {name: c[f"growth_{name}"].item() for name in ("power_lower", "power_upper")}
            g |= {name: c[f"growth_{name}"].item() for name in ("exponential_lower",)}
            g["exponential_upper"] = c["growth_exponential_upper"].item()
            better = "exponential" if c["growth_exponential_better"].item() == 1 else "power"
            label += (
                f": k = {k:.2f} [{g['power_lower']:.2f}, {g['power_upper']:.2f}], s = {s:.2f} "
                f"[{g['exponential_lower']:.2f}, {g['exponential_upper']:.2f}], better: {better}"
            )
            ok = np.isfinite(t)
            power = np.polyfit(np.log(m[ok]), np.log(t[ok]), 1)
            expo = np.polyfit(m[ok], np.log(t[ok]), 1)
            color = plots.style(i)["color"]
            ax.plot(
                grid,
                np.exp(np.polyval(power, np.log(grid))),
                "--",
                color=color,
                lw=0.8,
                label="_power",
            )
            ax.plot(grid, np.exp(np.polyval(expo, grid)), ":", color=color, lw=0.8, label="_exp")
        at = m + 0.04 * (i - (len(curves) - 1) / 2)
        ax.errorbar(at, t, yerr=[t - lo, hi - t], capsize=3, label=label, **plots.style(i))
    ax.set_yscale("log")
    ax.set_xticks(m, [f"{v:g}" for v in m])
    ax.set(xlabel="heads m", ylabel="N*50 / N_c", xlim=(m.min() - 0.4, m.max() + 0.4))
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
    ax.set_yscale("log")
    ax.set(ylabel="N*50 / N_c")
    plots.values_axis(ax, d, "token dimension d")
    ax.set_title(f"thresholds vs dim: inputs {one['inputs'].item()}")
