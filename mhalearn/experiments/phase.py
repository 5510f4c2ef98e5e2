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
import pandas as pd
import xarray as xr

from mhalearn import plots, stats
from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.data import TOKEN_DISTRIBUTIONS
from mhalearn.experiments.base import Study, product_grid, register_study, results_dataset
from mhalearn.experiments.recovery import (
    budget_starts,
    check_regression_learners,
    describe_learner,
    with_iterations,
)
from mhalearn.learners import make_learner
from mhalearn.learners.gd import GDConfig
from mhalearn.restarts import simulate_starts
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import Family, TeacherSpec

#: the β × N diagram's grid of N/N_c: ten values, log-spaced from 0.5 to 32
RATIOS = (0.5, 0.794, 1.26, 2.0, 3.17, 5.04, 8.0, 12.7, 20.2, 32.0)
#: the heads diagram's grid of N/N_c: powers of √2 from 0.5 to 8, both thresholds inside
HEADS_RATIOS = (0.5, 0.707, 1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0)

#: notebook 09's main diagram: the statistical and converged computational thresholds vs heads
#: 1–6 (variable projection from random starts beside the oracle on the same 256 teachers per
#: point, dim 8, β 4), budgets 1, 4, 16 × each learner's default starts, the larger two only at
#: N/N_c in [1.8, 4.5], around the computational crossing
FULL: dict[str, Any] = dict(
    learner=("varpro", "oracle"),
    ratio=HEADS_RATIOS,
    heads=(1, 2, 3, 4, 5, 6),
    dim=(8,),
    inputs=("boolean",),
    beta=(4.0,),
    budget=(1.0, 4.0, 16.0),
    ladder=(1.8, 4.5),
    steps=3000,
    instances=256,
    bootstrap=1000,
)
#: the hard teacher families at the main diagram's size (near_duplicate and ill_conditioned
#: from two heads, two_tokens at two tokens)
FAMILIES: dict[str, dict[str, Any]] = {
    "rank_one": dict(family="rank_one"),
    "near_duplicate": dict(family="near_duplicate", heads=(2, 3, 4, 5, 6)),
    "ill_conditioned": dict(family="ill_conditioned", heads=(2, 3, 4, 5, 6)),
    "two_tokens": dict(family="two_tokens", tokens=2),
}
#: the β × N diagram at heads 1–3 (1024 teachers, one budget): the base of the variants below
DIAGRAM: dict[str, Any] = dict(
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
#: notebook 09's small size: its full size's learners and budget ladder on a small grid
SMALL: dict[str, Any] = dict(
    ratio=(0.5, 2.0, 8.0), heads=(1, 2), dim=(4,), beta=(4.0,), budget=(1.0, 2.0), instances=8
)

#: the dimensions of every computational threshold variable (in this order)
THRESHOLD_DIMS = ("learner", "budget", "inputs", "dim", "heads", "beta")
#: the dimensions of the statistical threshold's variables: no learner, no budget
STATISTICAL_DIMS = ("inputs", "dim", "heads", "beta")
#: the axes of the growth fits' input: the largest budget's thresholds
GROWTH_AXES = ("learner", "inputs", "dim", "heads", "beta")


def critical_samples(heads: int, dim: int, tokens: int) -> float:
    """N_c = 2·heads·dim/tokens: where N·tokens·dim equations match 2·heads·dim² unknowns."""
    return 2 * heads * dim / tokens


def samples_at(ratio: float, heads: int, dim: int, tokens: int) -> int:
    """The training samples of a cell: N = round(ratio·N_c), at least 1."""
    return max(1, round(ratio * critical_samples(heads, dim, tokens)))


def failure_kinds(success, train_excess, fit_tol: float):
    """A failed fit's kind: an optimisation failure when its training loss exceeds the
    teacher's by more than ``fit_tol`` (relative to mean(Y²): ``train_excess``), else
    non-identified (it explains the data as well as the teacher, away from it). Returns the
    two 0/1 arrays (optimisation, identification)."""
    failed = success == 0
    fitted = train_excess <= fit_tol
    return failed & ~fitted, failed & fitted


@register_study
@dataclasses.dataclass(frozen=True)
class Phase(Study):
    """Success, failure type and thresholds of each learner vs N/N_c, heads and β (static
    grid: learner × inputs × dim × heads × ratio; inside a cell, β swept and the budget
    ladder's nested starts run as rounds).

    The defaults are ``mhalearn run``'s main job, about a minute on 2 cores: variable
    projection from random starts beside the oracle (variable projection from the perturbed
    teacher) on the same 64 teachers per point, heads 1 and 2, dim 4, β 4, N/N_c from 0.5 to 8.
    Notebook 09's main diagram, thresholds vs heads 1–6 at three budgets, is the preset ``"full"``
    (:data:`FULL`), the hard families ``"full_<family>"`` (:data:`FAMILIES`).
    """

    name = "phase"
    summary = "where teachers stop being recovered: success vs N/N_c × heads × β, per learner"
    static_axes = ("learner", "inputs", "dim", "heads", "ratio")
    headline = "success"
    positive = ("ratio", "budget", "beta", "success_tol", "fit_tol")
    precision = "float64"  # variable projection and the pipeline need it
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            learner=("varpro", "adam", "oracle"),
            ratio=(0.5, 4.0, 16.0),
            budget=(1.0, 2.0),
            heads=(1, 2),
            dim=(4,),
            beta=(1.0, 4.0),
            steps=20,
            instances=4,
            bootstrap=50,
        ),
        # notebook 09's sizes: small (CI) and full, each with its variants
        "small": {**FULL, **SMALL},
        **{
            f"small_{name}": {**FULL, **SMALL, **family, "heads": (2,), "instances": 4}
            for name, family in FAMILIES.items()
        },
        "small_beta": {**DIAGRAM, **SMALL, "beta": (1.0, 4.0), "budget": (1.0,)},
        "small_learners": {
            **DIAGRAM,
            **SMALL,
            "learner": ("adam", "chen_li", "chen_li_pure"),
            "ratio": (2.0, 8.0),
            "budget": (1.0,),
            "steps": 300,
            "instances": 4,
        },
        "small_gaussian": {
            **DIAGRAM,
            **SMALL,
            "inputs": ("gaussian",),
            "ratio": (2.0, 8.0),
            "budget": (1.0,),
            "instances": 4,
        },
        "small_dim": {
            **DIAGRAM,
            **SMALL,
            "ratio": (2.0, 8.0),
            "heads": (2,),
            "dim": (3, 4),
            "budget": (1.0,),
            "instances": 4,
        },
        "full": FULL,
        **{f"full_{name}": {**FULL, **family} for name, family in FAMILIES.items()},
        "full_beta": DIAGRAM,
        # the slower learners beside variable projection on the same teachers, heads 1–4 at β 4:
        # the pipeline in its hybrid (polished) mode and in its pure mode
        "full_learners": {
            **DIAGRAM,
            "learner": ("varpro", "adam", "chen_li", "chen_li_pure"),
            "heads": (1, 2, 3, 4),
            "beta": (4.0,),
            "instances": 128,
        },
        "full_gaussian": {**DIAGRAM, "inputs": ("gaussian",)},
        # the threshold vs dim at two heads
        "full_dim": {**DIAGRAM, "dim": (4, 8, 16), "heads": (2,), "beta": (4.0,), "instances": 256},
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
    family: Family = "random"
    """Teacher family: random draws, or a hard family (near_duplicate and ill_conditioned need
    heads ≥ 2, two_tokens needs tokens 2; see TeacherSpec)."""
    label_noise: float = 0.0
    """Label noise: Y = F(X) + label_noise·N(0, 1) entrywise (0: realizable)."""
    budget: tuple[float, ...] = (1.0,)
    """Budgets, as multipliers of each learner's default number of random starts (varpro: 2,
    the others: 1; rounded, at least 1), increasing: a dimension of the results. The starts
    are nested (the run at the largest budget gives every smaller one) and run as rounds over
    the teachers no start has fitted yet, so the cost follows the failures."""
    ladder: tuple[float, ...] | None = None
    """The N/N_c range (low, high) where the budgets above the first run; outside it every
    budget keeps the first budget's fits (and cost). Unset: at every N. The larger budgets pay
    only near the computational crossing: far below it no affordable budget fits the data,
    far above it the first budget recovers nearly every teacher."""
    steps: int = 3000
    """Step budget per start of the gradient learners (adam, gd, ...)."""
    iterations: int | None = None
    """Levenberg–Marquardt iterations per start of variable projection (``varpro``, and the
    oracle's refinement); unset (None): the learner's own (20)."""
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
        for axis in ("ratio", "budget"):
            values = getattr(self, axis)
            if any(b <= a for a, b in itertools.pairwise(values)):
                raise ValueError(f"{axis}: expected increasing values, received {values}")
        if self.ladder is not None:
            if len(self.ladder) != 2 or not 0 < self.ladder[0] < self.ladder[1]:
                raise ValueError(
                    f"ladder: expected two increasing positive N/N_c values (low, high), "
                    f"received {self.ladder}"
                )
        for inputs in self.inputs:
            choice("inputs", inputs, TOKEN_DISTRIBUTIONS)
        for h, d in itertools.product(self.heads, self.dim):  # shapes and β before any work
            TeacherSpec(heads=h, dim=d, tokens=self.tokens, beta=max(self.beta), family=self.family)

    def learner_config(self, name: str):
        """The config learner ``name`` runs with: the study's step budget, and for gradient
        learners the stop at ``stop_loss``; the study's LM iterations where it sets them."""
        config = make_learner(name, self.steps)
        if isinstance(config, GDConfig):
            config = eqx.tree_at(lambda c: c.tol, config, self.stop_loss)
        if self.iterations is not None:
            config = with_iterations(config, self.iterations)
        return config

    def starts(self, name: str, ratio: float | None = None) -> list[int]:
        """The random starts of learner ``name`` at each budget (at N/N_c ``ratio``: the first
        budget's at every budget outside the ``ladder`` range)."""
        starts = budget_starts(self.learner_config(name), self.budget)
        if ratio is not None and self.ladder is not None:
            low, high = self.ladder
            if not low <= ratio <= high:
                return starts[:1] * len(starts)
        return starts

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
            heads=heads,
            dim=dim,
            tokens=self.tokens,
            beta=values["beta"],
            inputs=cell["inputs"],
            family=self.family,
        )
        task = RegressionTask(
            teacher=teacher,
            samples=samples_at(cell["ratio"], heads, dim, self.tokens),
            test_samples=256,
            label_noise=self.label_noise,
            success_tol=self.success_tol,
        )
        learner = self.learner_config(cell["learner"])
        starts = self.starts(cell["learner"], cell["ratio"])
        unique = sorted(set(starts))
        rungs = simulate_starts(
            key, task, learner, len(key_ids), unique, key_ids=key_ids, **engine.kwargs()
        )
        parts = []
        for n in starts:
            res = rungs[unique.index(n)]
            ds = results_dataset(res, {"beta": self.beta}, self.instances)
            ds = ds.drop_vars([v for v in ds.data_vars if str(v).startswith("trace_")])
            ds = ds.drop_dims("step", errors="ignore")
            seconds = res.attrs["compile_seconds"] + res.attrs["run_seconds"]
            ds["fit_seconds"] = seconds / len(key_ids)
            parts.append(ds)
        ds = xr.concat(parts, dim=pd.Index(list(self.budget), name="budget"))
        optimisation, identification = failure_kinds(
            ds["success"], ds["train_excess"], self.fit_tol
        )
        ds["failure_optimisation"] = optimisation.astype(np.int8)
        ds["failure_identification"] = identification.astype(np.int8)
        return ds

    def derive(self, ds):
        """Adds the coordinates ``samples`` (N of each cell) and ``critical_samples`` (N_c);
        per learner × budget × inputs × dim × heads × β the success rates with Wilson 95%
        intervals (``success_rate``, ``_lower``, ``_upper``) and the computational thresholds
        (``threshold``: N*₅₀; ``threshold_ratio``: N*₅₀/N_c; each with ``_lower`` and
        ``_upper``, a 95% bootstrap interval over teachers); where there are several budgets,
        the converged threshold (``threshold_converged``, ``threshold_converged_ratio``: the
        largest budget's, where the two largest budgets' intervals overlap; NaN where they do
        not) and the flag ``budget_converged``; the statistical threshold from ``identified``
        (no fit at the largest budget, of any learner, explains the training data while lying
        away from the teacher): ``identified_rate`` with Wilson intervals,
        ``threshold_statistical`` and ``threshold_statistical_ratio`` with bootstrap intervals,
        and ``threshold_gap`` (the largest budget's N*₅₀ over the statistical one); and the
        growth of the largest budget's N*₅₀/N_c in the heads (``growth_power``,
        ``growth_exponential``, each with bounds; ``growth_exponential_better``,
        ``growth_better_share``)."""
        heads, dims, ratios = ds["heads"].values, ds["dim"].values, ds["ratio"].values
        n_c = np.array([[critical_samples(h, d, self.tokens) for h in heads] for d in dims])
        samples = np.array(
            [[[samples_at(r, h, d, self.tokens) for r in ratios] for h in heads] for d in dims]
        )
        ds = ds.assign_coords(
            critical_samples=(("dim", "heads"), n_c), samples=(("dim", "heads", "ratio"), samples)
        )
        reps = self._crossings(ds, "success", "success_rate", "threshold", THRESHOLD_DIMS)
        if ds.sizes["budget"] > 1:
            low, high = ds["threshold_lower"], ds["threshold_upper"]
            last, before = {"budget": -1}, {"budget": -2}
            overlap = (low.isel(last) <= high.isel(before)) & (low.isel(before) <= high.isel(last))
            known = np.isfinite(ds["threshold"].isel(budget=[-2, -1])).all("budget")
            ds["budget_converged"] = overlap.astype(float).where(known)
            for name in ("threshold", "threshold_ratio"):
                for suffix in ("", "_lower", "_upper"):
                    value = ds[f"{name}{suffix}"].isel(last, drop=True).where(overlap & known)
                    ds[f"{name.replace('threshold', 'threshold_converged')}{suffix}"] = value
        away = (ds["failure_identification"].isel(budget=-1, drop=True) == 1).any("learner")
        ds["identified"] = (~away).astype(np.int8)
        statistical = self._crossings(
            ds, "identified", "identified_rate", "threshold_statistical", STATISTICAL_DIMS
        )
        largest = ds["threshold"].isel(budget=-1, drop=True)
        ds["threshold_gap"] = largest / ds["threshold_statistical"]
        top = ds["threshold_ratio"].isel(budget=-1, drop=True)
        ds = self._growth(ds, top, reps[:, :, -1], GROWTH_AXES, "growth")
        ratio = ds["threshold_statistical_ratio"]
        return self._growth(ds, ratio, statistical, STATISTICAL_DIMS, "growth_statistical")

    def _crossings(self, ds, flag: str, rate: str, threshold: str, dims: tuple[str, ...]):
        """Adds, over ``dims``, the rate of 0/1 variable ``flag`` per N (``rate`` with Wilson
        95% bounds) and where its logistic fit in log N crosses one half (``threshold`` and
        ``threshold``'s ``_ratio`` form, per N_c, with 95% bootstrap intervals over teachers,
        at least the grid points around a jump from 0 to 1). Returns the bootstrap
        replicates of N*/N_c, shape (bootstrap, *dims)."""
        values = ds[flag].transpose(*dims, "ratio", "instance").values
        samples = ds["samples"].broadcast_like(ds[flag].isel(instance=0))
        x_all = np.log(samples.transpose(*dims, "ratio").values.astype(float))
        n_c = ds["critical_samples"].broadcast_like(samples.isel(ratio=0))
        n_c = n_c.transpose(*dims).values
        idx = stats.bootstrap_indices(ds.sizes["instance"], self.bootstrap, self.seed)
        shape = values.shape[:-2]
        point = np.full(shape, np.nan)
        jump = np.full((2, *shape), np.nan)
        reps = np.full((self.bootstrap, *shape), np.nan)
        hits, trials = np.nansum(values, axis=-1), np.sum(np.isfinite(values), axis=-1)
        low, high = stats.wilson(hits, trials)
        for suffix, v in (("", hits / trials), ("_lower", low), ("_upper", high)):
            ds[f"{rate}{suffix}"] = ((*dims, "ratio"), v)
        for at in np.ndindex(shape):
            x = x_all[at]
            point[at] = np.exp(stats.logistic_crossing(x, hits[at], trials[at]))
            jump[(slice(None), *at)] = stats.separated_bracket(x, hits[at], trials[at])
            k, n = stats.resampled_counts(values[at], idx)  # values[at]: (ratio, instance)
            reps[(slice(None), *at)] = np.exp(stats.logistic_crossing(x, k, n))
        lower, upper = stats.percentile_interval(reps)
        # where the rate jumps from 0 to 1 between two grid points, so does every replicate's:
        # the interval is then at least those two points (what the grid resolves)
        lower, upper = np.fmin(lower, np.exp(jump[0])), np.fmax(upper, np.exp(jump[1]))
        for suffix, v in (("", point), ("_lower", lower), ("_upper", upper)):
            ds[f"{threshold}{suffix}"] = (dims, v)
            ds[f"{threshold}_ratio{suffix}"] = (dims, v / n_c)
        return reps / n_c

    @staticmethod
    def _growth(ds, ratio, reps: np.ndarray, axes: tuple[str, ...], prefix: str):
        """The growth fits of thresholds ``ratio`` (N*/N_c over ``axes``, heads among them) in
        the heads, per point of the other axes, as ``{prefix}_power`` ... (``reps``: its
        bootstrap replicates, shape (bootstrap, *axes))."""
        ratio = ratio.transpose(*axes).values
        h = axes.index("heads")
        dims = tuple(d for d in axes if d != "heads")
        shape = tuple(ds.sizes[d] for d in dims)
        names = ("power", "power_lower", "power_upper", "exponential", "exponential_lower")
        names += ("exponential_upper", "better_share")
        out = {name: np.full(shape, np.nan) for name in (*names, "exponential_better")}
        m = ds["heads"].values
        for at in np.ndindex(shape):
            pick = (*at[:h], slice(None), *at[h:])
            fits = stats.growth_fits(m, ratio[pick], reps[(slice(None), *pick)])
            for name in names:
                out[name][at] = fits[name]
            if fits["better"]:
                out["exponential_better"][at] = fits["better"] == "exponential"
        for name, values in out.items():
            ds[f"{prefix}_{name}"] = (dims, values)
        return ds

    def summarize(self, ds) -> str:
        """The success rate per point (N/N_c across), the thresholds with their intervals
        (computational per budget, converged, statistical; N_c) and the growth fits."""
        rate = ds["success"].mean("instance").to_series().unstack("ratio")
        f3 = lambda v: f"{v:.3f}"  # noqa: E731
        g3 = lambda v: f"{v:.3g}"  # noqa: E731

        def columns(*names):
            return [f"{n}{s}" for n in names for s in ("", "_lower", "_upper") if n in ds]

        cols = columns("threshold", "threshold_ratio")
        table = ds[cols].to_dataframe()[cols]
        stat = columns("threshold_statistical", "threshold_statistical_ratio")
        frame = ds[stat].assign(N_c=ds["critical_samples"]).to_dataframe()[[*stat, "N_c"]]
        lines = [
            f"success (rate over {ds.sizes['instance']} teachers; columns: N/N_c):",
            rate.to_string(float_format=f3),
            "",
            "computational threshold N*50 (samples) and N*50/N_c per budget (the starts' "
            "multiplier), 95% bootstrap intervals (NaN: not crossed inside the grid):",
            table.to_string(float_format=g3),
        ]
        if "budget_converged" in ds:
            conv = [*columns("threshold_converged_ratio"), "budget_converged"]
            lines += [
                "",
                "converged N*50/N_c (the largest budget's, where the two largest budgets' "
                "intervals overlap; budget_converged 0: they do not):",
                ds[conv].to_dataframe()[conv].to_string(float_format=g3),
            ]
        lines += [
            "",
            "statistical threshold (where half the teachers are identified: no fit at the "
            "largest budget explains the data away from the teacher) and N_c = 2·m·d/k:",
            frame.to_string(float_format=g3),
        ]
        if "fit_seconds" in ds:
            per_cell = ds["fit_seconds"] * ds.sizes["instance"] * ds.sizes["beta"]
            cost = per_cell.mean(["inputs", "dim", "ratio"]).to_series().unstack("budget")
            total = per_cell.sum([d for d in per_cell.dims if d != "budget"]).to_series()
            lines += [
                "",
                "wall seconds per cell (all its teachers and β), fits up to each budget, mean "
                "over the N of the grid:",
                cost.to_string(float_format=lambda v: f"{v:.3g}"),
                "the whole grid: "
                + ", ".join(f"budget {b:g}: {v:.0f} s" for b, v in total.items()),
            ]
        if ds.sizes["heads"] >= 3:
            for prefix, what in (
                ("growth_", "the largest budget's N*50/N_c"),
                ("growth_statistical_", "the statistical N*50/N_c"),
            ):
                growth = [str(v) for v in ds.data_vars if str(v).startswith(prefix)]
                if prefix == "growth_":
                    growth = [g for g in growth if not g.startswith("growth_statistical_")]
                fits = ds[growth].to_dataframe()[growth]
                fits.columns = [c[len(prefix) :] for c in fits.columns]
                lines += [
                    "",
                    f"growth of {what} in the heads m: log r = c + k·log m (power) and "
                    "log r = c + s·m (exponential); better_share: the share of bootstrap "
                    "replicates in which the better fit is better too (decided at ≥ 0.95):",
                    fits.to_string(float_format=g3),
                ]
        return "\n".join(lines)

    @staticmethod
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
        widest = np.max(np.subtract(*stats.wilson(np.array([n // 2]), np.array([n]))[::-1]))
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
        label = "statistical" + _growth_label(one, "growth_statistical")
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
            if b_i == len(budgets) - 1:
                label += _growth_label(c, "growth")
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
