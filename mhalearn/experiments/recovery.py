"""``recovery``: Chen–Li teachers recovered by each learner, vs samples and heads."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax

from mhalearn.experiments.base import Engine, Study, results_dataset
from mhalearn.learners.baselines import AlternatingConfig, OracleConfig, UniformConfig
from mhalearn.learners.chen_li import ChenLiConfig
from mhalearn.learners.gd import GDConfig
from mhalearn.learners.varpro import VarProConfig
from mhalearn.simulate import simulate
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import Family, TeacherSpec

Learner = Literal["gd", "adam", "varpro", "chen_li", "uniform", "alternating", "oracle"]


def learner_configs(steps: int = 1000) -> dict[str, Any]:
    """The learners the recovery study and benchmark compare, by name (``steps``: GD and Adam
    iterations; the other learners have their own budgets)."""
    return {
        "gd": GDConfig(optimizer="gd", steps=steps, lr=0.3, snapshots=8),
        "adam": GDConfig(optimizer="adam", steps=steps, lr=1e-2, snapshots=8),
        "varpro": VarProConfig(iterations=20, restarts=2),
        "chen_li": ChenLiConfig(candidates=2, span_subsets=4, qp_iterations=600),
        "uniform": UniformConfig(),
        "alternating": AlternatingConfig(rounds=25, inner_steps=20),
        "oracle": OracleConfig(),
    }


@dataclasses.dataclass(frozen=True)
class Recovery(Study):
    """Success rate, parameter and prediction errors of each learner on the same random
    teachers, vs training samples and heads (static grid: learner × samples × heads)."""

    name = "recovery"
    summary = "Chen–Li teachers recovered by each learner: learner × samples × heads"
    static_axes = ("learner", "samples", "heads")
    headline = "success"
    precision = "float64"  # variable projection and the pipeline need it (NaN in float32)

    learner: tuple[Learner, ...] = ("adam", "varpro", "chen_li", "uniform")
    samples: tuple[int, ...] = (100, 400)
    heads: tuple[int, ...] = (1, 2)
    dim: int = 6
    tokens: int = 4
    beta: float = 4.0
    family: Family = "random"
    steps: int = 500
    """GD and Adam iterations."""
    instances: int = 8
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        for h in self.heads:  # validates shapes, family, beta before any work
            self.teacher(h)

    def teacher(self, heads: int) -> TeacherSpec:
        return TeacherSpec(
            heads=heads, dim=self.dim, tokens=self.tokens, beta=self.beta, family=self.family
        )

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        task = RegressionTask(
            teacher=self.teacher(cell["heads"]), samples=cell["samples"], test_samples=256
        )
        learner = learner_configs(self.steps)[cell["learner"]]
        res = simulate(key, task, learner, self.instances, **engine.simulate_kwargs())
        return results_dataset(res, {}, self.instances)
