"""``samples``: test loss and generalisation gap vs training samples, with the stability proxy."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import numpy as np

from mhalearn import plots, stats
from mhalearn.batch import Engine
from mhalearn.experiments.base import register_study
from mhalearn.experiments.classifier import ClassifierStudy, as_float, classifier_settings
from mhalearn.metrics import theory


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
        for i, suffix in enumerate(("", "_lower", "_upper")):
            ds[f"test_loss_slope{suffix}"] = ("heads", np.array([f[i] for f in fits]))
        return ds

    @staticmethod
    def figure(ds):
        """Test loss vs samples (log–log, with an n^(−1) guide), and the generalisation gap
        beside the stability proxy, a curve per head count."""
        fig, axes = plots.panels(1, 3)
        n = ds["samples"].values
        hs = ds["heads"].values
        for i, h in enumerate(hs):
            one = ds.sel(heads=h)
            at = plots.shift(i, len(hs))
            slope = (
                f", slope {float(one['test_loss_slope']):.2f} "
                f"[{float(one['test_loss_slope_lower']):.2f}, "
                f"{float(one['test_loss_slope_upper']):.2f}]"
                if "test_loss_slope" in one
                else ""
            )
            plots.band(
                axes[0, 0],
                one["test_loss"],
                "samples",
                f"H = {h}{slope}",
                at,
                **plots.style(i, "-"),
            )
            plots.rate(axes[0, 2], one["proxy_bounds_gap"], "samples", None, at, **plots.style(i))
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
        axes[0, 2].set(ylabel="share of runs with gap ≤ proxy", ylim=(-0.05, 1.05))
        for ax in axes[0]:
            plots.values_axis(ax, n, "training samples n")
        for ax in axes[0, :2]:
            ax.set_yscale("log")
        config = plots.config_of(ds)
        caption = (
            f"Median over {plots.instances(ds)} random training sets and starts per point, band: "
            f"interquartile range; shares with Wilson 95% bars; slopes: least squares on the "
            "log medians, 95% bootstrap interval. Full-batch GD, η = "
            f"{config.get('lr', '?')}, until the training loss is at most "
            f"{config.get('target_loss', '?')} (budget {config.get('steps', '?')} steps); gap = "
            "test loss − training loss (points where it is negative are not drawn on the log "
            "axis)."
        )
        return plots.finish(fig, "Generalisation vs samples: " + classifier_settings(ds), caption)
