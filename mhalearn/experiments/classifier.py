"""What the classifier studies (``heads``, ``stepsize``, ``samples``, ``margin``) share: the
tokenized mixture of Deora et al. (reconstructed), the model family and the full-batch
optimiser (GD by default)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import numpy as np

from mhalearn.batch import Engine
from mhalearn.data import MixtureSpec
from mhalearn.experiments.base import Study, product_grid, results_dataset
from mhalearn.kernels import ClassifierSpec, HeadScaling
from mhalearn.learners.gd import GDConfig, OptimizerName
from mhalearn.simulate import simulate
from mhalearn.tasks import ClassificationTask


@dataclasses.dataclass(frozen=True)
class ClassifierStudy(Study):
    """Mixture and model options shared by the classifier studies."""

    counts_from_zero = ("decoys",)

    tokens: int = 4
    """Sequence length T."""
    dim: int = 8
    """Token dimension d."""
    relevant_fraction: float = 0.25
    """Share ζ of positions whose tokens carry the label's mean."""
    irrelevant_means: int = 2
    """Number M of label-free means the other positions draw from."""
    decoys: int = 0
    """Positions carrying the other label's mean (= the relevant count: the token average is
    label-free, so the mean-pooled model at W = 0 is at chance)."""
    positions: Literal["random", "fixed"] = "random"
    """Relevant positions drawn per sample (random) or the same for every sample (fixed)."""
    head_scaling: HeadScaling = "sqrt"
    """α_H: 1/√H (sqrt), 1/H (mean) or 1 (sum)."""
    test_samples: int = 512
    """Fresh samples for the test loss and error."""

    noise: float = 0.5
    """Token noise level σ of the mixture (larger: harder)."""
    optimizer: OptimizerName = "gd"
    """Full-batch optimiser: gd, momentum (heavy ball 0.9), adam or normalized_gd."""

    def __post_init__(self):
        super().__post_init__()
        for noise in np.atleast_1d(self.noise):
            self.mixture(float(noise))
        ClassifierSpec(head_scaling=self.head_scaling)

    def mixture(self, noise: float) -> MixtureSpec:
        return MixtureSpec(
            tokens=self.tokens,
            dim=self.dim,
            relevant_fraction=self.relevant_fraction,
            irrelevant_means=self.irrelevant_means,
            decoys=self.decoys,
            positions=self.positions,
            noise=noise,
        )

    def task(self, samples: int, heads: int, noise: float, **numbers: Any) -> ClassificationTask:
        """``heads``: the model's (largest) head count; ``numbers``: per-instance leaves
        (``active_heads``, ``start``, ...)."""
        return ClassificationTask(
            mixture=self.mixture(noise),
            model=ClassifierSpec(head_scaling=self.head_scaling),
            heads=heads,
            samples=samples,
            test_samples=self.test_samples,
            **numbers,
        )

    def train(
        self,
        key: jax.Array,
        engine: Engine,
        axes: dict[str, Any],
        samples: int,
        heads: int,
        steps: int,
        lr: Any,
        snapshots: int = 20,
        log_every: int | None = None,
        task_numbers=None,
        noise: float | None = None,
        tol: float = 0.0,
    ):
        """Full-batch GD on every point of the vmapped ``axes`` × instances in one compilation;
        ``lr`` and ``task_numbers`` map the flat grid values (a dict) to per-instance leaves;
        ``tol`` > 0 stops each run once its training loss is at most ``tol``."""
        values, key_ids = product_grid(axes, self.instances)
        numbers = task_numbers(values) if task_numbers else {}
        task = self.task(samples, heads, self.noise if noise is None else noise, **numbers)
        learner = self.learner(steps, lr(values), snapshots, log_every, tol)
        res = simulate(key, task, learner, len(key_ids), key_ids=key_ids, engine=engine)
        return results_dataset(res, axes, self.instances)

    def learner(
        self,
        steps: int,
        lr: Any = 1.0,
        snapshots: int = 20,
        log_every: int | None = None,
        tol: float = 0.0,
    ) -> GDConfig:
        """The studies' full-batch optimiser (its start is the same for every step count and
        step size: :meth:`~mhalearn.learners.gd.GDConfig.start`), stopping at training loss
        ``tol`` when it is > 0."""
        return GDConfig(
            optimizer=self.optimizer,
            steps=steps,
            lr=lr,
            snapshots=snapshots,
            log_every=log_every,
            tol=tol,
        )


def as_float(a) -> np.ndarray:
    return np.asarray(a, dtype=float)
