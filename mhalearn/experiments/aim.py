"""``aim``: the attention-indexed model of Boncoraglio et al. (:mod:`mhalearn.solvable.aim`)
learned by full-batch Adam, as its authors train it: the error ‖S − S*‖²_F/D against the
sample ratio α = n/D², per dimension D, token count T and rank ratio ρ."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from mhalearn.experiments.base import register_study
from mhalearn.experiments.solvable import SolvableStudy
from mhalearn.learners.gd import GDConfig
from mhalearn.solvable import AIMTask

#: the authors' grid of α (``GD_softmax_averaged.py``): 32 values log-spaced over [0.0012, 0.3]
AUTHORS_ALPHAS = tuple(float(a) for a in np.logspace(np.log10(0.0012), np.log10(0.3), 32))


@register_study
@dataclasses.dataclass(frozen=True)
class AIM(SolvableStudy):
    """Adam's error on the attention-indexed model vs α (static grid: alpha × dim × tokens ×
    rho, one compiled cell each: n = ⌊α·D²⌋ sets the shapes). The learner is the authors':
    full-batch Adam at learning rate ``lr`` for ``steps`` steps on the summed loss, from
    W ~ N(0, ``init_scale``²)."""

    name = "aim"
    summary = "the attention-indexed model: Adam's error ‖S − S*‖²/D vs α = n/D²"
    static_axes = ("alpha", "dim", "tokens", "rho")
    headline = "mse"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(alpha=(0.05, 0.5), dim=(8,), steps=40, instances=2),
        "small": dict(alpha=(0.02, 0.1, 0.3), dim=(20,), steps=300, instances=4),
        # notebook 11: the authors' 32 α at D 40 and 60 (their D 200 costs ~1.5 TFLOP a fit)
        "full": dict(alpha=AUTHORS_ALPHAS, dim=(40, 60), instances=64),
    }

    alpha: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    """Sample ratios α = n/D² (one cell each; n = ⌊α·D²⌋ as the authors round it)."""
    dim: tuple[int, ...] = (40,)
    """Token dimensions D (one cell each; the authors' is 200)."""
    tokens: tuple[int, ...] = (2,)
    """Tokens T per sequence (one cell each)."""
    rho: tuple[float, ...] = (0.5,)
    """Rank ratios ρ = R/D of the teacher and the student (one cell each)."""
    lr: float = 0.1
    """Adam's learning rate (the authors': 0.1)."""
    steps: int = 1000
    """Full-batch Adam steps (the authors': 1000)."""
    init_scale: float = 1.0
    """The student's start W ~ N(0, init_scale²) (the authors': 1)."""
    instances: int = 64
    """Random teachers (and data) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def task(self, cell: dict[str, Any]) -> AIMTask:
        return AIMTask(
            dim=cell["dim"],
            tokens=cell["tokens"],
            alpha=cell["alpha"],
            rho=cell["rho"],
            init_scale=self.init_scale,
        )

    def learner(self) -> GDConfig:
        return GDConfig(optimizer="adam", lr=self.lr, steps=self.steps)
