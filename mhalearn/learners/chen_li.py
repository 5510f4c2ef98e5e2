"""The certify-and-sculpt pipeline in the spirit of Chen & Li — a RECONSTRUCTION.

The paper's algorithm is known here only from its published outline (docs: The science, "What is
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
4. :func:`span_estimate` — an estimate of span{Θ_i} from queries to K (in place of the
   paper's membership-oracle queries), by one of seven methods (:data:`SPAN_METHODS`:
   min-norm points of random sub-polyhedra, projections onto K's recession cone, peeling
   active faces, hit-and-run samples of K ∩ ball, far points of a cross-section of the
   recession cone, and ``"heads"`` and ``"heads_subsets"``, our extension of the outline:
   :func:`head_values`, :func:`certify_values` and :func:`head_bodies` fit each head's values,
   certify rows head by head — those where the heads attend to different tokens too — and
   build one body K_i per head, whose min-norm points, or each K_i's ``"subsets"``
   direction, span the estimate); the ``sculpt`` study measures each one's angle to the
   truth.
5. :func:`search_in_span` — random restarts of variable projection restricted to that span (in
   place of the paper's net over m×m coefficients), W by least squares, and — in the default
   ``"polished"`` mode — a joint polish of all of Θ, which does the fitting at m ≥ 2 when the
   span is poor; ``mode="pure"`` keeps the search's result. A candidate is accepted only when
   every head satisfies K's constraints (within ``constraint_slack``) and the data are fitted
   within ``accept_tol`` (the certificate).

Every phase reports diagnostics (``Fit.info``); failures are data (``accepted = False``), never
exceptions. The pipeline never reads the teacher: its intermediate estimates (the ΣW estimates,
the certified rows, K's min-norm point, the span) are returned in ``Fit.estimates`` and scored
against the truth by the task (:func:`mhalearn.metrics.recovery.estimate_errors`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import choice, in_range, positive_int
from mhalearn.data import same_token
from mhalearn.learners.base import Fit, Monitor, fit_from_history, nan_last
from mhalearn.learners.registry import register_learner
from mhalearn.learners.varpro import STALL_PATIENCE, VarProConfig, levenberg_marquardt
from mhalearn.params import LayerParams
from mhalearn.problems import GivenStart, RegressionProblem
from mhalearn.solvers import box_qp, eigenvalues, ridge_solve, spectral_norm, svd

#: what follows the search inside the span (:func:`search_in_span`)
MODES = ("polished", "pure")
#: the pure mode's candidates stop once stalled (``VarProConfig.stall_tol``): inside an
#: inexact span the restricted minimum is no fit, and the rest of the budget would not move it
PURE_STALL = 1e-6


class ChenLiConfig(eqx.Module):
    """The pipeline's settings. ``span_method`` (one of :data:`SPAN_METHODS`, with
    ``span_queries`` queries, ``None``: :data:`DEFAULT_QUERIES`) chooses how phase 4 queries
    K. ``mode="polished"`` (the default) follows each candidate of the search inside the span
    by a ``polish`` — variable projection on all of Θ — which does the fitting at two heads and
    more; ``mode="pure"`` keeps the search's own result (Θ inside the span, W by least
    squares), so that the convex phases must do the work. ``span_report`` names further span
    methods whose estimates are computed from the same K and returned (``span_<method>`` in
    ``Fit.estimates``, for the ``sculpt`` study); they do not change the fit.
    ``qp_products="float32"`` (the default; ``None``: the problem's precision) runs phase 4 —
    its QPs, projections and walks on K — in float32, 1.5–1.9× faster
    (``benchmarks/pipeline_phases.py``); the points move by ~1e-5 relative, far below what an
    angle to the span resolves.
    ``search_samples`` (``None``: all) limits phase 5 — the search, its least squares and the
    certificate's fit check — to the first that many samples: the convex phases need many
    samples, a local search few, and its cost grows with them.
    ``values_restarts``, ``values_samples`` (``None``: all) and ``values_rounds`` set the
    per-head values' fit of the heads' span methods (:data:`HEAD_QUERIES`,
    :func:`head_values`)."""

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
    qp_products: str | None = eqx.field(static=True, default="float32")
    span_method: str = eqx.field(static=True, default="subsets")
    span_queries: int | None = eqx.field(static=True, default=None)
    subset_fraction: float | Array = 0.5
    sample_radius: float | Array = 4.0
    slice_radius: float | Array = 30.0
    slice_constraints: int = eqx.field(static=True, default=1024)
    candidates: int = eqx.field(static=True, default=2)
    candidate: VarProConfig = VarProConfig(iterations=10, restarts=1)
    accept_tol: float | Array = 1e-6
    constraint_slack: float | Array = 0.5
    polish: VarProConfig = VarProConfig(iterations=20, restarts=1)
    mode: str = eqx.field(static=True, default="polished")
    span_report: tuple[str, ...] = eqx.field(static=True, default=())
    search_samples: int | None = eqx.field(static=True, default=None)
    values_restarts: int = eqx.field(static=True, default=4)
    values_samples: int | None = eqx.field(static=True, default=30_000)
    values_rounds: int = eqx.field(static=True, default=60)

    def __check_init__(self):
        in_range("delta", self.delta, 0.0, 0.5, open_low=True)
        names = (
            "refit_rounds",
            "refit_restarts",
            "max_rows",
            "qp_iterations",
            "candidates",
            "slice_constraints",
            "values_restarts",
            "values_rounds",
        )
        for name in names:
            positive_int(name, getattr(self, name))
        choice("span_method", self.span_method, SPAN_METHODS)
        choice("mode", self.mode, MODES)
        if self.qp_products is not None:
            choice("qp_products", self.qp_products, ("float32",))
        if self.span_queries is not None:
            positive_int("span_queries", self.span_queries)
        for name in ("search_samples", "values_samples"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        in_range("sample_radius", self.sample_radius, 2.0, open_low=True)
        in_range("slice_radius", self.slice_radius, 0.0, open_low=True)
        for method in self.span_report:
            choice("span_report", method, SPAN_METHODS)
        for name in ("quantile_start", "quantile_end", "subset_fraction"):
            in_range(name, getattr(self, name), 0.0, 1.0, open_low=True)

    problems = (RegressionProblem,)

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        """All phases in order; diagnostics of each in ``Fit.info``, the intermediate
        estimates in ``Fit.estimates``. The pipeline derives its starts from the data: a
        :class:`~mhalearn.problems.GivenStart` is refused."""
        if isinstance(problem.start, GivenStart):
            raise ValueError(
                "start: the Chen–Li pipeline starts from its own convex phases, not from a "
                "GivenStart; give the start to variable projection or a GD learner"
            )
        X, Y = problem.X, problem.Y
        k_refit, k_dedup, k_span, k_search = jax.random.split(key, 4)
        S0 = crude_sum_w(X, Y)
        S, _ = refine_sum_w_restarts(k_refit, X, Y, S0, self)
        cert = certify(X, Y, S, self)
        K = constraints(k_dedup, X, cert, self)
        full = k_min_norm_point(K, self)  # every method's queries start from it
        methods = dict.fromkeys((self.span_method, *self.span_report))
        heads_info, heads_estimates, bodies = {}, {}, None
        if any(m in HEAD_QUERIES for m in methods):  # each head's values, rows and body
            values, head_cert, bodies = heads_phase(k_refit, k_dedup, X, Y, S, problem.heads, self)
            heads_info = {"rows_certified_heads": jnp.sum(head_cert.certified)}
            heads_estimates = {
                "values": values,
                "head_rows": bodies.rows,
                "head_token": head_cert.token,
            }
        spans = {
            method: span_estimate(
                k_span,
                K,
                problem.heads,
                dataclasses.replace(self, span_method=method),
                full,
                bodies,
            )
            for method in methods
        }
        basis, point = spans[self.span_method]
        compared = {f"span_{method}": spans[method][0] for method in self.span_report}
        scale = jnp.linalg.norm(point)
        cand = search_in_span(k_search, search_problem(problem, self), basis, scale, K, self)
        info = {
            "rows_certified": jnp.sum(cert.certified),
            "constraints_kept": jnp.sum(K.valid),
            "min_norm": scale,
            "span_cost": cand.span_cost,
            "candidate_cost": cand.cost,
            "candidates_accepted": cand.accepted_count,
            "accepted": cand.accepted,
            **heads_info,
        }
        estimates = {
            "crude_sum_w": S0,
            "refined_sum_w": S,
            "certified": cert.certified,
            "certified_token": cert.token,
            "certified_delta": jnp.asarray(self.delta, X.dtype),
            "in_k": K.rows,
            "min_norm_point": point,
            "span": basis,
            **compared,
            **heads_estimates,
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


def assignments(tokens: int, heads: int) -> np.ndarray:
    """Every way of giving each head one token: (tokens**heads, heads), the last head's token
    varying fastest."""
    return np.array(list(itertools.product(range(tokens), repeat=heads)), np.int32)


def value_matches(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    W: Float[Array, "heads dim dim"],
) -> tuple[
    Int[Array, "samples tokens heads"],
    Float[Array, "samples tokens"],
    Float[Array, "samples tokens"],
]:
    """For each output row a: the tokens (b_1, …, b_m) — one per head — minimising
    ‖Y_a − Σ_i x_{b_i}ᵀ W_i‖ (the row when head i attends to b_i alone), that residual, and the
    gap to the best assignment of different token *values* (some head's token of another
    value; inf when there is none). With one "head" W = ΣW this is :func:`row_matches`."""
    T = X.shape[1]
    m = W.shape[0]
    ways = assignments(T, m)
    pred = sum((X @ W[i])[:, ways[:, i]] for i in range(m))  # (samples, ways, dim)
    dist = jnp.linalg.norm(Y[:, :, None, :] - pred[:, None, :, :], axis=-1)  # (n, a, ways)
    best = jnp.argmin(dist, axis=-1)
    best_dist = jnp.min(dist, axis=-1)
    tokens = jnp.asarray(ways)[best]  # (n, a, heads)
    same = same_token(X)  # (n, b, c)
    alike = jnp.ones(dist.shape, bool)  # the assignment gives every head a token of its value
    for i in range(m):
        as_best = jnp.take_along_axis(same, tokens[..., i, None], axis=1)  # (n, a, c)
        alike = alike & as_best[..., ways[:, i]]
    other = jnp.min(jnp.where(alike, jnp.inf, dist), axis=-1)
    return tokens, best_dist, other - best_dist


def row_matches(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
) -> tuple[
    Int[Array, "samples tokens"], Float[Array, "samples tokens"], Float[Array, "samples tokens"]
]:
    """For each output row a: the token b minimising ‖Y_a − x_bᵀS‖, that residual, and the gap
    to the best token of a *different value* (inf when every token has the same value)."""
    tokens, res, gap = value_matches(X, Y, S[None])
    return tokens[..., 0], res, gap


def row_scale(S: Float[Array, "dim dim"]) -> Float[Array, ""]:
    """Typical size of a row x_bᵀS for ±1 tokens: √dim·‖S‖₂."""
    return math.sqrt(S.shape[0]) * spectral_norm(S)


def smallest_share(res: Float[Array, "samples tokens"], share) -> Bool[Array, "samples tokens"]:
    """The ⌈share·count⌉ rows (at least one) of smallest residual, ties broken by position and
    NaN last. (A threshold ``res <= quantile(res, share)`` can keep no row at all: with tied
    residuals the interpolated quantile can round below their common value.)

    The same rows as the first ⌈share·count⌉ of a stable argsort, without sorting: the k-th
    smallest value is found by bisection on the floats' order-preserving integer codes (one
    pass of comparisons per bit), and ties at it are taken by position. The refinement calls
    this 120 times per teacher; at 4·10⁵ rows a sort cost an order of magnitude more."""
    flat = res.reshape(-1)
    keep = jnp.maximum(jnp.ceil(share * flat.size), 1).astype(jnp.int32)
    code = order_code(flat)
    bits = 8 * code.dtype.itemsize

    def halve(_, bounds):  # invariant: count(code ≤ hi) ≥ keep > count(code ≤ lo − 1)
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(code <= mid, dtype=jnp.int32) >= keep
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    _, kth = jax.lax.fori_loop(0, bits, halve, (jnp.min(code), jnp.max(code)))
    tied = code == kth
    room = keep - jnp.sum(code < kth, dtype=jnp.int32)
    return ((code < kth) | (tied & (jnp.cumsum(tied, dtype=jnp.int32) <= room))).reshape(res.shape)


def order_code(x: Float[Array, " n"]) -> Array:
    """Unsigned integers in the order of the floats x (−0 and +0 equal, every NaN above +inf)."""
    unsigned = {4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    x = jnp.where(x == 0, jnp.zeros_like(x), x)
    raw = jax.lax.bitcast_convert_type(x, unsigned)
    sign = unsigned(1) << unsigned(8 * x.dtype.itemsize - 1)
    code = jnp.where((raw & sign) != 0, ~raw, raw | sign)  # negatives reversed below the positives
    return jnp.where(jnp.isnan(x), ~unsigned(0), code)


#: a refinement round solves for the values only when its kept tokens' Gram matrix has its
#: smallest eigenvalue above this share of its mean eigenvalue
DETERMINED = 1e-6


def refine_values(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    W0: Float[Array, "heads dim dim"],
    config: ChenLiConfig,
    rounds: int | None = None,
) -> tuple[Float[Array, "heads dim dim"], Float[Array, "rounds heads dim dim"]]:
    """Alternate matching rows to token assignments (:func:`value_matches`) and least squares
    for every W_i at once, Y_a ≈ Σ_i x_{b_i}ᵀ W_i, on the best-matching share of rows, that
    share shrinking geometrically from ``quantile_start`` to ``quantile_end`` over ``rounds``
    rounds (``None``: ``refit_rounds``). With one head (W0 = ΣW) this is
    :func:`refine_sum_w`. A round whose kept rows' tokens do not determine the values (their
    Gram matrix's smallest eigenvalue below :data:`DETERMINED` times its mean) leaves them
    unchanged: the rows of smallest residual can be a skewed few — at one head and β 8 the 60
    rows the last round kept spanned 5 of 8 dimensions, and their least squares left even the
    true ΣW for one with relative error 0.65. Returns the final values
    and the estimate after each round."""
    rounds = config.refit_rounds if rounds is None else rounds
    ratio = jnp.asarray(config.quantile_end / config.quantile_start)
    shares = config.quantile_start * ratio ** (jnp.arange(rounds) / max(rounds - 1, 1))
    m, d = W0.shape[0], X.shape[-1]

    def round_(W, share):
        tokens, res, _ = value_matches(X, Y, W)
        keep = smallest_share(res, share).astype(X.dtype)  # (n, a)
        # the matched tokens, head after head: (n, a, heads·dim)
        xb = jnp.concatenate(
            [jnp.take_along_axis(X, tokens[..., i, None], axis=1) for i in range(m)], axis=-1
        )
        rows = (keep[..., None] * xb).reshape(-1, xb.shape[-1])  # (n·a, heads·dim), 0 if not kept
        gram = rows.T @ xb.reshape(rows.shape)  # two plain products: ~4× faster than the
        rhs = rows.T @ Y.reshape(-1, d)  # einsum over (n, a) at N = 10⁵
        determined = eigenvalues(gram)[0] > DETERMINED * jnp.trace(gram) / gram.shape[0]
        W = jnp.where(determined, ridge_solve(gram, rhs, 1e-9).reshape(W.shape), W)
        return W, W

    return jax.lax.scan(round_, W0, shares)


def refine_sum_w(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> tuple[Float[Array, "dim dim"], Float[Array, "rounds dim dim"]]:
    """ΣW refitted on the rows where every head attends to one token: :func:`refine_values`
    with the heads taken as one. Returns the final ΣW and the estimate after each round."""
    S, history = refine_values(X, Y, S0[None], config)
    return S[0], history[:, 0]


def trimmed_residual(X, Y, W, share) -> Float[Array, ""]:
    """Mean residual of the best-matching ``share`` of rows (assignments of the values ``W``,
    heads × dim × dim, or ΣW alone), relative to √dim·‖ΣW‖₂."""
    W = W if W.ndim == 3 else W[None]
    _, res, _ = value_matches(X, Y, W)
    keep = smallest_share(res, share)
    return jnp.sum(jnp.where(keep, res, 0.0)) / jnp.maximum(jnp.sum(keep), 1) / row_scale(W.sum(0))


def refine_values_restarts(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    starts: Float[Array, "restarts heads dim dim"],
    config: ChenLiConfig,
    rounds: int | None = None,
) -> tuple[Float[Array, "heads dim dim"], Float[Array, " restarts"]]:
    """:func:`refine_values` (``rounds`` rounds) from each start; keeps the estimate with the
    lowest trimmed residual (the refinement can stall at a wrong fixed point; a NaN score
    ranks last). Returns it and every start's score."""
    # one after another: vmapped, the rounds' products became batched ones, slower on CPU
    finals = jax.lax.map(lambda w: refine_values(X, Y, w, config, rounds)[0], starts)
    scores = jax.lax.map(lambda w: trimmed_residual(X, Y, w, config.quantile_end), finals)
    return finals[jnp.argmin(nan_last(scores))], scores


def refine_sum_w_restarts(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> tuple[Float[Array, "dim dim"], Float[Array, " restarts"]]:
    """:func:`refine_sum_w` from S0 and from ``refit_restarts − 1`` perturbations of it
    (relative size ``refit_noise``), the best kept (:func:`refine_values_restarts`). Returns
    it and every start's score."""
    noise = draws.normal(key, (config.refit_restarts - 1, *S0.shape), S0.dtype)
    size = jnp.linalg.norm(S0) / S0.shape[0]
    starts = jnp.concatenate([S0[None], S0 + config.refit_noise * size * noise])
    best, scores = refine_values_restarts(X, Y, starts[:, None], config)
    return best[0], scores


def head_values(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    heads: int,
    config: ChenLiConfig,
) -> tuple[Float[Array, "heads dim dim"], Float[Array, " restarts"]]:
    """Each head's values W_i from the refined ΣW (our extension of the outline, for the
    heads' span methods): :func:`refine_values_restarts` (``values_rounds`` rounds) on the
    first ``values_samples`` samples from ``values_restarts`` starts ΣW/m + noise of relative
    size ``refit_noise`` (ΣW/m itself gives every head the same values, where every
    assignment ties). The rows it fits are those where each head attends to one token, the
    heads to different tokens or the same: ΣW's refinement with the consensus rows joined by
    the split ones. Returns the values (in an arbitrary order of the heads) and every
    start's score."""
    d = S.shape[0]
    noise = draws.normal(key, (config.values_restarts, heads, d, d), S.dtype)
    size = jnp.linalg.norm(S) / d
    starts = S / heads + config.refit_noise * size * noise
    first = X.shape[0] if config.values_samples is None else config.values_samples
    return refine_values_restarts(X[:first], Y[:first], starts, config, config.values_rounds)


class Certificate(eqx.Module):
    certified: Bool[Array, "samples tokens"]  # row a of sample n is certified
    # the token every head attends to there, or (``certify_values``) each head's token
    token: Int[Array, "samples tokens *heads"]


def certify_values(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    W: Float[Array, "heads dim dim"],
    config: ChenLiConfig,
) -> Certificate:
    """Rows whose output is Σ_i x_{b_i}ᵀW_i within ``certify_tol``·scale, with a gap of at
    least ``certify_gap``·scale to every assignment of other token values (scale =
    √dim·‖ΣW‖₂): each head i puts ≥ 1 − δ of the row on its own token b_i (``token``: the
    b_i, last axis the heads)."""
    tokens, res, gap = value_matches(X, Y, W)
    scale = row_scale(W.sum(0))
    ok = (res <= config.certify_tol * scale) & (gap >= config.certify_gap * scale)
    return Certificate(certified=ok, token=tokens)


def certify(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    config: ChenLiConfig,
) -> Certificate:
    """Rows whose output is x_bᵀS within ``certify_tol``·scale, with a gap of at least
    ``certify_gap``·scale to every other token value (scale = √dim·‖S‖₂): every head puts
    ≥ 1 − δ of the row on b (:func:`certify_values` with the heads taken as one)."""
    cert = certify_values(X, Y, S[None], config)
    return Certificate(certified=cert.certified, token=cert.token[..., 0])


# ---- phase 3 -------------------------------------------------------------------------------


class Constraints(eqx.Module):
    G: Float[Array, "constraints params"]  # rows vec(x_a (x_b − x_c)ᵀ)
    valid: Bool[Array, " constraints"]  # certified, distinct tokens, first of its duplicates
    bound: Float[Array, ""]  # log((1−δ)/δ)
    rows: Bool[Array, "samples tokens"]  # the certified rows whose constraints K holds


def constraints(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    cert: Certificate,
    config: ChenLiConfig,
) -> Constraints:
    """The polyhedron K: ⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for the first ``max_rows``
    certified rows and every token c of a different value, duplicates removed (a row per
    certified row and token c ≠ b; those of c with x_c = x_b, of uncertified rows and of
    duplicates are marked invalid)."""
    n, k, d = X.shape
    rows = min(config.max_rows, n * k)
    flat = cert.certified.reshape(-1)
    order = jnp.argsort(~flat, stable=True)[:rows]  # certified rows first
    sample, a = order // k, order % k
    x = X[sample]  # (rows, tokens, dim)
    xa = x[jnp.arange(rows), a]  # (rows, dim)
    b = cert.token.reshape(-1)[order]
    xb = x[jnp.arange(rows), b]
    c = (b[:, None] + jnp.arange(1, k)) % k  # the other tokens (c = b gives no constraint)
    diff = xb[:, None, :] - jnp.take_along_axis(x, c[..., None], axis=1)  # (rows, k − 1, dim)
    G = (xa[:, None, :, None] * diff[:, :, None, :]).reshape(rows * (k - 1), d * d)
    distinct = jnp.any(diff != 0, axis=-1).reshape(-1)
    valid = jnp.repeat(flat[order], k - 1) & distinct
    # remove duplicates: equal rows have equal random projections
    h = jnp.where(valid, G @ draws.normal(key, (d * d,), G.dtype), jnp.inf)
    sort = jnp.argsort(h)
    first = jnp.concatenate([jnp.array([True]), h[sort][1:] != h[sort][:-1]])
    valid = valid & jnp.zeros_like(valid).at[sort].set(first)
    bound = jnp.log((1 - config.delta) / config.delta)
    used = jnp.zeros(n * k, bool).at[order].set(flat[order]).reshape(n, k)
    return Constraints(G=G, valid=valid, bound=jnp.asarray(bound, G.dtype), rows=used)


def head_bodies(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    cert: Certificate,
    config: ChenLiConfig,
) -> Constraints:
    """One polyhedron K_i per head (stacked on a leading axis), from rows certified by
    :func:`certify_values`: ⟨Θ_i, x_a(x_{b_i} − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for head i's own token
    b_i (:func:`constraints` for each head). K_i holds Θ_i alone — where K's constraints,
    valid for every head, come from the consensus rows only."""
    tokens = jnp.moveaxis(cert.token, -1, 0)  # (heads, samples, tokens)
    return jax.vmap(lambda t: constraints(key, X, Certificate(cert.certified, t), config))(tokens)


def heads_phase(
    k_refit: PRNGKeyArray,
    k_dedup: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    heads: int,
    config: ChenLiConfig,
) -> tuple[Float[Array, "heads dim dim"], Certificate, Constraints]:
    """The own phase of the heads' span methods (:data:`HEAD_QUERIES`), as
    :meth:`ChenLiConfig.fit` runs it: each head's values (:func:`head_values`, key
    ``fold_in(k_refit, 1)``), the rows certified head by head (:func:`certify_values`) and the
    heads' bodies (:func:`head_bodies`, key ``k_dedup``)."""
    values, _ = head_values(jax.random.fold_in(k_refit, 1), X, Y, S, heads, config)
    cert = certify_values(X, Y, values, config)
    return values, cert, head_bodies(k_dedup, X, cert, config)


# ---- phase 4 -------------------------------------------------------------------------------

#: the span methods that query each head's own body K_i (:func:`head_bodies`, our extension),
#: and the one-head method each applies to every K_i (None: K_i's min-norm point alone)
HEAD_QUERIES = {"heads": None, "heads_subsets": "subsets"}

#: the span phase's methods (:func:`span_estimate`), each a way of querying the convex body K
#: (or, for those of :data:`HEAD_QUERIES`, the heads' own bodies)
SPAN_METHODS = ("subsets", "recession", "peel", "samples", "slice", *HEAD_QUERIES)

#: queries per method when ``span_queries`` is not given: QPs for "subsets" and "peel",
#: projections for "recession" and "slice", hit-and-run steps for "samples"; "heads" makes one
#: query (a min-norm point) to each head's own body, "heads_subsets" that many QPs to each
DEFAULT_QUERIES = {
    "subsets": 4,
    "recession": 64,
    "peel": 8,
    "samples": 4096,
    "slice": 256,
    "heads": 1,
    "heads_subsets": 16,
}


def _dual(G, valid, linear, iterations):
    """argmax over λ ≥ 0 of ⟨linear, λ⟩ − ½‖G̃ᵀλ‖² (G̃: G with invalid rows zeroed, whose
    multipliers stay 0), by :func:`~mhalearn.solvers.box_qp` with step 1/‖G̃‖₂². Returns
    (λ, G̃)."""
    G = jnp.where(valid[:, None], G, 0.0)
    linear = jnp.where(valid, linear, 0.0)
    # ‖G̃‖₂² from the small Gram matrix (a spectral norm of the tall G̃ itself goes through an
    # SVD whose memory grows with the square of the number of constraints)
    small = G.T @ G if G.shape[0] >= G.shape[1] else G @ G.T
    step = 1.0 / jnp.maximum(eigenvalues(small)[-1], jnp.finfo(G.dtype).tiny)
    return box_qp(lambda z: G @ (G.T @ z), linear, step, iterations), G


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
    lam, G = _dual(G, valid, jnp.full(valid.shape, bound, G.dtype), iterations)
    return G.T @ lam


def project_on_recession_cone(
    G: Float[Array, "constraints params"],
    valid: Bool[Array, " constraints"],
    u: Float[Array, " params"],
    iterations: int,
) -> Float[Array, " params"]:
    """The point of K's recession cone {v : G_c·v ≥ 0 for every valid c} nearest to ``u``:
    v = u + Gᵀλ with λ from the dual  max_{λ≥0} −⟨Gu, λ⟩ − ½‖Gᵀλ‖²."""
    lam, G = _dual(G, valid, -(G @ u), iterations)
    return u + G.T @ lam


def hit_and_run(
    key: PRNGKeyArray,
    K: Constraints,
    start: Float[Array, " params"],
    radius: Float[Array, ""],
    steps: int,
) -> Float[Array, "steps params"]:
    """``steps`` points of a hit-and-run walk on K ∩ {‖θ‖ ≤ radius} from ``start``: a uniform
    direction, then a uniform point of the chord through the current point (the chord's ends
    from K's constraints and the ball, in closed form). From a start outside the body (K's
    min-norm point p comes from a finite number of QP iterations, so 2p can miss some
    constraints) the chord is cut to the moves that worsen no violated constraint nor the
    distance outside the ball, so the walk stays where it is or moves towards the body; a
    chord with no such moves keeps the point. (Without the cut, a walk from outside K grew
    without bound, to infinities and NaN: seen in 1–8 of 192 teachers per one-head cell of
    the sculpt study.)"""
    G = jnp.where(K.valid[:, None], K.G, 0.0)

    def step(x, k):
        k_dir, k_pos = jax.random.split(k)
        u = draws.normal(k_dir, x.shape, x.dtype)
        u = u / jnp.linalg.norm(u)
        slack, rate = G @ x - K.bound, G @ u  # slack ≥ 0 on valid rows; invalid rows: rate 0
        ahead = jnp.min(jnp.where(rate < 0, slack / jnp.where(rate < 0, -rate, 1.0), jnp.inf))
        behind = jnp.min(jnp.where(rate > 0, slack / jnp.where(rate > 0, rate, 1.0), jnp.inf))
        xu = x @ u
        half = jnp.sqrt(jnp.maximum(xu**2 - (x @ x - radius**2), 0.0))
        ahead, behind = jnp.minimum(ahead, half - xu), jnp.minimum(behind, half + xu)
        ahead, behind = jnp.maximum(ahead, 0.0), jnp.maximum(behind, 0.0)  # see above
        x = x + (draws.uniform(k_pos, (), x.dtype) * (ahead + behind) - behind) * u
        return x, x

    _, points = jax.lax.scan(step, start, jax.random.split(key, steps))
    return points


def complement_basis(p: Float[Array, " params"]) -> Float[Array, "params rest"]:
    """Orthonormal columns spanning the complement of the unit vector ``p`` (the columns of a
    Householder reflection that maps e₁ to ±p, less the first)."""
    e1 = jnp.zeros_like(p).at[0].set(1.0)
    v = p + jnp.where(p[0] >= 0, 1.0, -1.0) * e1
    H = jnp.eye(p.shape[0], dtype=p.dtype) - 2 * jnp.outer(v, v) / (v @ v)
    return H[:, 1:]


def slice_points(
    K: Constraints,
    normal: Float[Array, " params"],
    targets: Float[Array, "queries rest"],
    keep: int,
    iterations: int,
) -> tuple[Float[Array, "queries rest"], Float[Array, "params rest"]]:
    """The points of the cross-section {v : ⟨v, normal⟩ = 1, G_c·v ≥ 0} of K's recession cone
    nearest to each of ``targets``, in the coordinates w of v = normal + B w (B:
    :func:`complement_basis`); far targets land on its far boundary (near its extreme points
    in their directions). Only the ``keep`` valid constraints with the least normalised slack
    at ``normal`` enter (those that can bind nearby). Returns (points w, B)."""
    B = complement_basis(normal)
    slack = K.G @ normal
    score = jnp.where(K.valid, slack / jnp.linalg.norm(K.G, axis=1).clip(1e-30), jnp.inf)
    near = jnp.argsort(score)[: min(keep, score.shape[0])]
    GB, offset, valid = K.G[near] @ B, slack[near], K.valid[near]

    def project(c):  # nearest w to c with GB·w + offset ≥ 0
        lam, Gt = _dual(GB, valid, -offset - GB @ c, iterations)
        return c + Gt.T @ lam

    return jax.vmap(project)(targets), B


def principal_directions(points: Float[Array, "points params"], k: int):
    """The top ``k`` right singular vectors of ``points`` (orthonormal rows): the directions
    of largest second moment about the origin."""
    _, _, vt = svd(points)
    return vt[:k]


def qp_body(K: Constraints, config: ChenLiConfig) -> Constraints:
    """K in the precision of phase 4 (``config.qp_products``)."""
    if config.qp_products is None:
        return K
    low = jnp.dtype(config.qp_products)
    return dataclasses.replace(K, G=K.G.astype(low), bound=K.bound.astype(low))


def k_min_norm_point(K: Constraints, config: ChenLiConfig) -> Float[Array, " params"]:
    """K's min-norm point p (:func:`min_norm_point` in phase 4's precision, returned in K's)."""
    low = qp_body(K, config)
    return min_norm_point(low.G, low.valid, low.bound, config.qp_iterations).astype(K.G.dtype)


def span_estimate(
    key: PRNGKeyArray,
    K: Constraints,
    heads: int,
    config: ChenLiConfig,
    point: Float[Array, " params"] | None = None,
    bodies: Constraints | None = None,
) -> tuple[Float[Array, "heads params"], Float[Array, " params"]]:
    """An estimate of span{Θ_i} by queries to K, the method ``config.span_method``; returns
    (orthonormal rows, K's min-norm point p). Every method takes the top ``heads`` principal
    directions of the points its queries return:

    - ``"subsets"``: the min-norm points of K and of random sub-polyhedra (each constraint kept
      with probability ``subset_fraction``);
    - ``"recession"``: the projections of uniform random directions onto K's recession cone
      {v : G_c·v ≥ 0}, which holds every Θ_i (each satisfies every constraint with margin, so
      does every multiple of it) and, as constraints accumulate, little else;
    - ``"peel"``: p, then the min-norm point of K without the constraints active at the last
      point, and so on (each round peels the face the last point sat on);
    - ``"samples"``: a hit-and-run walk on K ∩ {‖θ‖ ≤ ``sample_radius``·‖p‖} from 2p (the
      second half of its steps), the body's directions of largest extent;
    - ``"slice"``: p itself, and the top ``heads − 1`` principal directions (about their
      mean) of the points of the cross-section of K's recession cone through p/‖p‖ nearest
      to points at distance ``slice_radius`` in uniform random directions
      (:func:`slice_points`, with the ``slice_constraints`` nearest constraints). As
      constraints accumulate the recession cone shrinks towards cone{Θ_i} (a consensus row's
      constraint holds with margin for every head, and for a direction far outside the span
      some certified row violates it), so its cross-section shrinks towards the polytope of
      the heads' directions, widened in every direction by how far a head can turn before
      some certified row's score difference reaches 0 (a width that more rows do not remove:
      certified margins are at least about log((1−δ)/δ), of order 1/β in units of ‖Θ_i‖):
      that polytope's own extent is what principal directions about the mean see first. The
      angle of p itself to the span then bounds the estimate's;
    - ``"heads"``: the min-norm points p_i of the heads' own bodies K_i (``bodies``:
      :func:`head_bodies`, from the rows :func:`certify_values` certifies with each head's
      values from :func:`head_values` — our extension of the outline). A row on which the
      heads attend sharply to *different* tokens (Y_a = Σ_i x_{b_i}ᵀW_i) is no consensus row,
      so K never sees it; with each head's values known it certifies every head's own token,
      and K_i, which holds Θ_i alone, has no other head to stretch towards: each p_i is a
      one-head problem's min-norm point, and span{p_i} the estimate. At two heads and β 4
      split rows are as common as consensus ones or more (``rows_certified_heads`` against
      ``rows_certified``), and K_i's min-norm point need not share the bias by which K's
      sits off the span (the ``sculpt`` study measures both);
    - ``"heads_subsets"``: ``"heads"`` with each K_i queried by ``"subsets"`` (its min-norm
      point and those of ``span_queries`` random halves of it, from a key per head) instead
      of its min-norm point alone: one direction per head, the top principal direction of
      that head's points (our extension, as ``"heads"``). At one head the methods that
      combine several points of K average some of p's error away (0.4–0.7 times K's tilt,
      notebook 03); each K_i is a one-head body.

    A single point of K can sit as far off the span as K's own resolution at the heads — how
    far a head can turn away from the span and still satisfy every constraint
    (:func:`~mhalearn.metrics.recovery.constraint_tilt`, reported as ``k_tilt``); only a
    method that averages over many points of K can do better (at one head ``peel`` and
    ``subsets`` reach 0.4–0.7 times it, notebook 03). Certified
    rows are those where every head's attention is nearly one-hot, so their margins in units
    of ‖Θ_i‖ shrink like 1/β: the span phase needs sharp attention (measured in notebook 03).

    Why these might find the span (our reconstruction, a heuristic): every Θ_i satisfies
    every constraint with margin, and as constraints accumulate the directions far from every
    head are cut away, so K and its recession cone gather around cone{Θ_i}, up to K's
    resolution at the heads; a query built from K alone (a min-norm point, a projection
    averaged over directions, the walk's second moments) lands near that cone. Nothing forces
    it into the span beyond that: rotating the inputs, x → Ux, turns the K of heads Θ_i into
    the K of heads UᵀΘ_iU, so the inputs' symmetry fixes span{Θ_i} only for the U with
    UᵀΘ_iU = Θ_i (for generic heads, ±I alone). K need not be symmetric about the span, and
    a point such as p can sit off it by a bias that more constraints do not remove. Which
    method reaches the span at which N is measured by the ``sculpt`` study.

    ``point``: p when already known (:func:`k_min_norm_point`; several methods on one K share
    it). The queries run in ``config.qp_products``; the results come back in K's precision.
    ``bodies``: the heads' own bodies (:func:`head_bodies`), which the methods of
    :data:`HEAD_QUERIES` need."""
    queries = config.span_queries or DEFAULT_QUERIES[config.span_method]
    its = config.qp_iterations
    dtype = K.G.dtype
    full = (k_min_norm_point(K, config) if point is None else point).astype(dtype)
    K = qp_body(K, config)
    low_p = full.astype(K.G.dtype)
    if config.span_method in HEAD_QUERIES:
        if bodies is None:
            raise ValueError(
                f'span_method "{config.span_method}": give the heads\' own bodies (head_bodies)'
            )
        inner = HEAD_QUERIES[config.span_method]
        if inner is None:
            points = jax.vmap(lambda B: k_min_norm_point(B, config))(bodies)
        else:  # the one-head method's direction in each K_i, each from a key of its own
            one = dataclasses.replace(config, span_method=inner, span_queries=queries)
            keys = jax.random.split(key, bodies.bound.shape[0])
            points = jax.vmap(lambda k, B: span_estimate(k, B, 1, one)[0][0])(keys, bodies)
    elif config.span_method == "subsets":
        keep = draws.bernoulli(key, config.subset_fraction, (queries, K.valid.shape[0]))
        subsets = jax.vmap(lambda m: min_norm_point(K.G, K.valid & m, K.bound, its))(keep)
        points = jnp.concatenate([low_p[None], subsets])
    elif config.span_method == "recession":
        u = draws.normal(key, (queries, low_p.shape[0]), dtype)  # the same in every precision
        u = (u / jnp.linalg.norm(u, axis=1, keepdims=True)).astype(low_p.dtype)
        points = jax.vmap(lambda v: project_on_recession_cone(K.G, K.valid, v, its))(u)
    elif config.span_method == "peel":

        def peel(valid, _):
            lam, _ = _dual(K.G, valid, jnp.full(valid.shape, K.bound, K.G.dtype), its)
            point = jnp.where(valid[:, None], K.G, 0.0).T @ lam
            active = lam > 1e-6 * jnp.max(lam)
            return valid & ~active, point

        _, points = jax.lax.scan(peel, K.valid, None, queries)
    elif config.span_method == "slice":
        normal = low_p / jnp.maximum(jnp.linalg.norm(low_p), jnp.finfo(low_p.dtype).tiny)
        c = draws.normal(key, (queries, normal.shape[0] - 1), dtype)
        c = (config.slice_radius * c / jnp.linalg.norm(c, axis=1, keepdims=True)).astype(
            low_p.dtype
        )
        w, B = slice_points(K, normal, c, config.slice_constraints, its)
        inside = principal_directions(w - w.mean(0), heads - 1) @ B.T
        return jnp.concatenate([normal[None], inside]).astype(dtype), full
    else:
        radius = config.sample_radius * jnp.linalg.norm(low_p)
        points = hit_and_run(key, K, 2 * low_p, radius, queries)[queries // 2 :]
    return principal_directions(points.astype(dtype), heads), full


# ---- phase 5 -------------------------------------------------------------------------------


def satisfies(K: Constraints, theta: Float[Array, "heads dim dim"], slack) -> Bool[Array, ""]:
    """Every head within ``slack`` of every valid constraint of K."""
    margins = theta.reshape(theta.shape[0], -1) @ K.G.T - K.bound  # (heads, constraints)
    return jnp.all(jnp.where(K.valid[None, :], margins >= -slack, True))


def search_problem(problem: RegressionProblem, config: ChenLiConfig) -> RegressionProblem:
    """The samples phase 5 sees: the first ``config.search_samples`` (all when ``None``)."""
    first = config.search_samples
    if first is None or first >= problem.samples:
        return problem
    return eqx.tree_at(lambda p: (p.X, p.Y), problem, (problem.X[:first], problem.Y[:first]))


class Candidate(eqx.Module):
    theta: Float[Array, "heads dim dim"]
    W: Float[Array, "heads dim dim"]
    history: Float[Array, " iterations"]  # the chosen candidate's last solve (see the mode)
    converged: Bool[Array, ""]
    iterations: Int[Array, ""]
    span_cost: Float[Array, ""]  # its cost at the end of the search inside the span
    cost: Float[Array, ""]  # its final cost (after the polish in the polished mode)
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
    ``basis``) from C ~ N(0, scale²/heads) (W by least squares at every step), then — in the
    polished mode only — a joint polish of all of Θ. A candidate is
    accepted when its cost is ``<= accept_tol``·mean(Y²) and every head lies in K (within
    ``constraint_slack``); the accepted one with the lowest cost is returned (or, if none is
    accepted, the lowest-cost one, flagged)."""
    m = problem.heads
    d = problem.X.shape[-1]
    lift = jnp.kron(jnp.eye(m, dtype=basis.dtype), basis.T)  # vec(C) → vec(Θ)

    def one(k):
        C = scale / math.sqrt(m) * draws.normal(k, (m, m), basis.dtype)
        theta0 = (C @ basis).reshape(m, d, d)
        found = levenberg_marquardt(problem, theta0, config.candidate, lift)
        span_cost = found[2][-1]
        if config.mode == "pure":
            return (*found, span_cost)
        return (*levenberg_marquardt(problem, found[0], config.polish), span_cost)

    # one after another, so that each candidate stops on its own (vmapped, all ran as long as
    # the slowest, and both branches of every step's conditionals ran)
    thetas, Ws, histories, done, iters, span_costs = jax.lax.map(
        one, jax.random.split(key, config.candidates)
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


def describe(config: ChenLiConfig) -> str:
    """What ran: the span method, the candidates and the mode."""
    search = (
        f"certify-and-sculpt (phases 1–5), span by {config.span_method}, {config.candidates} "
        f"candidates × {config.candidate.iterations} it. inside the span"
    )
    if config.candidate.stall_tol is not None:
        search += (
            f" (each stops once {STALL_PATIENCE} iterations in a row lower the cost by < "
            f"{config.candidate.stall_tol:g} relative)"
        )
    if config.mode == "pure":
        return search + ", pure (no polish)"
    return (
        search + f", then a {config.polish.iterations}-it. VarPro polish on all of Θ (the "
        "package's hybrid, not the paper's algorithm)"
    )


register_learner("chen_li", lambda steps: ChenLiConfig(), describe)
register_learner(
    "chen_li_pure",
    lambda steps: ChenLiConfig(
        mode="pure",
        candidates=4,
        candidate=VarProConfig(iterations=20, restarts=1, stall_tol=PURE_STALL),
    ),
    describe,
)
