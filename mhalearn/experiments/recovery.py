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


def learner_label(name: str, config: dict[str, Any] | None = None) -> str:
    """What learner ``name`` of the recovery study runs, with its budget (``config``: the
    study's config, for the GD and Adam step count)."""
    steps = (config or {}).get("steps", Recovery.steps)
    c = learner_configs(steps)[name]
    if isinstance(c, GDConfig):
        optimizer = {"gd": "GD", "adam": "Adam"}.get(str(c.optimizer), str(c.optimizer))
        return f"{name}: {optimizer}, lr {float(c.lr):g}, {c.steps} steps"
    if isinstance(c, VarProConfig):
        return f"{name}: VarPro-LM, {c.iterations} it. × {c.restarts} random starts"
    if isinstance(c, ChenLiConfig):
        return (
            f"{name}: certify-and-sculpt (phases 1–5), {c.candidates} candidates, then a "
            f"{c.polish.iterations}-it. VarPro polish"
        )
    if isinstance(c, AlternatingConfig):
        return f"{name}: LS for W, Adam on Θ, {c.rounds} × {c.inner_steps} steps"
    if isinstance(c, OracleConfig):
        return (
            f"{name}: VarPro-LM from the teacher ±{float(c.perturbation):g}, "
            f"{c.refine.iterations} it."
        )
    return f"{name}: uniform attention, least-squares W (a floor)"


@dataclasses.dataclass(frozen=True)
class Recovery(Study):
    """Success rate, parameter and prediction errors of each learner on the same random
    teachers, vs training samples and heads (static grid: learner × samples × heads)."""

    name = "recovery"
    summary = "Chen–Li teachers recovered by each learner: learner × samples × heads"
    static_axes = ("learner", "samples", "heads")
    headline = "success"
    positive = ("success_tol",)
    precision = "float64"  # variable projection and the pipeline need it (NaN in float32)

    learner: tuple[Learner, ...] = ("adam", "varpro", "chen_li", "uniform")
    """Learners to compare (one cell each); every one sees the same teachers and samples."""
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
    """GD and Adam iterations (the other learners have their own budgets)."""
    success_tol: float = 1e-3
    """A teacher is recovered when every matched Θ_i and W_i is within this relative error."""
    instances: int = 8
    """Random teachers per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
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
        learner = learner_configs(self.steps)[cell["learner"]]
        res = simulate(key, task, learner, self.instances, **engine.simulate_kwargs())
        return results_dataset(res, {}, self.instances)
