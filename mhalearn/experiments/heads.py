"""``heads``: classifier training and test loss vs step, per head count and step size."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from mhalearn.batch import Engine
from mhalearn.experiments.base import register_study
from mhalearn.experiments.classifier import ClassifierStudy, as_float


@register_study
@dataclasses.dataclass(frozen=True)
class Heads(ClassifierStudy):
    """Full-batch GD on the tokenized mixture: the training loss, training error and test
    loss along training for every head count, step size and noise level; one compilation
    per noise level (static grid: noise; heads and step size swept inside)."""

    name = "heads"
    summary = "classifier train/test loss vs step: noise × heads × step size"
    static_axes = ("noise",)
    positive = ("lr",)
    headline = "test_loss"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            heads=(1, 2),
            lr=(0.3, 1.0),
            noise=(0.5, 1.0),
            samples=16,
            steps=10,
            instances=2,
            test_samples=16,
        ),
        "small": dict(
            heads=(1, 4),
            lr=(1.0,),
            noise=(0.5, 1.5),
            samples=32,
            steps=30,
            instances=2,
            test_samples=64,
        ),
        "full": dict(
            heads=(1, 2, 4, 8, 16),
            lr=(0.3, 3.0),
            noise=(0.5, 1.5),
            samples=128,
            steps=1000,
            instances=64,
        ),
        # parameter movement vs heads (notebook 07)
        "movement_small": dict(
            heads=(1, 4), lr=(1.0,), samples=32, steps=20, instances=2, test_samples=64
        ),
        "movement_full": dict(
            heads=(1, 2, 4, 8, 16, 32), lr=(1.0,), samples=128, steps=1000, instances=64
        ),
        # attention on the relevant positions along training (notebook 08)
        "relevant_small": dict(
            heads=(1, 4),
            lr=(1.0,),
            noise=(0.5,),
            samples=32,
            steps=30,
            instances=2,
            test_samples=64,
        ),
        "relevant_full": dict(
            heads=(1, 2, 4, 8), lr=(1.0,), noise=(0.5, 1.5), samples=128, steps=3000, instances=64
        ),
    }

    heads: tuple[int, ...] = (1, 2, 4, 8)
    """Head counts H, swept inside a cell (the model has max(heads) heads, the rest masked)."""
    lr: tuple[float, ...] = (0.3, 1.0, 3.0)
    """GD step sizes η, swept inside a cell."""
    noise: tuple[float, ...] = (0.5,)  # type: ignore[assignment]  # a grid here
    """Token noise levels (one cell each): e.g. 0.5 (easy) and 1.5 (hard)."""
    samples: int = 128
    """Training samples n."""
    steps: int = 1000
    """Full-batch GD steps."""
    instances: int = 4
    """Random problems (data and start) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        return self.train(
            key,
            engine,
            {"heads": self.heads, "lr": self.lr},
            self.samples,
            max(self.heads),
            self.steps,
            lr=lambda v: as_float(v["lr"]),
            task_numbers=lambda v: {"active_heads": v["heads"]},
            noise=cell["noise"],
        )
