"""``attention_phase``: the positional–semantic model of Cui et al.
(:mod:`mhalearn.solvable.positional`) learned from the positional and the semantic start, as
its authors train it: test error, training loss and the overlaps m and θ against α = n/d,
per ω and d. Where the two starts' training losses cross, the global minimum switches from
the positional to the semantic solution."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import numpy as np

from mhalearn import stats
from mhalearn.experiments.base import register_study
from mhalearn.experiments.solvable import SolvableStudy
from mhalearn.learners.gd import GDConfig
from mhalearn.solvable import PositionalSemanticTask
from mhalearn.variables import Meta, register_variables

Start = Literal["positional", "semantic", "random"]
#: the authors' grid of α (their runs' ``--alphas 0.01 2.0 25``): 25 values, linspace
AUTHORS_ALPHAS = tuple(round(float(a), 6) for a in np.linspace(0.01, 2.0, 25))

register_variables(
    {
        "loss_gap": Meta(
            "training-loss gap, semantic − positional",
            "The semantic start's final training loss minus the positional start's, on the same "
            "teacher and sequences: negative where the semantic fit is the lower minimum.",
        ),
        "crossing_alpha": Meta(
            "α where the global minimum switches",
            "The α where the mean loss_gap over instances last changes sign (beyond it the "
            "semantic minimum stays the lower on the grid; interpolated linearly between grid "
            "points), with a 95% bootstrap interval over instances "
            "(NaN where it does not change sign on the grid, or too many replicates do not).",
        ),
    }
)


@register_study
@dataclasses.dataclass(frozen=True)
class AttentionPhase(SolvableStudy):
    """The tied attention student of the positional–semantic model vs α (static grid: init ×
    alpha × omega × dim, one compiled cell each). The learner is the authors': full-batch
    gradient descent at learning rate ``lr`` for ``steps`` steps on the summed loss with
    weight decay ``lmbda``, from the positional start (Q = 1/√d) or the semantic one (Q = Q*)."""

    name = "attention_phase"
    summary = "positional vs semantic attention: test error, loss, m and θ vs α = n/d"
    static_axes = ("init", "alpha", "omega", "dim")
    headline = "test_error"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(alpha=(0.5, 2.0), dim=(16,), steps=40, test_samples=64, instances=2),
        "small": dict(alpha=(0.2, 1.0, 2.0), dim=(100,), steps=1000, instances=4),
        # notebook 12: every third α of the authors' grid (0.01 to 2, 25 values) at d 200
        "full": dict(alpha=AUTHORS_ALPHAS[::3], dim=(200,), instances=64),
    }

    init: tuple[Start, ...] = ("positional", "semantic")
    """Starts (one cell each): positional (Q = 1/√d), semantic (Q = Q*, the informed start)
    or random (Q ~ 0.1·N(0, 1))."""
    alpha: tuple[float, ...] = (0.2, 1.0, 2.0)
    """Sample ratios α = n/d (one cell each; n = round(α·d))."""
    omega: tuple[float, ...] = (0.3,)
    """Weights ω of the positional map A in the teacher (one cell each)."""
    dim: tuple[int, ...] = (100,)
    """Token dimensions d (one cell each; the authors' is 1000)."""
    sigma: float = 0.5
    """The semantic parts' standard deviation σ."""
    lmbda: float = 0.01
    """Weight decay λ on Q (the authors' 0.01)."""
    lr: float = 0.15
    """Gradient descent's learning rate (the authors': 0.15)."""
    steps: int = 5000
    """Full-batch gradient-descent steps (the authors': 5000)."""
    test_samples: int = 10_000
    """Fresh sequences for the test error (the authors': 50 000)."""
    instances: int = 64
    """Random teachers (and data) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def task(self, cell: dict[str, Any]) -> PositionalSemanticTask:
        return PositionalSemanticTask(
            dim=cell["dim"],
            alpha=cell["alpha"],
            omega=cell["omega"],
            sigma=self.sigma,
            lmbda=self.lmbda,
            start=cell["init"],
            test_samples=self.test_samples,
        )

    def learner(self) -> GDConfig:
        return GDConfig(optimizer="gd", lr=self.lr, steps=self.steps)

    def derive(self, ds):
        """With both the positional and the semantic start: ``loss_gap`` per instance (their
        paired final training losses: every cell draws the same teachers and sequences) and
        ``crossing_alpha`` per ω and d, where its mean over instances last changes sign, with a
        bootstrap interval (:func:`~mhalearn.stats.crossing_interval`, 1000 resamples)."""
        if not {"positional", "semantic"} <= set(ds["init"].values.tolist()):
            return ds
        loss = ds["train_loss"]
        ds["loss_gap"] = loss.sel(init="semantic", drop=True) - loss.sel(
            init="positional", drop=True
        )
        gap = ds["loss_gap"].transpose("omega", "dim", "alpha", "instance").values
        found = stats.crossing_interval(ds["alpha"].values, gap, replicates=1000, seed=self.seed)
        for suffix, value in zip(("", "_lower", "_upper"), found, strict=True):
            ds[f"crossing_alpha{suffix}"] = (("omega", "dim"), value)
        return ds
