"""Baselines for recovering Chen–Li teachers: a floor, a simple alternative and a ceiling.

- :class:`UniformConfig` — uniform attention (Θ = 0) and least-squares values: the best a
  model without attention can do; only ΣW is learnable, split equally over the heads (a floor).
- :class:`AlternatingConfig` — alternating minimisation: exact least-squares W for the current
  Θ's, then ``inner_steps`` Adam steps on the Θ's with W held, for ``rounds`` rounds.
- :class:`OracleConfig` — start at the teacher, perturbed by a relative ``perturbation``, then
  refine by variable projection (a ceiling: it reads ``problem.teacher``).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import in_range, positive_int
from mhalearn.learners.base import Fit, Monitor, fit_from_history
from mhalearn.learners.linear import solve_values
from mhalearn.learners.registry import register_learner
from mhalearn.learners.varpro import VarProConfig, levenberg_marquardt
from mhalearn.params import LayerParams
from mhalearn.problems import RegressionProblem, start_point


class UniformConfig(eqx.Module):
    """Θ = 0 and the least-squares ΣW, split equally over the heads."""

    ridge: float | Array = 1e-12
    problems = (RegressionProblem,)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        del key  # deterministic
        d, m = problem.X.shape[-1], problem.heads
        zero = jnp.zeros((1, d, d), problem.X.dtype)
        sum_w = solve_values(problem.X, problem.Y, zero, self.ridge)[0]
        params = LayerParams(
            theta=jnp.zeros((m, d, d), problem.X.dtype), W=jnp.tile(sum_w / m, (m, 1, 1))
        )
        loss = problem.loss(params)
        return fit_from_history(params, loss[None], jnp.asarray(True), 1, monitor)


class AlternatingConfig(eqx.Module):
    """``rounds`` of: least-squares W for the current Θ's, then ``inner_steps`` Adam steps
    (``lr``) on the Θ's with W held."""

    rounds: int = eqx.field(static=True, default=50)
    inner_steps: int = eqx.field(static=True, default=20)
    lr: float | Array = 1e-2
    ridge: float | Array = 1e-12
    problems = (RegressionProblem,)

    def __check_init__(self):
        positive_int("rounds", self.rounds)
        positive_int("inner_steps", self.inner_steps)
        in_range("lr", self.lr, 0.0, open_low=True)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        opt = optax.adam(self.lr)
        theta = start_point(problem, key).theta

        def theta_loss(theta, W):
            return problem.loss(LayerParams(theta=theta, W=W))

        def inner(carry, _):
            theta, state, W = carry
            grads = jax.grad(theta_loss)(theta, W)
            updates, state = opt.update(grads, state, theta)
            return (optax.apply_updates(theta, updates), state, W), None

        def round_(carry, _):
            theta, state = carry
            W = solve_values(problem.X, problem.Y, theta, self.ridge)
            (theta, state, _), _ = jax.lax.scan(inner, (theta, state, W), None, self.inner_steps)
            return (theta, state), theta_loss(
                theta, solve_values(problem.X, problem.Y, theta, self.ridge)
            )

        start = theta_loss(theta, solve_values(problem.X, problem.Y, theta, self.ridge))
        (theta, _), history = jax.lax.scan(round_, (theta, opt.init(theta)), None, self.rounds)
        params = LayerParams(theta=theta, W=solve_values(problem.X, problem.Y, theta, self.ridge))
        history = jnp.concatenate([start[None], history])
        return fit_from_history(params, history, jnp.asarray(False), self.rounds, monitor)


class OracleConfig(eqx.Module):
    """Variable projection started at the teacher's Θ's times (1 + perturbation·noise)."""

    refine: VarProConfig = VarProConfig(iterations=20, restarts=1)
    perturbation: float | Array = 0.1
    problems = (RegressionProblem,)

    def __check_init__(self):
        in_range("perturbation", self.perturbation, 0.0)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        if problem.teacher is None:
            raise ValueError("the oracle baseline needs problem.teacher (RegressionTask sets it)")
        truth = problem.teacher.theta
        if truth.shape[0] != problem.heads:
            raise ValueError(
                f"the oracle baseline needs student heads == teacher heads, "
                f"received {problem.heads} and {truth.shape[0]}"
            )
        noise = draws.normal(key, truth.shape, truth.dtype)
        scale = jnp.linalg.norm(truth, axis=(1, 2), keepdims=True) / truth.shape[-1]
        theta0 = truth + self.perturbation * scale * noise
        return levenberg_marquardt(problem, theta0, self.refine).fit(monitor)


register_learner(
    "uniform",
    lambda steps: UniformConfig(),
    lambda c: "uniform attention, least-squares W (a floor)",
)
register_learner(
    "alternating",
    lambda steps: AlternatingConfig(rounds=25, inner_steps=20),
    lambda c: f"LS for W, Adam on Θ, {c.rounds} × {c.inner_steps} steps",
)
register_learner(
    "oracle",
    lambda steps: OracleConfig(),
    lambda c: f"VarPro-LM from the teacher ±{float(c.perturbation):g}, {c.refine.iterations} it.",
)
