"""Variable projection with Levenberg–Marquardt: W solved exactly inside the residual.

The reduced cost is c(Θ) = mean ‖Σ_i Φ_i(X_n; Θ) W*(Θ) − Y_n‖² with W*(Θ) the least-squares
values (:func:`mhalearn.learners.linear.solve_values`). Each iteration builds the Gauss–Newton
system of the reduced problem with Kaufman's projected Jacobian

    J_K = (I − P_W) J_Θ,   J_Kᵀ J_K = J_Θᵀ J_Θ − Σ_e B_eᵀ (ZᵀZ)⁻¹ B_e,   J_Kᵀ r = J_Θᵀ r,

accumulated over chunks of samples (memory O(P²) for P = heads·dim² parameters, not
O(samples·P)), takes a damped step, and keeps it only if the reduced cost falls (damping /3 on
success, ×2 on failure). Random starts are tried one after another until one fits the data
(at most ``restarts``); of those tried, the one with the lowest training residual is kept.
Float64 is recommended: the method converges to ~1e-15 relative residual on realizable data,
far below float32 resolution.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from mhalearn._validate import choice, in_range, positive_int
from mhalearn.kernels import attention_weights
from mhalearn.learners.base import Fit, Monitor, fit_from_history
from mhalearn.learners.linear import design, solve_values
from mhalearn.learners.registry import register_learner
from mhalearn.params import LayerParams
from mhalearn.problems import RegressionProblem
from mhalearn.solvers import ridge_solve


def _nan_last(cost: Float[Array, ""]) -> Float[Array, ""]:
    """A cost to rank starts by: NaN ranks after every number."""
    return jnp.where(jnp.isnan(cost), jnp.inf, cost)


class VarProConfig(eqx.Module):
    """``iterations`` LM iterations (the trace has one entry per iteration) from each of up to
    ``restarts`` random starts, one after another; a start stops early once its reduced cost
    is ``<= tol`` times mean(Y²), and then no further start is tried. ``sample_chunk``
    samples at a time build the Gauss–Newton system. ``products="float32"`` (the default) forms
    its matrix in float32 — it only sets the step; residuals, gradient and cost checks stay
    in the problem's precision, and the fits reach the same ~1e-20 costs in the same number
    of iterations, 1.3–1.6× faster (benchmarks/recovery_speed.py) — ``None`` in the
    problem's precision."""

    iterations: int = eqx.field(static=True, default=30)
    restarts: int = eqx.field(static=True, default=4)
    sample_chunk: int = eqx.field(static=True, default=64)
    damping: float | Array = 1e-3
    ridge: float | Array = 1e-12
    tol: float | Array = 1e-20
    products: str | None = eqx.field(static=True, default="float32")

    def __check_init__(self):
        positive_int("iterations", self.iterations)
        positive_int("restarts", self.restarts)
        positive_int("sample_chunk", self.sample_chunk)
        in_range("damping", self.damping, 0.0, open_low=True)
        in_range("ridge", self.ridge, 0.0)
        in_range("tol", self.tol, 0.0)
        if self.products is not None:
            choice("products", self.products, ("float32",))

    problems = (RegressionProblem,)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        """Variable projection from the starts ``problem.init(fold_in(key, r))``, r = 0, 1, …,
        tried one after another until one fits (reduced cost ``<= tol``·mean(Y²)) or
        ``restarts`` have run; of those tried, the one with the lowest final training residual
        is returned, and ``info["starts"]`` says how many ran. Most random teachers fit from
        the first start, so the others cost nothing (under ``vmap`` a group runs another start
        while any of its instances needs one)."""

        def attempt(r):
            theta0 = problem.init(jax.random.fold_in(key, r)).theta
            return levenberg_marquardt(problem, theta0, self)

        def needs_another(carry):
            r, (*_, done, _) = carry
            return (r < self.restarts) & ~done

        def next_start(carry):
            r, best = carry
            out = attempt(r)
            # the first start replaces the placeholder; a later one replaces a worse (or NaN)
            better = (r == 0) | (_nan_last(out[2][-1]) < _nan_last(best[2][-1]))
            return r + 1, jax.tree.map(lambda new, old: jnp.where(better, new, old), out, best)

        # before the first start: the shapes of a result, a cost of +inf (one copy of the solver
        # in the program, inside the loop)
        shapes = jax.eval_shape(attempt, 0)
        none = (*(jnp.full(s.shape, jnp.inf, s.dtype) for s in shapes[:3]), False, 0)
        none = jax.tree.map(lambda v, s: jnp.asarray(v, s.dtype), none, shapes)
        starts, (theta, W, history, done, iters) = jax.lax.while_loop(
            needs_another, next_start, (jnp.asarray(0), none)
        )
        params = LayerParams(theta=theta, W=W)
        return fit_from_history(
            params, history, done, iters, monitor, info={"starts": starts.astype(history.dtype)}
        )


def reduced_cost(problem: RegressionProblem, theta, ridge) -> tuple[Float[Array, ""], Array]:
    W = solve_values(problem.X, problem.Y, theta, ridge)
    return problem.loss(LayerParams(theta=theta, W=W)), W


def gauss_newton_system(
    problem: RegressionProblem, theta, W, sample_chunk: int, products: str | None = None
):
    """(J_Kᵀ J_K, J_Kᵀ r) of the reduced residual at Θ (W = W*(Θ)), over flattened Θ.

    ``products="float32"`` forms J_Kᵀ J_K's products in float32 (the matrix only sets the
    step; the gradient, residual and cost stay in the problem's precision)."""
    X, Y = problem.X, problem.Y
    n, T, d = X.shape
    m = theta.shape[0]
    P = theta.size
    chunk = min(sample_chunk, n)
    pad = (-n) % chunk
    weights = jnp.concatenate([jnp.ones(n, X.dtype), jnp.zeros(pad, X.dtype)])
    Xp = jnp.concatenate([X, jnp.zeros((pad, T, d), X.dtype)]).reshape(-1, chunk, T, d)
    Yp = jnp.concatenate([Y, jnp.zeros((pad, T, d), Y.dtype)]).reshape(-1, chunk, T, d)
    wp = weights.reshape(-1, chunk)

    def body(acc, batch):
        # Closed-form Jacobian of F w.r.t. Θ_i[p, q] for one sample: X[t, p]·C_i[t, q, e], with
        # C_i[t, q, e] = Σ_s A_i[t, s] (X[s, q] − x̄_i[t, q]) (X W_i)[s, e] and x̄_i = A_i X.
        # Its rank structure makes J_Θᵀ J_Θ cost tokens·P² per sample instead of tokens·dim·P².
        x, y, w = batch
        A = jax.vmap(attention_weights, in_axes=(0, None))(x, theta)  # (c, m, T, T)
        V = jnp.einsum("ctd,mde->cmte", x, W)
        AV = A @ V
        xbar = A @ x[:, None]  # (c, m, T, d): the per-head features Φ_i
        C = jnp.einsum("cmts,csq,cmse->cmtqe", A, x, V) - xbar[..., :, None] * AV[..., None, :]
        C = C * w[:, None, None, None, None]
        r = (AV.sum(1) - y) * w[:, None, None]
        G, B, g = acc
        g = g + jnp.einsum("ctp,cmtqe,cte->mpq", x, C, r).reshape(P)
        z = xbar * w[:, None, None, None]
        if products is not None:
            x, C, z = (a.astype(products) for a in (x, C, z))
        D = jnp.einsum("cmtqe,cjtse->ctmqjs", C, C)
        G = G + jnp.einsum("ctp,ctr,ctmqjs->mpqjrs", x, x, D).reshape(P, P).astype(G.dtype)
        B = B + jnp.einsum("cita,ctp,cjtqe->iaejpq", z, x, C).reshape(m * d, d, P).astype(B.dtype)
        return (G, B, g), None

    zeros = (jnp.zeros((P, P), X.dtype), jnp.zeros((m * d, d, P), X.dtype), jnp.zeros(P, X.dtype))
    (G, B, g), _ = jax.lax.scan(body, zeros, (Xp, Yp, wp))
    Z = design(X, theta)
    solved = ridge_solve(Z.T @ Z, B.reshape(m * d, -1), 1e-12)
    H = G - jnp.einsum("iep,ieq->pq", B, solved.reshape(B.shape))
    return H, g


def levenberg_marquardt(
    problem: RegressionProblem,
    theta0,
    config: VarProConfig,
    basis: Float[Array, "params coefficients"] | None = None,
):
    """LM on the reduced cost from ``theta0``; with ``basis`` (columns in flattened-Θ space),
    the steps stay in its span (Θ − Θ₀ ∈ span(basis)).

    Returns (Θ, W, cost after each iteration — held at its last value once stopped —,
    converged, iterations done).
    """
    size = jnp.mean(problem.Y**2)
    cost0, W0 = reduced_cost(problem, theta0, config.ridge)
    history0 = jnp.full(config.iterations + 1, cost0)

    def running(carry):
        i, *_, done, _ = carry
        return (i < config.iterations) & ~done

    def step(carry):
        i, theta, W, cost, mu, history, _, _ = carry
        H, g = gauss_newton_system(problem, theta, W, config.sample_chunk, config.products)
        if basis is not None:
            H, g = basis.T @ H @ basis, basis.T @ g
        diag = jnp.diag(H)
        A = H + mu * (diag + 1e-12 * jnp.mean(diag)) * jnp.eye(H.shape[0], dtype=H.dtype)
        delta = -jnp.linalg.solve(A, g)
        delta = (delta if basis is None else basis @ delta).reshape(theta.shape)
        new_cost, new_W = reduced_cost(problem, theta + delta, config.ridge)
        better = (new_cost < cost) & jnp.isfinite(new_cost)
        theta = jnp.where(better, theta + delta, theta)
        W = jnp.where(better, new_W, W)
        cost = jnp.where(better, new_cost, cost)
        mu = jnp.where(better, mu / 3, mu * 2)
        history = jnp.where(jnp.arange(history.shape[0]) > i, cost, history)
        return i + 1, theta, W, cost, mu, history, cost <= config.tol * size, i + 1

    mu0 = jnp.asarray(config.damping, theta0.dtype)
    init = (0, theta0, W0, cost0, mu0, history0, cost0 <= config.tol * size, 0)
    _, theta, W, _, _, history, done, iters = jax.lax.while_loop(running, step, init)
    return theta, W, history, done, iters


register_learner(
    "varpro",
    lambda steps: VarProConfig(iterations=20, restarts=2),
    lambda c: f"VarPro-LM, {c.iterations} it. × {c.restarts} random starts",
)
