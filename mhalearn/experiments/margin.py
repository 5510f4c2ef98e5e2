"""``margin``: the NTK margin at initialisation, per initialisation and head count."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import numpy as np

from mhalearn.experiments.base import Engine, grid_dataset, product_grid
from mhalearn.experiments.classifier import ClassifierStudy
from mhalearn.metrics import theory

Init = Literal["zero", "gaussian", "one_step"]
#: (w_init, one_step) of each initialisation: W = 0; W Gaussian of scale 1/dim; one GD step
#: of size ``one_step_lr`` from W = 0.
_INITS = {"zero": (0.0, 0.0), "gaussian": (1.0, 0.0), "one_step": (0.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class Margin(ClassifierStudy):
    """γ of the hard-margin SVM on the NTK Gram matrix of the n training samples at θ₀
    (features ∂Φ/∂(U, W) of the active heads), with the ``separable`` flag, for every
    initialisation and head count in one compilation."""

    name = "margin"
    summary = "NTK margin at initialisation: init × heads"
    static_axes = ()
    headline = "margin"

    init: tuple[Init, ...] = ("zero", "gaussian", "one_step")
    """Initialisations: W = 0, W Gaussian, or one GD step of size one_step_lr from W = 0."""
    heads: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Head counts H (the model has max(heads) heads, the rest masked)."""
    samples: int = 64
    """Training samples n."""
    one_step_lr: float = 1.0
    """η₀ of the one-step initialisation."""
    svm_iterations: int = 3000
    """Iterations of the SVM dual solver."""
    instances: int = 4
    """Random problems (data and start) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        axes = {"init": self.init, "heads": self.heads}
        values, key_ids = product_grid(axes, self.instances)
        w_init = np.array([_INITS[i][0] for i in values["init"]])
        one_step = np.array([_INITS[i][1] for i in values["init"]]) * self.one_step_lr
        per = {"active": values["heads"], "w_init": w_init, "one_step": one_step}
        task = self.task(self.samples, max(self.heads), self.noise)
        iterations = self.svm_iterations

        def one(key, per, task):
            task = dataclasses.replace(
                task, active_heads=per["active"], w_init=per["w_init"], one_step=per["one_step"]
            )
            k_problem, k_init = jax.random.split(key)
            _, problem = task.sample(k_problem)
            params = problem.init(k_init)
            features = theory.ntk_features(params, problem.X, problem.spec, problem.head_mask())
            m = theory.svm_margin(theory.ntk_gram(features["all"]), problem.y, iterations)
            return {"margin": m.margin, "separable": m.separable}

        out = engine.map(one, key, key_ids, per, task)
        return grid_dataset(out, axes, self.instances)
