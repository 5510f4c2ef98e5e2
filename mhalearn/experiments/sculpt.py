"""``sculpt``: each phase of the certify-and-sculpt pipeline vs samples, heads and β — where
each one starts to work (a reconstruction: the pipeline is ours, see
:mod:`mhalearn.learners.chen_li`).

Per teacher, from one run of the pipeline in its **pure** mode (the search inside the estimated
span, W by least squares, no unrestricted polish — so the convex phases must do the work):
the crude and refined ΣW errors (phases 1–2), the certified rows, the share of them that are
sound and whether every true head lies inside K (phase 3), K's min-norm point's share inside
span{Θ_i}, the largest principal angle of the span estimate of **every** span method from the
same K (phase 4; the search uses ``span_method``) and K's tilt at the heads
(:func:`~mhalearn.metrics.recovery.constraint_tilt`: how far a true head can turn inside K
away from the span, the resolution a method querying K alone works against), and pure-mode
recovery with the certificate's acceptance, false accepts (accepted, not recovered) and false
rejects (recovered, not accepted) (phase 5). Per cell, the seconds per teacher of each phase
(warm, on ``timing_instances`` teachers, after the run). Derived (:meth:`Sculpt.derive`): the
onset of each phase — the smallest N of the grid from which its criterion holds at every larger
N of the grid.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from mhalearn import stats
from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.experiments.base import Study, product_grid, register_study, results_dataset
from mhalearn.learners import chen_li as cl
from mhalearn.learners.chen_li.phases import (
    certify_phase,
    search_phase,
    span_phase,
    sum_w_phase,
)
from mhalearn.learners.varpro import VarProConfig
from mhalearn.simulate import simulate
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import TeacherSpec
from mhalearn.variables import Meta, register_pattern, register_variables

#: the sculpt study's own variables
register_variables(
    {
        "false_accept": Meta(
            "false accept",
            "1 when the certificate accepted a fit that does not recover the teacher.",
            flag=True,
        ),
        "false_reject": Meta(
            "false reject",
            "1 when the certificate rejected a fit that recovers the teacher.",
            flag=True,
        ),
        "parameter_error": Meta(
            "parameter error ε",
            "The larger of the largest relative errors of a matched Θ_i and of a matched W_i: "
            "recovery within ε.",
        ),
        "error_rate": Meta(
            "rate of ε in N",
            "Slope of log(median parameter error ε over teachers) on log N, least squares over "
            "the N of the grid.",
        ),
        "error_reach": Meta(
            "N where the fitted ε reaches the success tolerance",
            "Where the power law fitted to the median ε reaches ε = success_tol (inf: the fit "
            "does not decrease).",
        ),
        "span_rate": Meta(
            "rate of the span angle in N",
            "Slope of log(median angle of the span estimate (phase 4) over teachers) on log N, "
            "least squares over the N of the grid.",
        ),
        "phase_seconds": Meta(
            "seconds per teacher",
            "Wall seconds per teacher of each phase of the pipeline, each phase compiled "
            "beforehand, over a few teachers of the cell.",
            "s",
        ),
    }
)

register_pattern(
    r"onset_(?P<phase>\w+)$",
    lambda found: Meta(
        f"onset of {found['phase'].replace('_', ' ')}",
        "Smallest N of the grid from which the phase's criterion (ONSETS) holds at every larger "
        "N; NaN if not by the largest.",
    ),
)
register_pattern(
    r"span_angle_(?P<method>\w+)$",
    lambda found: Meta(
        f"span angle, {found['method']}",
        "Largest principal angle from span{Θ_i} to the span estimated by the method "
        f"{found['method']!r} from the same K (phase 4).",
        "rad",
    ),
)

#: the phases timed, in pipeline order
PHASES = ("sum_w", "certify", "span", "search")


class Criterion(NamedTuple):
    """A phase works at a grid point when ``statistic`` (over teachers: "median", or "rate"
    of a 0/1 flag) of ``variable`` is below ``level`` (``above``: at least ``level``)."""

    variable: str
    statistic: str
    level: float
    above: bool
    meaning: str

    def holds(self, value: np.ndarray) -> np.ndarray:
        return value >= self.level if self.above else value < self.level

    def value(self, ds):
        """The statistic over instances, as (heads, beta, samples)."""
        da = ds[self.variable]
        value = da.mean("instance") if self.statistic == "rate" else da.median("instance")
        return value.transpose("heads", "beta", "samples")


#: each phase's criterion of working
ONSETS = {
    "refined_sum_w": Criterion(
        "refined_sum_w_error", "median", 0.01, False, "median refined ΣW error < 0.01"
    ),
    "sound": Criterion(
        "certified_sound", "median", 0.99, True, "median share of sound certified rows ≥ 0.99"
    ),
    "truth_in_k": Criterion(
        "truth_in_k", "rate", 0.9, True, "truth inside K for ≥ 90% of teachers"
    ),
    "span": Criterion("span_angle_estimate", "median", 0.1, False, "median span angle < 0.1 rad"),
    "pure_success": Criterion(
        "success", "rate", 0.5, True, "pure-mode recovery for ≥ 50% of teachers"
    ),
    **{
        f"span_{m}": Criterion(
            f"span_angle_{m}", "median", 0.1, False, f"median span angle of {m} < 0.1 rad"
        )
        for m in cl.SPAN_METHODS
    },
}


def _timed(fn, *args):
    """``fn(*args)`` and the wall seconds it took, its result ready."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def onset(values: np.ndarray, samples: np.ndarray, holds) -> float:
    """The smallest of ``samples`` (ascending, the last axis of ``values``) from which
    ``holds(value)`` is true at it and at every larger one; NaN when it fails at the largest."""
    ok = holds(np.asarray(values, dtype=float))
    tail = np.flip(np.logical_and.accumulate(np.flip(ok, -1), axis=-1), -1)
    first = np.argmax(tail, axis=-1)
    return np.where(tail.any(-1), np.asarray(samples, float)[first], np.nan)


@register_study
@dataclasses.dataclass(frozen=True)
class Sculpt(Study):
    """Each phase of certify-and-sculpt (pure mode) vs N, heads and β (static grid: heads ×
    samples; β swept inside a cell)."""

    name = "sculpt"
    summary = "each phase of certify-and-sculpt (pure mode) vs samples × heads × β"
    static_axes = ("heads", "samples")
    headline = "success"
    positive = ("beta", "success_tol")
    precision = "float64"  # variable projection inside the span needs it
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            samples=(60, 200),
            heads=(2,),
            beta=(4.0, 8.0),
            dim=4,
            tokens=3,
            max_rows=64,
            qp_iterations=50,
            candidates=1,
            search_samples=100,
            instances=2,
            timing_instances=1,
        ),
        "small": dict(
            samples=(300, 3000),
            heads=(1, 2),
            beta=(4.0,),
            max_rows=512,
            qp_iterations=200,
            instances=4,
            timing_instances=1,
        ),
        "full": dict(),
        # the pure mode's ε(N) at one head beyond the full grid (notebook 03 joins it to the
        # full store's N ≤ 10⁵ at β 4: the same teachers)
        "full_large": dict(
            samples=(300_000, 1_000_000), heads=(1,), beta=(4.0,), timing_instances=2
        ),
    }

    samples: tuple[int, ...] = (300, 1000, 3000, 10_000, 30_000, 100_000)
    """Training examples N per teacher (one cell each)."""
    heads: tuple[int, ...] = (1, 2, 3)
    """Heads m of teacher and student (one cell each)."""
    beta: tuple[float, ...] = (4.0, 8.0, 16.0)
    """Teacher attention scales β (‖Θ_i‖_F ≈ β), swept inside a cell."""
    dim: int = 8
    """Token dimension d."""
    tokens: int = 4
    """Sequence length k."""
    span_method: str = "subsets"
    """The span method the search inside the span uses (every method's angle is reported)."""
    max_rows: int = 4096
    """Certified rows whose constraints K keeps (the first ones; K grows with N up to this)."""
    qp_iterations: int = 600
    """Iterations of each QP (min-norm points, projections) of phase 4."""
    candidates: int = 4
    """Random starts of the search inside the span (20 LM iterations each)."""
    search_samples: int = 2000
    """The search inside the span (and the certificate's fit check) uses the first this many
    samples; the convex phases use all."""
    success_tol: float = 1e-3
    """A teacher is recovered when every matched Θ_i and W_i is within this relative error."""
    instances: int = 64
    """Random teachers per grid point."""
    timing_instances: int = 4
    """Teachers per cell on which each phase is timed (after the run, warm)."""
    seed: int = 0
    """Root seed: teacher i of every grid point draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
        choice("span_method", self.span_method, cl.SPAN_METHODS)
        if list(self.samples) != sorted(self.samples):
            raise ValueError(f"samples: expected increasing values, received {self.samples}")
        for h in self.heads:  # shapes and β before any work
            TeacherSpec(heads=h, dim=self.dim, tokens=self.tokens, beta=max(self.beta))
        self.learner()

    def learner(self) -> cl.ChenLiConfig:
        """The pipeline this study runs: pure mode, every span method reported."""
        return cl.ChenLiConfig(
            mode="pure",
            span_method=self.span_method,
            span_report=cl.SPAN_METHODS,
            max_rows=self.max_rows,
            qp_iterations=self.qp_iterations,
            candidates=self.candidates,
            candidate=VarProConfig(iterations=20, restarts=1, stall_tol=cl.PURE_STALL),
            search_samples=self.search_samples,
        )

    def annotations(self) -> dict[str, dict[str, Any]]:
        return {"success": {"tolerance": self.success_tol}}

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        values, key_ids = product_grid({"beta": self.beta}, self.instances)
        task = self.task(cell, values["beta"])
        res = simulate(key, task, self.learner(), len(key_ids), key_ids=key_ids, engine=engine)
        ds = results_dataset(res, {"beta": self.beta}, self.instances)
        ds = ds.drop_vars([v for v in ds.data_vars if str(v).startswith("trace_")])
        ds = ds.drop_dims("step", errors="ignore")
        recovered, accepted = ds["success"] == 1, ds["info_accepted"] == 1
        ds["false_accept"] = (accepted & ~recovered).astype(np.int8)
        ds["false_reject"] = (~accepted & recovered).astype(np.int8)
        seconds = self.phase_seconds(cell, key)
        ds["phase_seconds"] = xr.DataArray(
            [seconds[p] for p in PHASES], dims="phase", coords={"phase": list(PHASES)}
        )
        return ds

    def task(self, cell: dict[str, Any], beta) -> RegressionTask:
        teacher = TeacherSpec(heads=cell["heads"], dim=self.dim, tokens=self.tokens, beta=beta)
        return RegressionTask(
            teacher=teacher,
            samples=cell["samples"],
            test_samples=256,
            success_tol=self.success_tol,
        )

    def phase_seconds(self, cell: dict[str, Any], key: jax.Array) -> dict[str, float]:
        """Seconds per teacher of each phase (:data:`PHASES`), each phase compiled on its own
        and run on ``timing_instances`` teachers of the cell after one call that compiles it."""
        config = self.learner()
        total = np.zeros(len(PHASES))
        betas = np.resize(np.asarray(self.beta), self.timing_instances + 1)
        sample = jax.jit(lambda k, beta: self.task(cell, beta).sample(k).problem)
        for i, beta in enumerate(betas):  # the first teacher compiles every phase
            k = jax.random.fold_in(key, i)
            p = sample(k, jnp.asarray(beta, jnp.result_type(float)))
            S, t_sum_w = _timed(sum_w_phase, k, p, config)
            K, t_certify = _timed(certify_phase, k, p, S, config)
            span, t_span = _timed(span_phase, k, K, cell["heads"], config)
            _, t_search = _timed(search_phase, k, p, span.basis, span.point, K, config)
            if i > 0:
                total += (t_sum_w, t_certify, t_span, t_search)
        return dict(zip(PHASES, total / self.timing_instances, strict=True))

    def derive(self, ds):
        """``onset_<phase>`` over (heads, beta): the smallest N from which the phase's
        criterion (:data:`ONSETS`) holds at every larger N of the grid (NaN: not by the
        largest); ``onset_span_<method>`` likewise for every span method. Per teacher the
        pure mode's ``parameter_error`` ε (the larger of its largest matched Θ_i and W_i
        errors), and over (heads, beta) the power laws of the medians in N
        (:func:`mhalearn.stats.power_law_fit`, 95% bootstrap intervals over teachers):
        ``error_rate`` of ε and ``error_reach``, the N where that fit reaches ε =
        ``success_tol``; ``span_rate`` of the span estimate's angle (phase 4)."""
        samples = ds["samples"].values
        for name, criterion in ONSETS.items():
            if criterion.variable not in ds:  # a span method this Dataset predates
                continue
            value = criterion.value(ds).values
            ds[f"onset_{name}"] = (("heads", "beta"), onset(value, samples, criterion.holds))
        ds["parameter_error"] = np.maximum(ds["theta_error_max"], ds["w_error_max"])
        fits = {
            "error": ("parameter_error", self.success_tol),
            "span": ("span_angle_estimate", None),
        }
        for prefix, (variable, target) in fits.items():
            out: dict[str, np.ndarray] = {}
            values = ds[variable].transpose("heads", "beta", "samples", "instance").values
            for at in np.ndindex(values.shape[:2]):
                fit = stats.power_law_fit(samples, values[at], target, seed=self.seed)
                for key, v in fit.items():
                    out.setdefault(key, np.full(values.shape[:2], np.nan))[at] = v
            for key, v in out.items():
                ds[f"{prefix}_{key}"] = (("heads", "beta"), v)
        return ds

    def summarize(self, ds) -> str:
        onsets = [v for v in ds.data_vars if str(v).startswith("onset_")]
        table = ds[onsets].to_dataframe().to_string(float_format=lambda v: f"{v:g}")
        rates = ds[["success", "info_accepted", "false_accept", "false_reject"]]
        share = rates.mean("instance").to_dataframe().to_string(float_format="{:.3f}".format)
        names = [f"span_angle_{m}" for m in cl.SPAN_METHODS] + ["k_tilt"]
        angles = ds[[name for name in names if name in ds]]
        median = angles.median("instance").to_dataframe().to_string(float_format="{:.3f}".format)
        seconds = ds["phase_seconds"].to_series().unstack("phase").to_string()
        rates = [
            f"{p}_{k}{s}"
            for p in ("error", "span")
            for k in ("rate", "reach")
            for s in ("", "_lower", "_upper")
        ]
        rates = [r for r in rates if r in ds]
        power = ds[rates].to_dataframe()[rates].to_string(float_format=lambda v: f"{v:.3g}")
        return (
            "onset N of each phase (criteria: "
            f"{'; '.join(c.meaning for c in list(ONSETS.values())[:5])}; likewise per span "
            f"method):\n"
            f"{table}\n"
            f"pure-mode recovery, acceptance, false accepts and rejects (share of "
            f"{ds.sizes['instance']} teachers):\n{share}\n"
            f"median span angle (rad) of each method, and K's tilt at the heads:\n{median}\n"
            f"seconds per teacher of each phase:\n{seconds}\n"
            f"power laws in N of the medians (95% bootstrap intervals over teachers): error: "
            f"ε = max(largest Θ_i error, largest W_i error), reach: the N where the fit gives "
            f"ε = {self.success_tol:g} (inf: never); span: the angle of the span estimate "
            f"(phase 4):\n{power}"
        )
