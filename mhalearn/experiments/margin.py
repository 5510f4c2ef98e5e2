"""``margin``: the NTK margin at initialisation, per initialisation and head count."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import jax
import numpy as np

from mhalearn.batch import Engine
from mhalearn.experiments.base import product_grid, register_study, results_dataset
from mhalearn.experiments.classifier import ClassifierStudy
from mhalearn.metrics import theory
from mhalearn.problems import ClassifierStart
from mhalearn.simulate import InstanceKeys, measure
from mhalearn.variables import Meta, register_variables

#: the NTK-margin study's own variables
register_variables(
    {
        "margin": Meta(
            "NTK margin γ at θ₀",
            "γ = 1/√(Σα*) of the hard-margin SVM dual on the NTK Gram matrix (0: not separable).",
        ),
        "separable": Meta(
            "NTK-separable",
            "1 when the SVM solver certified the NTK features as linearly separable.",
            flag=True,
        ),
        "margin_u": Meta(
            "NTK margin γ at θ₀, readout features only",
            "γ of the hard-margin SVM on the Gram matrix of ∂Φ/∂U alone (0: not separable).",
        ),
        "separable_u": Meta(
            "separable by the readout's NTK features",
            "1 when the SVM solver certified the features ∂Φ/∂U as linearly separable.",
            flag=True,
        ),
    }
)

Init = Literal["zero", "gaussian", "one_step"]
#: (w_init, one_step) of each initialisation: W = 0; W Gaussian of scale 1/dim; one GD step
#: of size ``one_step_lr`` from W = 0.
_INITS = {"zero": (0.0, 0.0), "gaussian": (1.0, 0.0), "one_step": (0.0, 1.0)}


#: the mixture with one decoy at position 1 behind the relevant position 0
_DECOY: dict[str, Any] = dict(decoys=1, positions="fixed")


@register_study
@dataclasses.dataclass(frozen=True)
class Margin(ClassifierStudy):
    """γ of the hard-margin SVM on the NTK Gram matrix of the n training samples at θ₀ (the
    optimiser's start; features ∂Φ/∂(U, W) of the active heads), with the ``separable`` flag,
    and the same for the U-part features ∂Φ/∂U alone (``margin_u``, ``separable_u``: at W = 0
    the mean-pooled linear model), for every initialisation and head count in one
    compilation. The ``decoy`` presets use the mixture with decoys (the token average is
    label-free, :class:`~mhalearn.data.MixtureSpec`), where W = 0's U-part cannot separate."""

    name = "margin"
    summary = "NTK margin at initialisation: init × heads"
    static_axes = ()
    headline = "margin"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(heads=(1, 2), samples=16, svm_iterations=50, instances=2, test_samples=16),
        "small": dict(heads=(1, 4), samples=16, svm_iterations=100, instances=2, test_samples=64),
        "full": dict(heads=(1, 2, 4, 8, 16, 32, 64), samples=64, instances=64),
        "decoy_small": dict(
            heads=(1, 4),
            samples=16,
            svm_iterations=100,
            instances=2,
            test_samples=64,
            **_DECOY,
        ),
        "decoy_full": dict(heads=(1, 2, 4, 8, 16, 32, 64), samples=64, instances=64, **_DECOY),
    }

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
        task = self.task(
            self.samples,
            max(self.heads),
            self.noise,
            active_heads=values["heads"],
            start=ClassifierStart(w_init=w_init, one_step=one_step),
        )
        spec = {"task": task, "learner": self.learner(steps=1)}
        iterations = self.svm_iterations

        def one(keys: InstanceKeys, spec):
            _, problem = spec["task"].sample(keys.problem)
            params = spec["learner"].start(keys.fit, problem)
            features = theory.ntk_features(params, problem.X, problem.spec, problem.head_mask())
            metrics = {}
            for part, suffix in (("all", ""), ("U", "_u")):
                m = theory.svm_margin(theory.ntk_gram(features[part]), problem.y, iterations)
                metrics |= {f"margin{suffix}": m.margin, f"separable{suffix}": m.separable}
            return {"metrics": metrics}

        res = measure(key, one, spec, len(key_ids), key_ids=key_ids, engine=engine)
        return results_dataset(res, axes, self.instances)
