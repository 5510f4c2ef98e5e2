"""Variable projection with Levenberg–Marquardt: W solved exactly inside the residual.

The reduced cost is c(Θ) = mean ‖Σ_i Φ_i(X_n; Θ) W*(Θ) − Y_n‖² with W*(Θ) the least-squares
values (:func:`mhalearn.learners.linear.solve_values`). Each iteration builds the Gauss–Newton
system of the reduced problem with Kaufman's projected Jacobian

    J_K = (I − P_W) J_Θ,   J_Kᵀ J_K = J_Θᵀ J_Θ − Σ_e B_eᵀ (ZᵀZ)⁻¹ B_e,   J_Kᵀ r = J_Θᵀ r,

accumulated over chunks of samples (memory O(P²) for P = heads·dim² parameters, not
O(samples·P)), takes a damped step, and keeps it only if the reduced cost falls (damping /3 on
success, ×2 on failure); while its steps are accepted, the same matrix serves up to
``steps_per_system`` steps, each from a fresh gradient. Random starts are tried one after
another until one fits the data (at most ``restarts``); of those tried, the one with the
lowest training residual is kept.
Float64 is recommended: the method converges to ~1e-15 relative residual on realizable data,
far below float32 resolution.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn._validate import choice, in_range, positive_int
from mhalearn.learners.base import Fit, Monitor, fit_from_history, nan_last
from mhalearn.learners.reduced import (
    gauss_newton_system,
    reduced_cost,
    reduced_gradient,
    restricted_system,
)
from mhalearn.learners.registry import register_learner
from mhalearn.params import LayerParams
from mhalearn.problems import RegressionProblem, start_point

#: iterations in a row without a relative decrease above ``stall_tol`` that stop a start
STALL_PATIENCE = 3


class VarProConfig(eqx.Module):
    """``iterations`` LM iterations (the trace has one entry per iteration) from each of up to
    ``restarts`` random starts, one after another; a start stops early once its reduced cost
    is ``<= tol`` times mean(Y²), and then no further start is tried.

    An iteration forms the Gauss–Newton system once and takes up to ``steps_per_system``
    damped steps with it, the gradient evaluated afresh before each step after the first (a
    Shamanskii-type method: the matrix, the costly part, is reused while its steps are
    accepted; 2 saves a fifth of the systems on random teachers, 4 — the registered
    ``varpro`` — another 15%, 1 is plain LM).
    ``sample_chunk`` samples at a time build the system (``None``: about 512 (sample, token)
    rows on a CPU, 4096 on an accelerator: ``reduced.CHUNK_ROWS``). ``products="float32"``
    (the default) builds and factors it in float32 — it only sets the step; the residual and
    the cost that accepts a step stay in the problem's precision, and the fits reach the same
    ~1e-20 costs in the same number of iterations, faster (benchmarks/recovery_speed.py) —
    ``None`` in the problem's precision. ``stall_tol`` (``None``: never) also stops a start
    once, after its cost first fell, :data:`STALL_PATIENCE` iterations in a row lowered it by
    less than that fraction: a start stuck at a point that does not fit (the search inside an
    inexact span, whose minimum is not a fit) stops instead of running out its budget."""

    iterations: int = eqx.field(static=True, default=30)
    restarts: int = eqx.field(static=True, default=4)
    sample_chunk: int | None = eqx.field(static=True, default=None)
    damping: float | Array = 1e-3
    ridge: float | Array = 1e-12
    tol: float | Array = 1e-20
    products: str | None = eqx.field(static=True, default="float32")
    steps_per_system: int = eqx.field(static=True, default=2)
    stall_tol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        positive_int("iterations", self.iterations)
        positive_int("restarts", self.restarts)
        if self.sample_chunk is not None:
            positive_int("sample_chunk", self.sample_chunk)
        positive_int("steps_per_system", self.steps_per_system)
        in_range("damping", self.damping, 0.0, open_low=True)
        in_range("ridge", self.ridge, 0.0)
        in_range("tol", self.tol, 0.0)
        if self.products is not None:
            choice("products", self.products, ("float32",))
        if self.stall_tol is not None:
            in_range("stall_tol", self.stall_tol, 0.0)

    problems = (RegressionProblem,)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        """Variable projection from the starts ``start_point(problem, fold_in(key, r))``,
        r = 0, 1, …, tried one after another until one fits (reduced cost ``<= tol``·mean(Y²)) or
        ``restarts`` have run; of those tried, the one with the lowest final training residual
        is returned, and ``info["starts"]`` says how many ran. Most random teachers fit from
        the first start, so the others cost nothing (under ``vmap`` a group runs another start
        while any of its instances needs one)."""

        def attempt(r):
            theta0 = start_point(problem, jax.random.fold_in(key, r)).theta
            return levenberg_marquardt(problem, theta0, self)

        def needs_another(carry):
            r, best = carry
            return (r < self.restarts) & ~best.converged

        def next_start(carry):
            r, best = carry
            out = attempt(r)
            # the first start replaces the placeholder; a later one replaces a worse (or NaN)
            better = (r == 0) | (nan_last(out.cost) < nan_last(best.cost))
            return r + 1, jax.tree.map(lambda new, old: jnp.where(better, new, old), out, best)

        # before the first start: the shapes of a result, a cost of +inf (one copy of the solver
        # in the program, inside the loop)
        shapes = jax.eval_shape(attempt, 0)
        none = Solve(
            *(
                jnp.full(s.shape, jnp.inf, s.dtype)
                for s in (shapes.theta, shapes.W, shapes.history)
            ),
            converged=jnp.asarray(False, shapes.converged.dtype),
            iterations=jnp.asarray(0, shapes.iterations.dtype),
        )
        starts, best = jax.lax.while_loop(needs_another, next_start, (jnp.asarray(0), none))
        return best.fit(monitor, info={"starts": starts.astype(best.history.dtype)})


class Solve(eqx.Module):
    """One run of :func:`levenberg_marquardt`."""

    theta: Float[Array, "heads dim dim"]
    W: Float[Array, "heads dim dim"]
    history: Float[Array, " iterations"]  # cost after each iteration, held once stopped
    converged: Bool[Array, ""]
    iterations: Int[Array, ""]  # iterations done

    @property
    def cost(self) -> Float[Array, ""]:
        """The final reduced cost."""
        return self.history[-1]

    def fit(self, monitor: Monitor | None = None, info=None, estimates=None) -> Fit:
        """This solve as a learner's :class:`~mhalearn.learners.base.Fit`."""
        params = LayerParams(theta=self.theta, W=self.W)
        return fit_from_history(
            params, self.history, self.converged, self.iterations, monitor, info, estimates
        )


def levenberg_marquardt(
    problem: RegressionProblem,
    theta0,
    config: VarProConfig,
    basis: Float[Array, "params coefficients"] | None = None,
) -> Solve:
    """LM on the reduced cost from ``theta0``; with ``basis`` (columns in flattened-Θ space),
    the steps stay in its span (Θ − Θ₀ ∈ span(basis)), their system from
    :func:`restricted_system` (in the problem's precision: ``products`` applies to the full
    system only).

    Returns the :class:`Solve`.
    """
    size = jnp.mean(problem.Y**2)
    start = reduced_cost(problem, theta0, config.ridge)
    cost0, W0 = start.cost, start.W
    history0 = jnp.full(config.iterations + 1, cost0)
    # the full system is only as accurate as its ``products``: it is factored in them too
    factor = theta0.dtype if basis is not None or config.products is None else config.products

    def running(carry):
        i, *_, done, _, stalled = carry
        return (i < config.iterations) & ~done & (stalled < STALL_PATIENCE)

    def project(g):
        return g if basis is None else basis.T @ g

    def move(g, lu, theta, W, cost):
        """One damped step from the factorised system: kept only if the reduced cost falls."""
        delta = -jax.scipy.linalg.lu_solve(lu, g.astype(lu[0].dtype)).astype(theta.dtype)
        delta = (delta if basis is None else basis @ delta).reshape(theta.shape)
        moved = reduced_cost(problem, theta + delta, config.ridge)
        new_cost, new_W = moved.cost, moved.W
        better = (new_cost < cost) & jnp.isfinite(new_cost)
        theta = jnp.where(better, theta + delta, theta)
        return better, theta, jnp.where(better, new_W, W), jnp.where(better, new_cost, cost)

    def step(carry):
        i, theta, W, cost, mu, history, _, _, stalled = carry
        start_cost = cost
        if basis is None:
            system = gauss_newton_system(problem, theta, W, config.sample_chunk, config.products)
        else:
            system = restricted_system(problem, theta, W, basis, config.sample_chunk)
        H, g = system.H, system.g
        diag = jnp.diag(H)
        A = H + mu * (diag + 1e-12 * jnp.mean(diag)) * jnp.eye(H.shape[0], dtype=H.dtype)
        lu = jax.scipy.linalg.lu_factor(A.astype(factor))

        def substep(k, state):
            """Step k with this matrix: the system's gradient first, then a fresh one, as long
            as every step so far was accepted and the fit is not done (one copy of the step
            in the program, whatever ``steps_per_system``)."""

            def attempt(state):
                _, theta, W, cost = state
                fresh = jax.lax.cond(
                    k == 0, lambda: g, lambda: project(reduced_gradient(problem, theta, W))
                )
                return move(fresh, lu, theta, W, cost)

            better, _, _, cost = state
            go = (k == 0) | (better & (cost > config.tol * size))
            return jax.lax.cond(go, attempt, lambda s: (False, *s[1:]), state)

        first = (jnp.asarray(False), theta, W, cost)
        _, theta, W, cost = jax.lax.fori_loop(0, config.steps_per_system, substep, first)
        # the damping follows the first step (the cost fell iff it was accepted; a later
        # rejection only ends the reuse)
        mu = jnp.where(cost < start_cost, mu / 3, mu * 2)
        history = jnp.where(jnp.arange(history.shape[0]) > i, cost, history)
        if config.stall_tol is not None:
            # counted once the start has made progress (early rejections only raise damping)
            slow = (start_cost - cost <= config.stall_tol * start_cost) & (cost < cost0)
            stalled = jnp.where(slow, stalled + 1, 0)
        done = cost <= config.tol * size
        return i + 1, theta, W, cost, mu, history, done, i + 1, stalled

    mu0 = jnp.asarray(config.damping, theta0.dtype)
    init = (0, theta0, W0, cost0, mu0, history0, cost0 <= config.tol * size, 0, 0)
    _, theta, W, _, _, history, done, iters, _ = jax.lax.while_loop(running, step, init)
    return Solve(theta=theta, W=W, history=history, converged=done, iterations=jnp.asarray(iters))


register_learner(
    "varpro",
    # four steps per system: 15% fewer systems than two at the benchmark's cells
    lambda steps: VarProConfig(iterations=20, restarts=2, steps_per_system=4),
    lambda c: (
        f"VarPro-LM, {c.iterations} it. (≤ {c.steps_per_system} steps per system) × "
        f"{c.restarts} random starts"
    ),
)
