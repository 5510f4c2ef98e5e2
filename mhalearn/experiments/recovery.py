"""``recovery``: Chen–Li teachers recovered by each learner, vs samples and heads."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax

from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.experiments.base import Study, register_study, results_dataset
from mhalearn.learners import LEARNERS, make_learner
from mhalearn.learners.gd import GDConfig
from mhalearn.learners.registry import describe
from mhalearn.problems import RegressionProblem
from mhalearn.restarts import default_starts, simulate_starts, single_start
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import Family, TeacherSpec


def with_iterations(config, iterations: int):
    """``config`` with ``iterations`` Levenberg–Marquardt iterations per start: its own
    ``iterations`` (variable projection), or its refinement's (the oracle); other learners
    unchanged."""
    if hasattr(config, "iterations"):
        return dataclasses.replace(config, iterations=iterations)
    if hasattr(config, "refine"):
        return dataclasses.replace(config, refine=with_iterations(config.refine, iterations))
    return config


def budget_starts(config, budget: Sequence[float]) -> list[int]:
    """The random starts at each budget: the multiplier times the learner's default starts
    (:func:`~mhalearn.restarts.default_starts`: its ``restarts``, else one), rounded, at
    least 1."""
    return [max(1, round(b * default_starts(config))) for b in budget]


def describe_learner(name: str, config, starts: Sequence[int] = ()) -> str:
    """What learner ``name`` runs in a study with the config ``config`` of one start (a
    gradient learner's stop at its ``tol`` when it stops early), and the ``starts`` of each
    budget."""
    label = f"{name}: {describe(name, single_start(config))}"
    if isinstance(config, GDConfig) and config.tol > 0:
        label += f", stops at training loss ≤ {float(config.tol):g}"
    if starts:
        label += f"; up to {'/'.join(map(str, starts))} starts (a new one only while none fits)"
    return label


def check_regression_learners(names: tuple[str, ...], steps: int) -> None:
    """Every name is a registered learner that fits regression problems (ValueError if not)."""
    for name in names:
        choice("learner", name, tuple(LEARNERS))
        if RegressionProblem not in make_learner(name, steps).problems:
            raise ValueError(f"learner {name!r} does not fit regression problems")


@register_study
@dataclasses.dataclass(frozen=True)
class Recovery(Study):
    """Success rate, parameter and prediction errors of each learner on the same random
    teachers, vs training samples and heads (static grid: learner × samples × heads)."""

    name = "recovery"
    summary = "Chen–Li teachers recovered by each learner: learner × samples × heads"
    static_axes = ("learner", "samples", "heads")
    headline = "success"
    positive = ("success_tol", "budget")
    precision = "float64"  # variable projection and the pipeline need it (NaN in float32)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            learner=("adam", "uniform"),
            samples=(40, 60),
            heads=(1, 2),
            dim=4,
            tokens=3,
            steps=20,
            instances=2,
        ),
        "small": dict(
            learner=("adam", "varpro"),
            samples=(40, 80),
            heads=(1, 2),
            dim=4,
            tokens=3,
            steps=30,
            instances=2,
        ),
        "full": dict(
            learner=("adam", "varpro", "chen_li", "uniform", "oracle"),
            samples=(100, 300, 1000),
            heads=(1, 2, 3),
            dim=6,
            tokens=4,
            steps=1000,
            instances=12,
        ),
        # the hard teacher families of notebook 02 (family and tokens set per family)
        "hard_small": dict(
            learner=("varpro",), samples=(80,), heads=(2,), dim=4, tokens=3, steps=30, instances=2
        ),
        "hard_full": dict(
            learner=("adam", "varpro", "chen_li"),
            samples=(300, 1000),
            heads=(2,),
            dim=6,
            tokens=4,
            steps=1000,
            instances=12,
        ),
    }

    learner: tuple[str, ...] = ("adam", "varpro", "chen_li", "uniform")
    """Learners to compare (one cell each), by registered name (mhalearn list shows them);
    every one sees the same teachers and samples."""
    samples: tuple[int, ...] = (100, 400)
    """Training examples N per teacher (one cell each)."""
    heads: tuple[int, ...] = (1, 2)
    """Heads m of teacher and student (one cell each)."""
    dim: int = 6
    """Token dimension d."""
    tokens: int = 4
    """Sequence length k."""
    beta: float = 4.0
    """Teacher attention scale: ‖Θ_i‖_F ≈ beta (1: near-uniform attention, 8: near-hard)."""
    family: Family = "random"
    """Teacher family: random draws, or a stress family that breaks a non-degeneracy check."""
    steps: int = 500
    """GD and Adam iterations per start (the other learners have their own budgets)."""
    iterations: int | None = None
    """Levenberg–Marquardt iterations per start of variable projection (``varpro``, and the
    oracle's refinement); unset (None): the learner's own (varpro: 20)."""
    budget: float = 1.0
    """Random starts, as a multiple of each learner's default (varpro: 2, the others: 1;
    rounded, at least 1), run as rounds over the teachers no start has fitted yet."""
    success_tol: float = 1e-3
    """A teacher is recovered when every matched Θ_i and W_i is within this relative error."""
    instances: int = 8
    """Random teachers per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
        check_regression_learners(self.learner, self.steps)
        for h in self.heads:  # validates shapes, family, beta before any work
            self.teacher(h)

    def teacher(self, heads: int) -> TeacherSpec:
        return TeacherSpec(
            heads=heads, dim=self.dim, tokens=self.tokens, beta=self.beta, family=self.family
        )

    def annotations(self) -> dict[str, dict[str, Any]]:
        return {"success": {"tolerance": self.success_tol}}

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        task = RegressionTask(
            teacher=self.teacher(cell["heads"]),
            samples=cell["samples"],
            test_samples=256,
            success_tol=self.success_tol,
        )
        learner = self.learner_config(cell["learner"])
        (starts,) = budget_starts(learner, (self.budget,))
        (res,) = simulate_starts(key, task, learner, self.instances, starts, engine=engine)
        return results_dataset(res, {}, self.instances)

    def learner_config(self, name: str):
        """The config of one start of learner ``name``: the study's steps and iterations."""
        config = make_learner(name, self.steps)
        return config if self.iterations is None else with_iterations(config, self.iterations)
