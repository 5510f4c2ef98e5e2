"""The certify-and-sculpt pipeline in the spirit of Chen & Li — a RECONSTRUCTION.

The paper's algorithm is known here only from its published outline (see the README's "What is
sourced and what is reconstructed"); every phase below is our reading of it, one public function
per phase so that each can be studied alone, and :meth:`ChenLiConfig.fit` chains them:

1. :func:`crude_sum_w` — ΣW ≈ M₀ = mean_n X_nᵀ Y_n (exact in expectation when attention is
   uniform; poor otherwise).
2. :func:`row_matches`, :func:`refine_sum_w`, :func:`certify` — an output row Y_a that equals
   x_bᵀ ΣW for one token value b (identical tokens merged), with a clear gap to every other
   distinct token, certifies that every head puts ≥ 1 − δ of row a on b. ΣW is refitted by
   least squares on the best-matching rows, keeping a shrinking quantile of them, from a few
   perturbed starts (the best by trimmed residual is kept).
3. :func:`constraints`, :func:`min_norm_point` — each certified (row a, token b) gives, for
   every distinct other token c, ⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ), valid for every head:
   a polyhedron K holding every Θ_i. Duplicate constraints are removed. Its minimum-norm point
   (a QP, solved by accelerated projected gradient on the dual, in JAX) lies mostly in
   span{Θ_i}.
4. :func:`span_estimate` — minimum-norm points of random sub-polyhedra (subsets of the
   constraints) and their top ``heads`` principal directions (in place of the paper's
   membership-oracle queries).
5. :func:`search_in_span` — random restarts of variable projection restricted to that span (in
   place of the paper's net over m×m coefficients), each followed by least squares for W and a
   joint polish of all of Θ, and accepted only when every head satisfies K's constraints
   (within ``constraint_slack``) and the data are fitted within ``accept_tol`` (the
   certificate).

Every phase reports diagnostics (``Fit.info``); failures are data (``accepted = False``), never
exceptions. The pipeline never reads the teacher: its intermediate estimates (the ΣW estimates,
the certified rows, K's min-norm point, the span) are returned in ``Fit.estimates`` and scored
against the truth by the task (:func:`mhalearn.metrics.recovery.estimate_errors`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import in_range, positive_int
from mhalearn.data import same_token
from mhalearn.learners.base import Fit, Monitor, fit_from_history, nan_last
from mhalearn.learners.registry import register_learner
from mhalearn.learners.varpro import VarProConfig, levenberg_marquardt
from mhalearn.params import LayerParams
from mhalearn.problems import RegressionProblem
from mhalearn.solvers import box_qp, ridge_solve


class ChenLiConfig(eqx.Module):
    delta: float | Array = 0.1
    refit_rounds: int = eqx.field(static=True, default=30)
    refit_restarts: int = eqx.field(static=True, default=4)
    refit_noise: float | Array = 0.5
    quantile_start: float | Array = 0.5
    quantile_end: float | Array = 0.005
    certify_tol: float | Array = 0.01
    certify_gap: float | Array = 0.3
    max_rows: int = eqx.field(static=True, default=256)
    qp_iterations: int = eqx.field(static=True, default=600)
    span_subsets: int = eqx.field(static=True, default=4)
    subset_fraction: float | Array = 0.5
    candidates: int = eqx.field(static=True, default=2)
    candidate: VarProConfig = VarProConfig(iterations=10, restarts=1)
    accept_tol: float | Array = 1e-6
    constraint_slack: float | Array = 0.5
    polish: VarProConfig = VarProConfig(iterations=20, restarts=1)

    def __check_init__(self):
        in_range("delta", self.delta, 0.0, 0.5, open_low=True)
        names = (
            "refit_rounds",
            "refit_restarts",
            "max_rows",
            "qp_iterations",
            "span_subsets",
            "candidates",
        )
        for name in names:
            positive_int(name, getattr(self, name))
        for name in ("quantile_start", "quantile_end", "subset_fraction"):
            in_range(name, getattr(self, name), 0.0, 1.0, open_low=True)

    problems = (RegressionProblem,)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        """All phases in order; diagnostics of each in ``Fit.info``, the intermediate
        estimates in ``Fit.estimates``."""
        X, Y = problem.X, problem.Y
        k_refit, k_dedup, k_span, k_search = jax.random.split(key, 4)
        S0 = crude_sum_w(X, Y)
        S, _ = refine_sum_w_restarts(k_refit, X, Y, S0, self)
        cert = certify(X, Y, S, self)
        K = constraints(k_dedup, X, cert, self)
        basis, point = span_estimate(k_span, K, problem.heads, self)
        scale = jnp.linalg.norm(point)
        cand = search_in_span(k_search, problem, basis, scale, K, self)
        info = {
            "rows_certified": jnp.sum(cert.certified),
            "constraints_kept": jnp.sum(K.valid),
            "min_norm": scale,
            "span_cost": cand.span_cost,
            "candidate_cost": cand.cost,
            "candidates_accepted": cand.accepted_count,
            "accepted": cand.accepted,
        }
        estimates = {
            "crude_sum_w": S0,
            "refined_sum_w": S,
            "certified": cert.certified,
            "certified_token": cert.token,
            "certified_delta": jnp.asarray(self.delta, X.dtype),
            "min_norm_point": point,
            "span": basis,
        }
        params = LayerParams(theta=cand.theta, W=cand.W)
        return fit_from_history(
            params, cand.history, cand.converged, cand.iterations, monitor, info, estimates
        )


# ---- phase 1 -------------------------------------------------------------------------------


def crude_sum_w(
    X: Float[Array, "samples tokens dim"], Y: Float[Array, "samples tokens dim"]
) -> Float[Array, "dim dim"]:
    """M₀ = mean_n X_nᵀ Y_n: equals ΣW in expectation when attention is uniform."""
    return jnp.einsum("ntd,nte->de", X, Y) / X.shape[0]


# ---- phase 2 -------------------------------------------------------------------------------


def row_matches(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
) -> tuple[
    Int[Array, "samples tokens"], Float[Array, "samples tokens"], Float[Array, "samples tokens"]
]:
    """For each output row a: the token b minimising ‖Y_a − x_bᵀS‖, that residual, and the gap
    to the best token of a *different value* (inf when every token has the same value)."""
    pred = X @ S  # (samples, tokens b, dim)
    dist = jnp.linalg.norm(Y[:, :, None, :] - pred[:, None, :, :], axis=-1)  # (n, a, b)
    best = jnp.argmin(dist, axis=-1)
    best_dist = jnp.min(dist, axis=-1)
    same = same_token(X)  # (n, b, c)
    same_as_best = jnp.take_along_axis(same, best[:, :, None], axis=1)  # (n, a, c)
    other = jnp.min(jnp.where(same_as_best, jnp.inf, dist), axis=-1)
    return best, best_dist, other - best_dist


def row_scale(S: Float[Array, "dim dim"]) -> Float[Array, ""]:
    """Typical size of a row x_bᵀS for ±1 tokens: √dim·‖S‖₂."""
    return math.sqrt(S.shape[0]) * jnp.linalg.norm(S, ord=2)


def smallest_share(res: Float[Array, "samples tokens"], share) -> Bool[Array, "samples tokens"]:
    """The ⌈share·count⌉ rows (at least one) of smallest residual, ties broken by position and
    NaN last. (A threshold ``res <= quantile(res, share)`` can keep no row at all: with tied
    residuals the interpolated quantile can round below their common value.)"""
    flat = res.reshape(-1)
    keep = jnp.maximum(jnp.ceil(share * flat.size), 1)
    order = jnp.argsort(flat)  # stable, NaN last
    rank = jnp.zeros(flat.size, order.dtype).at[order].set(jnp.arange(flat.size))
    return (rank < keep).reshape(res.shape)


def refine_sum_w(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> tuple[Float[Array, "dim dim"], Float[Array, "rounds dim dim"]]:
    """Alternate matching rows to tokens and least squares for ΣW on the best-matching share
    of rows, that share shrinking geometrically from ``quantile_start`` to ``quantile_end``.
    Returns the final ΣW and the estimate after each round."""
    rounds = config.refit_rounds
    ratio = jnp.asarray(config.quantile_end / config.quantile_start)
    shares = config.quantile_start * ratio ** (jnp.arange(rounds) / max(rounds - 1, 1))

    def round_(S, share):
        best, res, _ = row_matches(X, Y, S)
        keep = smallest_share(res, share).astype(X.dtype)  # (n, a)
        xb = jnp.take_along_axis(X, best[..., None], axis=1)  # (n, a, dim): the matched tokens
        gram = jnp.einsum("na,nad,nae->de", keep, xb, xb)
        rhs = jnp.einsum("na,nad,nae->de", keep, xb, Y)
        S = ridge_solve(gram, rhs, 1e-9)
        return S, S

    return jax.lax.scan(round_, S0, shares)


def trimmed_residual(X, Y, S, share) -> Float[Array, ""]:
    """Mean residual of the best-matching ``share`` of rows, relative to √dim·‖S‖₂."""
    _, res, _ = row_matches(X, Y, S)
    keep = smallest_share(res, share)
    return jnp.sum(jnp.where(keep, res, 0.0)) / jnp.maximum(jnp.sum(keep), 1) / row_scale(S)


def refine_sum_w_restarts(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> tuple[Float[Array, "dim dim"], Float[Array, " restarts"]]:
    """:func:`refine_sum_w` from S0 and from ``refit_restarts − 1`` perturbations of it
    (relative size ``refit_noise``); keeps the estimate with the lowest trimmed residual (the
    refinement can stall at a wrong fixed point; a NaN score ranks last). Returns it and every
    start's score."""
    noise = draws.normal(key, (config.refit_restarts - 1, *S0.shape), S0.dtype)
    size = jnp.linalg.norm(S0) / S0.shape[0]
    starts = jnp.concatenate([S0[None], S0 + config.refit_noise * size * noise])
    finals = jax.vmap(lambda s: refine_sum_w(X, Y, s, config)[0])(starts)
    scores = jax.vmap(lambda s: trimmed_residual(X, Y, s, config.quantile_end))(finals)
    return finals[jnp.argmin(nan_last(scores))], scores


class Certificate(eqx.Module):
    certified: Bool[Array, "samples tokens"]  # row a of sample n is certified
    token: Int[Array, "samples tokens"]  # the token every head attends to there


def certify(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> Certificate:
    """Rows whose output is x_bᵀS within ``certify_tol``·scale, with a gap of at least
    ``certify_gap``·scale to every other token value (scale = √dim·‖S‖₂)."""
    best, res, gap = row_matches(X, Y, S)
    scale = row_scale(S)
    ok = (res <= config.certify_tol * scale) & (gap >= config.certify_gap * scale)
    return Certificate(certified=ok, token=best)


# ---- phase 3 -------------------------------------------------------------------------------


class Constraints(eqx.Module):
    G: Float[Array, "constraints params"]  # rows vec(x_a (x_b − x_c)ᵀ)
    valid: Bool[Array, " constraints"]  # certified, distinct tokens, first of its duplicates
    bound: Float[Array, ""]  # log((1−δ)/δ)


def constraints(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    cert: Certificate,
    config: ChenLiConfig,
) -> Constraints:
    """The polyhedron K: ⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for the first ``max_rows``
    certified rows and every token c of a different value, duplicates removed."""
    n, k, d = X.shape
    rows = min(config.max_rows, n * k)
    flat = cert.certified.reshape(-1)
    order = jnp.argsort(~flat, stable=True)[:rows]  # certified rows first
    sample, a = order // k, order % k
    x = X[sample]  # (rows, tokens, dim)
    xa = x[jnp.arange(rows), a]  # (rows, dim)
    b = cert.token.reshape(-1)[order]
    xb = x[jnp.arange(rows), b]
    diff = xb[:, None, :] - x  # (rows, c, dim)
    G = (xa[:, None, :, None] * diff[:, :, None, :]).reshape(rows * k, d * d)
    distinct = jnp.any(diff != 0, axis=-1).reshape(-1)
    valid = jnp.repeat(flat[order], k) & distinct
    # remove duplicates: equal rows have equal random projections
    h = jnp.where(valid, G @ draws.normal(key, (d * d,), G.dtype), jnp.inf)
    sort = jnp.argsort(h)
    first = jnp.concatenate([jnp.array([True]), h[sort][1:] != h[sort][:-1]])
    valid = valid & jnp.zeros_like(valid).at[sort].set(first)
    bound = jnp.log((1 - config.delta) / config.delta)
    return Constraints(G=G, valid=valid, bound=jnp.asarray(bound, G.dtype))


def min_norm_point(
    G: Float[Array, "constraints params"],
    valid: Bool[Array, " constraints"],
    bound: Float[Array, ""],
    iterations: int,
) -> Float[Array, " params"]:
    """argmin ‖θ‖ subject to G_c·θ ≥ bound for every valid c.

    The dual  max_{λ≥0} bound·Σλ − ½‖Gᵀλ‖²  (θ = Gᵀλ) by :func:`~mhalearn.solvers.box_qp`,
    step 1/‖G‖₂²; invalid rows are zeroed out. Returns zeros when there is no valid constraint.
    """
    G = jnp.where(valid[:, None], G, 0.0)
    b = jnp.where(valid, bound, 0.0)
    step = 1.0 / jnp.maximum(jnp.linalg.norm(G, ord=2) ** 2, jnp.finfo(G.dtype).tiny)
    return G.T @ box_qp(lambda z: G @ (G.T @ z), b, step, iterations)


# ---- phase 4 -------------------------------------------------------------------------------


def span_estimate(
    key: PRNGKeyArray, K: Constraints, heads: int, config: ChenLiConfig
) -> tuple[Float[Array, "heads params"], Float[Array, " params"]]:
    """Top ``heads`` principal directions of the minimum-norm points of K and of
    ``span_subsets`` random sub-polyhedra. Returns (orthonormal rows, K's min-norm point)."""
    full = min_norm_point(K.G, K.valid, K.bound, config.qp_iterations)
    keep = draws.bernoulli(key, config.subset_fraction, (config.span_subsets, K.valid.shape[0]))
    subsets = jax.vmap(lambda m: min_norm_point(K.G, K.valid & m, K.bound, config.qp_iterations))(
        keep
    )
    points = jnp.concatenate([full[None], subsets])
    _, _, vt = jnp.linalg.svd(points, full_matrices=False)
    return vt[:heads], full


# ---- phase 5 -------------------------------------------------------------------------------


def satisfies(K: Constraints, theta: Float[Array, "heads dim dim"], slack) -> Bool[Array, ""]:
    """Every head within ``slack`` of every valid constraint of K."""
    margins = theta.reshape(theta.shape[0], -1) @ K.G.T - K.bound  # (heads, constraints)
    return jnp.all(jnp.where(K.valid[None, :], margins >= -slack, True))


class Candidate(eqx.Module):
    theta: Float[Array, "heads dim dim"]
    W: Float[Array, "heads dim dim"]
    history: Float[Array, " iterations"]  # the chosen candidate's polish
    converged: Bool[Array, ""]
    iterations: Int[Array, ""]
    span_cost: Float[Array, ""]  # its cost at the end of the search inside the span
    cost: Float[Array, ""]  # after the joint polish
    accepted: Bool[Array, ""]  # some candidate carries the certificate
    accepted_count: Int[Array, ""]


def search_in_span(
    key: PRNGKeyArray,
    problem: RegressionProblem,
    basis: Float[Array, "heads params"],
    scale: Float[Array, ""],
    K: Constraints,
    config: ChenLiConfig,
) -> Candidate:
    """``candidates`` random restarts: variable projection with Θ_i = Σ_j C_ij V_j (V:
    ``basis``) from C ~ N(0, scale²/heads), then a joint polish of all of Θ. A candidate is
    accepted when its cost is ``<= accept_tol``·mean(Y²) and every head lies in K (within
    ``constraint_slack``); the accepted one with the lowest cost is returned (or, if none is
    accepted, the lowest-cost one, flagged)."""
    m = problem.heads
    d = problem.X.shape[-1]
    lift = jnp.kron(jnp.eye(m, dtype=basis.dtype), basis.T)  # vec(C) → vec(Θ)

    def one(k):
        C = scale / math.sqrt(m) * draws.normal(k, (m, m), basis.dtype)
        theta0 = (C @ basis).reshape(m, d, d)
        theta, _, inside_span, _, _ = levenberg_marquardt(problem, theta0, config.candidate, lift)
        theta, W, history, done, iters = levenberg_marquardt(problem, theta, config.polish)
        return theta, W, history, done, iters, inside_span[-1]

    thetas, Ws, histories, done, iters, span_costs = jax.vmap(one)(
        jax.random.split(key, config.candidates)
    )
    costs = histories[:, -1]
    fits = costs <= config.accept_tol * jnp.mean(problem.Y**2)
    inside = jax.vmap(lambda t: satisfies(K, t, config.constraint_slack))(thetas)
    accepted = fits & inside
    pick = jnp.where(
        jnp.any(accepted),
        jnp.argmin(jnp.where(accepted, costs, jnp.inf)),
        jnp.argmin(nan_last(costs)),
    )
    return Candidate(
        theta=thetas[pick],
        W=Ws[pick],
        history=histories[pick],
        converged=done[pick],
        iterations=iters[pick],
        span_cost=span_costs[pick],
        cost=costs[pick],
        accepted=jnp.any(accepted),
        accepted_count=jnp.sum(accepted),
    )


register_learner(
    "chen_li",
    lambda steps: ChenLiConfig(),
    lambda c: (
        f"certify-and-sculpt (phases 1–5), {c.candidates} candidates, then a "
        f"{c.polish.iterations}-it. VarPro polish"
    ),
)
