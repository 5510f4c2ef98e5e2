"""``stepsize``: the largest stable GD step vs heads, and the curvature at initialisation."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhalearn.experiments.base import Engine, grid_dataset, product_grid
from mhalearn.experiments.classifier import ClassifierStudy, as_float
from mhalearn.learners.gd import gd_keys
from mhalearn.metrics import theory
from mhalearn.simulate import instance_keys


@dataclasses.dataclass(frozen=True)
class StepSize(ClassifierStudy):
    """Full-batch GD for every (heads, step size) on the same problems, the loss logged at
    every step. A step size is *stable* for an instance when GD does not diverge and the
    training loss never rises (by more than a relative ``rise_tol``: descent, as the smooth
    theory promises below 2/‖∇²L̂‖);
    ``largest_stable_lr`` is the largest stable one on the grid (0 if none). Also
    ‖∇²L̂(θ₀)‖ (``hessian_norm``) and −λ_min(∇²L̂)/L̂ at θ₀ (``weak_convexity``) by power
    iteration, and the mean over the first ``score_samples`` training sequences of ‖∇²Φ(X; θ₀)‖
    (``score_hessian_norm``), which the theory bounds by O(1/√H) under α_H = 1/√H."""

    name = "stepsize"
    summary = "largest stable step size and curvature at init vs heads"
    static_axes = ()
    positive = ("lr",)
    headline = "largest_stable_lr"

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
    power_iterations: int = 50
    """Power iterations for the Hessian norms at the start."""
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
        before, after = loss.values[..., :-1], loss.values[..., 1:]
        rises = np.any(after - before > self.rise_tol * np.abs(before), axis=-1)
        stable = (ds["diverged"] == 0) & ~loss.isel(step=0).copy(data=rises)
        ds["stable"] = stable.astype(np.int8)
        ds["largest_stable_lr"] = ds["lr"].where(stable).max("lr").fillna(0.0)
        return ds.merge(self.curvature(key, engine))

    def curvature(self, key: jax.Array, engine: Engine):
        """‖∇²L̂‖, the weak-convexity ratio and ‖∇²Φ‖ at the start, per (heads, instance), on
        the same problems and starts as the GD runs."""
        axes = {"heads": self.heads}
        values, key_ids = product_grid(axes, self.instances)
        task = self.task(self.samples, max(self.heads), self.noise)
        iterations = self.power_iterations
        n_scores = min(self.score_samples, self.samples)

        def one(key, active, task):
            task = dataclasses.replace(task, active_heads=active)
            k_problem, k_fit, _ = instance_keys(key)
            _, problem = task.sample(k_problem)
            params = problem.init(gd_keys(k_fit)[0])
            k1, k2, k3 = jax.random.split(jax.random.fold_in(key, 7), 3)

            def score_norm(x):
                score = lambda p: problem.scores(p, x[None])[0]  # noqa: E731
                return theory.hessian_spectral_norm(score, params, k3, iterations)

            return {
                "score_hessian_norm": jnp.mean(jax.vmap(score_norm)(problem.X[:n_scores])),
                "hessian_norm": theory.hessian_spectral_norm(problem.loss, params, k1, iterations),
                "weak_convexity": theory.weak_convexity_ratio(problem.loss, params, k2, iterations),
            }

        out = engine.map(one, key, key_ids, values["heads"], task)
        return grid_dataset(out, axes, self.instances)
