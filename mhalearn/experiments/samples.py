"""``samples``: test loss and generalisation gap vs training samples, with the stability proxy."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import numpy as np

from mhalearn import plots
from mhalearn.batch import Engine
from mhalearn.experiments.base import register_study
from mhalearn.experiments.classifier import ClassifierStudy, as_float, classifier_settings
from mhalearn.metrics import theory


@register_study
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
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(samples=(16, 32), heads=(1, 2), steps=10, instances=2, test_samples=16),
        "small": dict(samples=(32, 64), heads=(1, 4), steps=30, instances=2, test_samples=64),
        "full": dict(
            samples=(32, 64, 128, 256, 512, 1024), heads=(1, 4, 16), steps=1000, instances=6
        ),
    }

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
        ds["stability_proxy"] = theory.stability_proxy(self.lr, n, ds["info_loss_sum"])
        return ds

    @staticmethod
    def figure(ds):
        """Test loss vs samples (log–log, with an n^(−1) guide), and the generalisation gap
        beside the stability proxy, a curve per head count."""
        fig, axes = plots.panels(1, 2)
        n = ds["samples"].values
        hs = ds["heads"].values
        for i, h in enumerate(hs):
            one = ds.sel(heads=h)
            at = plots.shift(i, len(hs))
            plots.band(
                axes[0, 0], one["test_loss"], "samples", f"H = {h}", at, **plots.style(i, "-")
            )
            plots.band(axes[0, 1], one["gap"], "samples", f"H = {h}", at, **plots.style(i, "-"))
            proxy = f"H = {h}, stability proxy (right, dashed)"
            plots.band(
                axes[0, 1],
                one["stability_proxy"],
                "samples",
                proxy,
                at,
                **plots.style(i, "--", True),
            )
        first = float(np.nanmedian(plots.median(ds["test_loss"].isel(samples=0))))
        plots.guide(axes[0, 0], n, first, -1.0, "∝ 1/n")
        axes[0, 0].set(ylabel=plots.label_of(ds, "test_loss"))
        axes[0, 1].set(ylabel="gap (solid) and stability proxy (dashed)")
        for ax in axes[0]:
            plots.values_axis(ax, n, "training samples n")
            ax.set_yscale("log")
        config = plots.config_of(ds)
        caption = (
            f"Median over {plots.instances(ds)} random training sets and starts per point, band: "
            f"interquartile range. Full-batch GD, η = {config.get('lr', '?')}, "
            f"{config.get('steps', '?')} steps; gap = test loss − training loss (points where it "
            "is negative are not drawn on the log axis)."
        )
        return plots.finish(fig, "Generalisation vs samples: " + classifier_settings(ds), caption)
