"""``samples``: test loss and generalisation gap vs training samples, with the stability proxy."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import numpy as np

from mhalearn import stats
from mhalearn.batch import Engine
from mhalearn.experiments.base import register_study
from mhalearn.experiments.classifier import ClassifierStudy, as_float
from mhalearn.metrics import theory
from mhalearn.variables import Meta, register_variables

#: the generalisation study's own variables
register_variables(
    {
        "gap": Meta("generalisation gap", "Test loss minus training loss.", "nats"),
        "stability_proxy": Meta(
            "stability proxy (η/n)·Σ_t L̂(θ_t)",
            "Step size over samples times the sum of training losses over the steps.",
            "nats",
        ),
        "proxy_bounds_gap": Meta(
            "stability proxy bounds the gap",
            "1 when the generalisation gap is at most the stability proxy (η/n)·Σ_t L̂(θ_t).",
            flag=True,
        ),
        "test_loss_slope": Meta(
            "fitted slope of the test loss in n",
            "Least-squares slope of log(median test loss) vs log n over the sample sizes "
            "(theory under separability: −1); bounds: 95% bootstrap interval over instances.",
        ),
    }
)


@register_study
@dataclasses.dataclass(frozen=True)
class Samples(ClassifierStudy):
    """Full-batch GD at step size ``lr`` on n training samples until the training loss is at
    most ``target_loss`` (within a budget of ``steps``; ``target_loss = 0``: exactly ``steps``
    steps), so that optimisation error does not set the test loss's floor; the test loss,
    the generalisation gap (test − train loss) and the stability proxy (η/n)·Σ_t L̂(θ_t) that
    bounds it in Deora et al., per instance ``proxy_bounds_gap`` (gap ≤ proxy), and per head
    count the log–log slope of the median test loss vs n with a bootstrap interval
    (``test_loss_slope``; theory: −1 under separability). Static grid: samples; heads swept
    inside."""

    name = "samples"
    summary = "test loss, generalisation gap and stability proxy vs samples, per head count"
    static_axes = ("samples",)
    positive = ("lr",)
    headline = "test_loss"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            samples=(8, 16, 32),
            heads=(1, 2),
            steps=40,
            target_loss=0.2,
            instances=2,
            test_samples=16,
        ),
        "small": dict(
            samples=(16, 32, 64),
            heads=(1, 4),
            steps=100,
            target_loss=0.01,
            instances=2,
            test_samples=64,
        ),
        # target 1e-4: an order below the test loss at every n (so the gap, not the
        # optimisation error, sets the test loss); η = 4 lies below the lower quartile of the
        # largest stable step (10–12 at every H, n = 128, notebook 05)
        "full": dict(
            samples=(32, 64, 128, 256), heads=(1, 4), lr=4.0, target_loss=1e-4, instances=64
        ),
    }

    samples: tuple[int, ...] = (32, 64, 128, 256, 512)
    """Training samples n (one cell each)."""
    heads: tuple[int, ...] = (1, 4)
    """Head counts H, swept inside a cell (the model has max(heads) heads, the rest masked)."""
    lr: float = 1.0
    """GD step size η."""
    steps: int = 20000
    """Full-batch GD steps: the budget for reaching target_loss (or the count, without one)."""
    target_loss: float = 1e-3
    """Training stops once the training loss is at most this (0: after exactly steps steps)."""
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
            tol=self.target_loss,
        )
        ds["stability_proxy"] = theory.stability_proxy(self.lr, n, ds["info_loss_sum"])
        ds["proxy_bounds_gap"] = (ds["gap"] <= ds["stability_proxy"]).astype(np.int8)
        return ds

    def derive(self, ds):
        """The fitted slope of the median test loss vs n per head count, with its interval."""
        n = ds["samples"].values
        fits = [
            stats.loglog_slope(n, ds["test_loss"].sel(heads=h).transpose("samples", "instance"))
            for h in ds["heads"].values
        ]
        for field, suffix in (("value", ""), ("lower", "_lower"), ("upper", "_upper")):
            ds[f"test_loss_slope{suffix}"] = ("heads", np.array([getattr(f, field) for f in fits]))
        return ds
