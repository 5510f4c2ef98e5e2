"""The phase study itself (:class:`Phase`); its package's docstring says what it measures."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

import equinox as eqx
import jax
import numpy as np
import pandas as pd
import xarray as xr

from mhalearn import stats
from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.data import TOKEN_DISTRIBUTIONS
from mhalearn.experiments.base import Study, product_grid, register_study, results_dataset
from mhalearn.experiments.phase.presets import PRESETS
from mhalearn.experiments.recovery import (
    budget_starts,
    check_regression_learners,
    with_iterations,
)
from mhalearn.learners import make_learner
from mhalearn.learners.gd import GDConfig
from mhalearn.restarts import simulate_starts
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import Family, TeacherSpec

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


def budget_converged(ds: xr.Dataset, ladder: tuple[float, float] | None = None) -> xr.DataArray:
    """Whether the computational threshold has converged in the budget: 1 where the 95%
    intervals of N*₅₀ at the two largest budgets overlap, 0 where they do not; NaN where
    either is not crossed inside the grid, or (with a ``ladder`` window) where either crossing
    lies outside the window, since there the larger budgets never ran and equal the first by
    construction."""
    low, high = ds["threshold_lower"], ds["threshold_upper"]
    last, before = {"budget": -1}, {"budget": -2}
    overlap = (low.isel(last) <= high.isel(before)) & (low.isel(before) <= high.isel(last))
    two = ds["threshold_ratio"].isel(budget=[-2, -1])
    known = np.isfinite(two).all("budget")
    if ladder is not None:
        known = known & ((two >= ladder[0]) & (two <= ladder[1])).all("budget")
    return overlap.astype(float).where(known)


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
    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

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
            key, task, learner, len(key_ids), unique, key_ids=key_ids, engine=engine
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
        not) and the flag ``budget_converged`` (:func:`budget_converged`); the statistical
        threshold from ``identified`` (no fit at the largest budget, of any learner, explains
        the training data while lying away from the teacher): ``identified_rate`` with Wilson
        intervals,
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
            ds["budget_converged"] = budget_converged(ds, self.ladder)
            agree = ds["budget_converged"] == 1
            for name in ("threshold", "threshold_ratio"):
                for suffix in ("", "_lower", "_upper"):
                    value = ds[f"{name}{suffix}"].isel(budget=-1, drop=True).where(agree)
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
        ``threshold``'s ``_ratio`` form, per N_c, with 95% bootstrap intervals over teachers:
        :func:`~mhalearn.stats.crossing_thresholds`). Returns the bootstrap replicates of
        N*/N_c, shape (bootstrap, *dims)."""
        values = ds[flag].transpose(*dims, "ratio", "instance").values
        samples = ds["samples"].broadcast_like(ds[flag].isel(instance=0))
        log_n = np.log(samples.transpose(*dims, "ratio").values.astype(float))
        n_c = ds["critical_samples"].broadcast_like(samples.isel(ratio=0))
        n_c = n_c.transpose(*dims).values
        found = stats.crossing_thresholds(values, log_n, self.bootstrap, self.seed)
        for suffix in ("", "_lower", "_upper"):
            ds[f"{rate}{suffix}"] = ((*dims, "ratio"), found[f"rate{suffix}"])
        for suffix in ("", "_lower", "_upper"):
            ds[f"{threshold}{suffix}"] = (dims, found[f"threshold{suffix}"])
            ds[f"{threshold}_ratio{suffix}"] = (dims, found[f"threshold{suffix}"] / n_c)
        return found["threshold_replicates"] / n_c

    @staticmethod
    def _growth(ds, ratio, reps: np.ndarray, axes: tuple[str, ...], prefix: str):
        """The growth fits of thresholds ``ratio`` (N*/N_c over ``axes``, heads among them) in
        the heads, per point of the other axes, as ``{prefix}_power`` ... (``reps``: its
        bootstrap replicates, shape (bootstrap, *axes); :func:`~mhalearn.stats.growth_table`)."""
        dims = tuple(d for d in axes if d != "heads")
        fits = stats.growth_table(
            ds["heads"].values, ratio.transpose(*axes).values, reps, axes.index("heads")
        )
        for name, values in fits.items():
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
