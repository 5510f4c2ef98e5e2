"""``stepsize``: the largest stable GD step per instance by bisection, training at it and at a
fixed step, and the curvature and NTK margin at initialisation, vs heads."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from mhalearn import stats
from mhalearn.batch import Engine
from mhalearn.experiments.base import product_grid, register_study, results_dataset
from mhalearn.experiments.classifier import ClassifierStudy
from mhalearn.metrics import theory
from mhalearn.simulate import InstanceKeys, measure
from mhalearn.variables import Meta, register_variables

#: the step-size study's own variables
register_variables(
    {
        "largest_stable_lr": Meta(
            "largest stable step size η",
            "The stable end of the bisection bracket in log η after `halvings` halvings: GD "
            "stays finite and its training loss never rises by more than rise_tol relative over "
            "`steps` steps (0: lr_low unstable; lr_high: lr_high stable).",
        ),
        "smallest_unstable_lr": Meta(
            "smallest unstable step size found",
            "The unstable end of the bisection bracket (inf when lr_high was stable).",
        ),
        "lr_censored": Meta(
            "step size outside the bracket",
            "1 when lr_high was stable or lr_low unstable (the edge lies outside the bracket).",
            flag=True,
        ),
        "loss_star": Meta(
            "training loss at the largest stable η",
            "Training loss of full-batch GD at the instance's own largest stable step size.",
            "nats",
        ),
        "loss_fixed": Meta(
            "training loss at the fixed η",
            "Training loss of full-batch GD at the study's fixed_lr.",
            "nats",
        ),
        "rate_star": Meta(
            "fitted rate of the training loss at the largest stable η",
            "Least-squares slope of log L̂ vs log t over the logged steps t >= rate_from · "
            "train_steps, at the instance's own largest stable step size (theory: −1).",
        ),
        "rate_fixed": Meta(
            "fitted rate of the training loss at the fixed η",
            "Least-squares slope of log L̂ vs log t over the logged steps t >= rate_from · "
            "train_steps, at fixed_lr (theory: −1).",
        ),
        "theory_loss_star": Meta(
            "theory's level 1/(ηTγ²) at the largest stable η",
            "1/(η·T·γ²) with η the instance's largest stable step, T = train_steps and γ its NTK "
            "margin at θ₀ (NaN when not separable); the theory bounds L̂_T by this up to "
            "constants and logarithms.",
            "nats",
        ),
        "theory_loss_fixed": Meta(
            "theory's level 1/(ηTγ²) at the fixed η",
            "1/(η·T·γ²) with η = fixed_lr, T = train_steps and γ the NTK margin at θ₀ (NaN when "
            "not separable).",
            "nats",
        ),
        "hessian_norm": Meta(
            "‖∇²L̂(θ₀)‖", "Spectral norm of the training loss's Hessian at the start (Lanczos)."
        ),
        "score_hessian_norm": Meta(
            "‖∇²Φ(X; θ₀)‖",
            "Mean over the first score_samples training sequences of the spectral norm of the "
            "score's Hessian at the start.",
        ),
        "weak_convexity": Meta(
            "weak-convexity ratio −λ_min(∇²L̂)/L̂",
            "−λ_min(∇²L̂(θ₀)) / L̂(θ₀) at the start (Lanczos).",
        ),
    }
)


@register_study
@dataclasses.dataclass(frozen=True)
class StepSize(ClassifierStudy):
    """Per instance (a training set and a start) and head count, in one compilation:

    - ``largest_stable_lr``: the largest full-batch GD step size found *stable* by a bisection
      in log η over [``lr_low``, ``lr_high``] with ``halvings`` halvings. A step size is stable
      when ``steps`` GD steps from the start stay finite and never raise the training loss by
      more than ``rise_tol`` relative (descent, as the smooth theory promises below
      2/‖∇²L̂‖). ``smallest_unstable_lr`` is the bracket's other end (so the two are one
      bracket apart); ``lr_low`` unstable gives 0 and ``lr_high`` stable gives ``lr_high``
      (``lr_censored``).
    - training-loss curves over ``train_steps`` steps at the instance's own largest stable
      step (``trace_loss_star``) and at ``fixed_lr`` (``trace_loss_fixed``), and their
      fitted rates (``rate_star``, ``rate_fixed``: the slope of log L̂ vs log t over the logged
      steps from ``rate_from``·``train_steps`` on);
    - the NTK margin γ at θ₀ (``margin``, 0 when not separable) and the theory's level
      1/(η·T·γ²) at the end of each run (``theory_loss_star``, ``theory_loss_fixed``);
    - ‖∇²L̂(θ₀)‖ (``hessian_norm``), −λ_min(∇²L̂)/L̂ at θ₀ (``weak_convexity``) and the mean
      over the first ``score_samples`` training sequences of ‖∇²Φ(X; θ₀)‖
      (``score_hessian_norm``, which the theory bounds by O(1/√H) under α_H = 1/√H), by
      Lanczos.
    """

    name = "stepsize"
    summary = "largest stable step (bisection), training at it, curvature and margin vs heads"
    static_axes = ()
    positive = ("lr_low", "lr_high", "fixed_lr", "rate_from")
    headline = "largest_stable_lr"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            heads=(1, 2),
            lr_low=0.25,
            lr_high=64.0,
            halvings=3,
            samples=16,
            steps=10,
            train_steps=20,
            snapshots=8,
            instances=2,
            lanczos_matvecs=5,
            svm_iterations=50,
            test_samples=16,
        ),
        "small": dict(
            heads=(1, 4),
            halvings=6,
            samples=32,
            steps=40,
            train_steps=200,
            instances=4,
            lanczos_matvecs=16,
            svm_iterations=500,
            test_samples=64,
        ),
        "full": dict(heads=(1, 2, 4, 8, 16, 32), halvings=8, train_steps=1000, instances=64),
    }

    heads: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Head counts H (the model has max(heads) heads, the rest masked)."""
    lr_low: float = 0.125
    """Lower end of the bisection bracket for the step size."""
    lr_high: float = 1024.0
    """Upper end of the bisection bracket for the step size."""
    halvings: int = 10
    """Bisection halvings of the bracket in log η (10 on the default bracket: ends 0.9% apart)."""
    samples: int = 128
    """Training samples n."""
    steps: int = 200
    """GD steps over which a step size must stay stable (the loss is checked at every step)."""
    rise_tol: float = 1e-4
    """A step size is unstable once the training loss rises by more than this, relative."""
    train_steps: int = 2000
    """GD steps of the training curves at the largest stable step and at fixed_lr."""
    fixed_lr: float = 1.0
    """The step size every head count also trains at."""
    snapshots: int = 30
    """Log-spaced steps at which the training curves are logged."""
    rate_from: float = 0.1
    """The rates are fitted over the logged steps t >= rate_from · train_steps."""
    lanczos_matvecs: int = theory.LANCZOS_MATVECS
    """Lanczos steps (Hessian-vector products) for the Hessians' extreme eigenvalues."""
    score_samples: int = 8
    """Training sequences over which ‖∇²Φ(X; θ₀)‖ is averaged."""
    svm_iterations: int = 3000
    """Iterations of the SVM dual solver for the NTK margin at θ₀."""
    instances: int = 4
    """Random problems (data and start) per head count."""
    seed: int = 0
    """Root seed: instance i of every head count draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
        if not self.lr_low < self.lr_high:
            raise ValueError(f"lr_low must be < lr_high, received {self.lr_low} and {self.lr_high}")
        if self.rate_from >= 1:
            raise ValueError(f"rate_from must lie in (0, 1), received {self.rate_from}")

    def probe(self) -> Any:
        """The GD run that judges one step size: ``steps`` steps, the loss at every one."""
        return self.learner(self.steps, self.lr_low, log_every=1)

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        axes = {"heads": self.heads}
        values, key_ids = product_grid(axes, self.instances)
        task = self.task(self.samples, max(self.heads), self.noise, active_heads=values["heads"])
        spec = {
            "task": task,
            "probe": self.probe(),
            "trainer": self.learner(self.train_steps, self.fixed_lr, self.snapshots),
        }
        lr_low, lr_high = self.lr_low, self.lr_high
        lo, hi = math.log(lr_low), math.log(lr_high)
        halvings, rise_tol, fixed = self.halvings, self.rise_tol, self.fixed_lr
        matvecs, iterations = self.lanczos_matvecs, self.svm_iterations
        n_scores = min(self.score_samples, self.samples)

        def one(keys: InstanceKeys, spec):
            _, problem = spec["task"].sample(keys.problem)

            def at(learner, lr):
                return eqx.tree_at(lambda c: c.lr, learner, lr).fit(keys.fit, problem)

            def stable(log_lr):
                fit = at(spec["probe"], jnp.exp(log_lr))
                return theory.stable_steps(fit.trace.loss, fit.status.diverged, rise_tol)

            def halve(_, bracket):
                low, high = bracket
                mid = (low + high) / 2
                ok = stable(mid)
                return jnp.where(ok, mid, low), jnp.where(ok, high, mid)

            ok_low, ok_high = stable(jnp.asarray(lo)), stable(jnp.asarray(hi))
            low, high = jax.lax.fori_loop(0, halvings, halve, (jnp.asarray(lo), jnp.asarray(hi)))
            star = jnp.where(ok_high, lr_high, jnp.where(ok_low, jnp.exp(low), 0.0))
            unstable = jnp.where(ok_high, jnp.inf, jnp.where(ok_low, jnp.exp(high), lr_low))
            # the curves at the instance's own step (at lr_low when none was stable)
            run_star = at(spec["trainer"], jnp.where(star > 0, star, lr_low))
            run_fixed = at(spec["trainer"], jnp.asarray(fixed, star.dtype))

            params = spec["trainer"].start(keys.fit, problem)
            k1, k2, k3 = jax.random.split(keys.evaluate, 3)

            def score_norm(x):
                score = lambda p: problem.scores(p, x[None])[0]  # noqa: E731
                return theory.hessian_spectral_norm(score, params, k3, matvecs)

            features = theory.ntk_features(params, problem.X, problem.spec, problem.head_mask())
            margin = theory.svm_margin(theory.ntk_gram(features["all"]), problem.y, iterations)
            metrics = {
                "largest_stable_lr": star,
                "smallest_unstable_lr": unstable,
                "lr_censored": ok_high | ~ok_low,
                "margin": margin.margin,
                "score_hessian_norm": jnp.mean(jax.vmap(score_norm)(problem.X[:n_scores])),
                "hessian_norm": theory.hessian_spectral_norm(problem.loss, params, k1, matvecs),
                "weak_convexity": theory.weak_convexity_ratio(problem.loss, params, k2, matvecs),
            }
            trace = {"loss_star": run_star.trace.loss, "loss_fixed": run_fixed.trace.loss}
            return {"metrics": metrics, "trace": trace, "steps": run_star.trace.steps}

        res = measure(key, one, spec, len(key_ids), key_ids=key_ids, engine=engine)
        return results_dataset(res, axes, self.instances)

    def derive(self, ds):
        """The fitted rates and the theory's level 1/(η·T·γ²) per instance."""
        T = self.train_steps
        margin = ds["margin"].where(ds["margin"] > 0)
        for run, lr in (("star", ds["largest_stable_lr"]), ("fixed", self.fixed_lr)):
            ds[f"rate_{run}"] = ds["margin"].copy(
                data=loss_rate(ds[f"trace_loss_{run}"], self.rate_from * T)
            )
            ds[f"theory_loss_{run}"] = 1.0 / (lr * T * margin**2)
        return ds


def loss_rate(trace, start: float) -> np.ndarray:
    """Least-squares slope of log L̂ vs log t over the logged steps t >= ``start`` (t > 0), per
    run of ``trace`` (a DataArray with a ``step`` dim, last); NaN where fewer than three
    losses there are finite and positive."""
    steps = np.asarray(trace["step"].values, float)
    keep = (steps >= start) & (steps > 0)
    loss = np.asarray(trace.transpose(..., "step").values, float)[..., keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_loss = np.where(loss > 0, np.log(loss), np.nan)
    return stats.line_slopes(np.log(steps[keep]), log_loss)
