"""``samples``: test loss and generalisation gap vs training samples, with the stability proxy."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from mhalearn.experiments.base import Engine
from mhalearn.experiments.classifier import ClassifierStudy, as_float


@dataclasses.dataclass(frozen=True)
class Samples(ClassifierStudy):
    """Full-batch GD for ``steps`` steps at step size ``lr`` on n training samples; the test
    loss, the generalisation gap (test − train loss) and the stability proxy (η/n)·Σ_t L̂(θ_t)
    that bounds it in Deora et al. (static grid: samples; heads swept inside)."""

    name = "samples"
    summary = "test loss, generalisation gap and stability proxy vs samples, per head count"
    static_axes = ("samples",)
    positive = ("lr",)
    headline = "test_loss"

    samples: tuple[int, ...] = (32, 64, 128, 256, 512)
    """Training samples n (one cell each)."""
    heads: tuple[int, ...] = (1, 4)
    """Head counts H, swept inside a cell (the model has max(heads) heads, the rest masked)."""
    lr: float = 1.0
    """GD step size η."""
    steps: int = 500
    """Full-batch GD steps."""
    instances: int = 4
    """Random problems (data and start) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        n = cell["samples"]
        ds = self.train(
            key,
            engine,
            {"heads": self.heads},
            n,
            max(self.heads),
            self.steps,
            lr=lambda v: as_float(self.lr),
            task_numbers=lambda v: {"active_heads": v["heads"]},
        )
        ds["gap"] = ds["test_loss"] - ds["train_loss"]
        ds["stability_proxy"] = self.lr / n * ds["info_loss_sum"]
        return ds
