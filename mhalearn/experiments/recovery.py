"""``recovery``: Chen–Li teachers recovered by each learner, vs samples and heads."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from mhalearn import plots
from mhalearn._validate import choice
from mhalearn.batch import Engine
from mhalearn.experiments.base import Study, register_study, results_dataset
from mhalearn.learners import LEARNERS, learner_label, make_learner
from mhalearn.problems import RegressionProblem
from mhalearn.simulate import simulate
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import Family, TeacherSpec


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
    positive = ("success_tol",)
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
    """GD and Adam iterations (the other learners have their own budgets)."""
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
        learner = make_learner(cell["learner"], self.steps)
        res = simulate(key, task, learner, self.instances, **engine.kwargs())
        return results_dataset(res, {}, self.instances)

    @staticmethod
    def figure(ds):
        """Success rate (Wilson 95% bars) and median squared normalised prediction error (IQR
        band) vs samples, a curve per learner, a column per head count."""
        config = plots.config_of(ds)
        heads, learners = ds["heads"].values, ds["learner"].values
        fig, axes = plots.panels(2, len(heads))
        n = ds["samples"].values
        for j, h in enumerate(heads):
            cell = ds.sel(heads=h)
            for i, learner in enumerate(learners):
                one = cell.sel(learner=learner)
                label = learner_label(str(learner), config.get("steps", Recovery.steps))
                kw = {"label": label, "shift": plots.shift(i, len(learners)), **plots.style(i)}
                plots.rate(axes[0, j], one["success"], "samples", **kw)
                plots.band(axes[1, j], one["prediction_error"], "samples", **kw)
            axes[0, j].set(title=f"heads m = {h}", ylabel="share of teachers recovered")
            axes[0, j].set_ylim(-0.05, 1.05)
            axes[1, j].set(ylabel=plots.label_of(ds, "prediction_error"))
            axes[1, j].set_yscale("log")
            for ax in axes[:, j]:
                plots.values_axis(ax, n, plots.LABELS["samples"])
        n_inst = plots.instances(ds)
        tol = ds["success"].attrs.get("tolerance", config.get("success_tol", "?"))
        caption = (
            f"Top: share of the {n_inst} teachers per point recovered (every matched Θ_i "
            f"and W_i within relative Frobenius error {tol:g}), bars: Wilson 95% interval. Bottom: "
            f"median over the {n_inst} teachers of Σ‖F̂(X) − F(X)‖²_F / Σ‖F(X)‖²_F on fresh "
            "inputs, band: interquartile range. Every learner sees the same teachers and samples; "
            "curves are shifted slightly along N so that coinciding ones stay visible."
        )
        title = "Recovering Chen–Li teachers: " + plots.settings(
            ds, ("dim", "tokens", "beta", "family")
        )
        return plots.finish(fig, title, caption)
