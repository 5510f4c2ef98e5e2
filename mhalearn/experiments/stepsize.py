"""``stepsize``: the largest stable GD step vs heads, and the curvature at initialisation."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from mhalearn import plots
from mhalearn.batch import Engine
from mhalearn.experiments.base import product_grid, register_study, results_dataset
from mhalearn.experiments.classifier import ClassifierStudy, as_float, classifier_settings
from mhalearn.metrics import theory
from mhalearn.simulate import InstanceKeys, measure


@register_study
@dataclasses.dataclass(frozen=True)
class StepSize(ClassifierStudy):
    """Full-batch GD for every (heads, step size) on the same problems, the loss logged at
    every step. A step size is *stable* for an instance when GD does not diverge and the
    training loss never rises (by more than a relative ``rise_tol``: descent, as the smooth
    theory promises below 2/‖∇²L̂‖);
    ``largest_stable_lr`` is the largest stable one on the grid (0 if none). Also
    ‖∇²L̂(θ₀)‖ (``hessian_norm``) and −λ_min(∇²L̂)/L̂ at θ₀ (``weak_convexity``) by
    Lanczos, and the mean over the first ``score_samples`` training sequences of ‖∇²Φ(X; θ₀)‖
    (``score_hessian_norm``), which the theory bounds by O(1/√H) under α_H = 1/√H."""

    name = "stepsize"
    summary = "largest stable step size and curvature at init vs heads"
    static_axes = ()
    positive = ("lr",)
    headline = "largest_stable_lr"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            heads=(1, 2),
            lr=(1.0, 1e4),
            samples=16,
            steps=10,
            instances=2,
            lanczos_matvecs=5,
            test_samples=16,
        ),
        "small": dict(
            heads=(1, 4),
            lr=(1.0, 64.0),
            samples=32,
            steps=20,
            instances=2,
            lanczos_matvecs=10,
            test_samples=64,
        ),
        "full": dict(
            heads=(1, 2, 4, 8, 16, 32),
            lr=tuple(float(x) for x in np.geomspace(0.25, 256, 11)),
            samples=128,
            steps=200,
            instances=6,
        ),
    }

    heads: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Head counts H (the model has max(heads) heads, the rest masked)."""
    lr: tuple[float, ...] = tuple(float(x) for x in np.geomspace(0.5, 128.0, 9))
    """GD step sizes η tried; the largest stable one is reported."""
    samples: int = 128
    """Training samples n."""
    steps: int = 200
    """Full-batch GD steps per step size (the loss is logged at every step)."""
    rise_tol: float = 1e-4
    """A step size is unstable once the training loss rises by more than this, relative."""
    lanczos_matvecs: int = theory.LANCZOS_MATVECS
    """Lanczos steps (Hessian-vector products) for the Hessians' extreme eigenvalues."""
    score_samples: int = 8
    """Training sequences over which ‖∇²Φ(X; θ₀)‖ is averaged."""
    instances: int = 4
    """Random problems (data and start) per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        axes = {"heads": self.heads, "lr": self.lr}
        ds = self.train(
            key,
            engine,
            axes,
            self.samples,
            max(self.heads),
            self.steps,
            lr=lambda v: as_float(v["lr"]),
            task_numbers=lambda v: {"active_heads": v["heads"]},
            log_every=1,
        )
        loss = ds["trace_loss"].transpose(..., "step")
        stable = theory.stable_steps(loss.values, ds["diverged"].values, self.rise_tol)
        ds["stable"] = ds["diverged"].copy(data=stable.astype(np.int8))
        ds["largest_stable_lr"] = ds["lr"].where(ds["stable"] == 1).max("lr").fillna(0.0)
        return ds.merge(self.curvature(key, engine))

    def curvature(self, key: jax.Array, engine: Engine):
        """‖∇²L̂‖, the weak-convexity ratio and ‖∇²Φ‖ at the start, per (heads, instance), on
        the same problems and starts as the GD runs."""
        axes = {"heads": self.heads}
        values, key_ids = product_grid(axes, self.instances)
        task = self.task(self.samples, max(self.heads), self.noise, active_heads=values["heads"])
        spec = {"task": task, "learner": self.learner(self.steps)}
        matvecs = self.lanczos_matvecs
        n_scores = min(self.score_samples, self.samples)

        def one(keys: InstanceKeys, spec):
            _, problem = spec["task"].sample(keys.problem)
            params = spec["learner"].start(keys.fit, problem)
            k1, k2, k3 = jax.random.split(keys.evaluate, 3)

            def score_norm(x):
                score = lambda p: problem.scores(p, x[None])[0]  # noqa: E731
                return theory.hessian_spectral_norm(score, params, k3, matvecs)

            metrics = {
                "score_hessian_norm": jnp.mean(jax.vmap(score_norm)(problem.X[:n_scores])),
                "hessian_norm": theory.hessian_spectral_norm(problem.loss, params, k1, matvecs),
                "weak_convexity": theory.weak_convexity_ratio(problem.loss, params, k2, matvecs),
            }
            return {"metrics": metrics}

        res = measure(key, one, spec, len(key_ids), key_ids=key_ids, **engine.kwargs())
        return results_dataset(res, axes, self.instances)

    @staticmethod
    def figure(ds):
        """Largest stable step size vs heads; ‖∇²L̂(θ₀)‖ and the weak-convexity ratio vs heads,
        with a 1/√H guide; log–log."""
        fig, axes = plots.panels(1, 3)
        h = ds["heads"].values
        plots.band(
            axes[0, 0],
            ds["largest_stable_lr"],
            "heads",
            label="largest stable η (grid)",
            **plots.style(0),
        )
        norm = plots.median(ds["hessian_norm"])
        axes[0, 0].plot(h, 2 / norm, label="2 / median ‖∇²L̂(θ₀)‖", **plots.style(1))
        axes[0, 0].set(ylabel=plots.LABELS["lr"])
        plots.band(
            axes[0, 1], ds["hessian_norm"], "heads", label="‖∇²L̂(θ₀)‖ (loss)", **plots.style(2)
        )
        plots.band(
            axes[0, 1],
            ds["score_hessian_norm"],
            "heads",
            label="‖∇²Φ(X; θ₀)‖ (score)",
            **plots.style(3),
        )
        plots.guide(axes[0, 1], h, float(plots.median(ds["score_hessian_norm"])[0]), -0.5, "∝ 1/√H")
        axes[0, 1].set(ylabel="Hessian spectral norm at θ₀")
        plots.band(
            axes[0, 2],
            ds["weak_convexity"],
            "heads",
            label="−λ_min(∇²L̂)/L̂ at θ₀",
            **plots.style(4),
        )
        plots.guide(
            axes[0, 2], h, float(np.abs(plots.median(ds["weak_convexity"])[0])), -0.5, "∝ 1/√H"
        )
        axes[0, 2].set(ylabel=plots.label_of(ds, "weak_convexity"))
        for ax in axes[0]:
            plots.values_axis(ax, h, plots.LABELS["heads"])
            ax.set_yscale("log")
        config = plots.config_of(ds)
        lrs = config.get("lr", [])
        caption = (
            f"Median over {plots.instances(ds)} random problems per head count, band: "
            f"interquartile range. A step size is stable when {config.get('steps', '?')} "
            "full-batch steps never raise the training loss (by more than rise_tol, relative) "
            "and stay finite; the "
            f"grid is {len(lrs)} values from {min(lrs, default=float('nan')):g} to "
            f"{max(lrs, default=float('nan')):g}. Extreme eigenvalues by "
            f"{config.get('lanczos_matvecs', '?')} Lanczos steps on Hessian-vector products; the "
            "score's norm is averaged over "
            f"{config.get('score_samples', '?')} training sequences."
        )
        title = (
            f"Curvature and step size vs heads: samples {config.get('samples', '?')}, "
            + classifier_settings(ds)
        )
        return plots.finish(fig, title, caption)
