"""Phases 1 and 2 of the certify-and-sculpt reconstruction: ΣW, and each head's values.

1. :func:`crude_sum_w` — ΣW ≈ M₀ = mean_n X_nᵀ Y_n (exact in expectation when attention is
   uniform; poor otherwise).
2. :func:`refine_sum_w_restarts` — ΣW refitted by least squares on the output rows that match
   x_bᵀ ΣW for one token b best, keeping a shrinking share of them, from a few perturbed starts
   (the best by trimmed residual is kept); :func:`head_values` does the same for each head's
   values W_i, for the heads' span methods (our extension of the outline).

Their settings are :class:`Refinement` and :class:`HeadValues`.
"""

from __future__ import annotations

import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn.data import same_token
from mhalearn.learners.base import nan_last
from mhalearn.solvers import eigenvalues, ridge_solve, spectral_norm


class Refinement(eqx.Module):
    """Phase 2's settings: ``rounds`` rounds from ``restarts`` starts (the first unperturbed,
    the others at relative size ``noise``), the share of rows kept shrinking geometrically from
    ``quantile_start`` to ``quantile_end``."""

    rounds: int = eqx.field(static=True, default=30)
    restarts: int = eqx.field(static=True, default=4)
    noise: float | Array = 0.5
    quantile_start: float | Array = 0.5
    quantile_end: float | Array = 0.005


class HeadValues(eqx.Module):
    """The heads' values fit's settings (:func:`head_values`): ``restarts`` starts, ``rounds``
    rounds, on the first ``samples`` samples (``None``: all)."""

    restarts: int = eqx.field(static=True, default=4)
    samples: int | None = eqx.field(static=True, default=30_000)
    rounds: int = eqx.field(static=True, default=60)


class Matches(eqx.Module):
    """For each output row a: each head's token (:func:`value_matches`; one token per row for
    :func:`row_matches`), the residual, and the gap to the best assignment of other values."""

    tokens: Int[Array, "samples tokens *heads"]
    residual: Float[Array, "samples tokens"]
    gap: Float[Array, "samples tokens"]


class Refined(eqx.Module):
    """A refinement's final estimate (ΣW, dim × dim, or the values, heads × dim × dim) and the
    estimate after each round."""

    estimate: Float[Array, "*heads dim dim"]
    history: Float[Array, "rounds *heads dim dim"]


class Best(eqx.Module):
    """The best of several refinements (lowest trimmed residual) and every start's score."""

    estimate: Float[Array, "*heads dim dim"]
    scores: Float[Array, " restarts"]


def crude_sum_w(
    X: Float[Array, "samples tokens dim"], Y: Float[Array, "samples tokens dim"]
) -> Float[Array, "dim dim"]:
    """M₀ = mean_n X_nᵀ Y_n: equals ΣW in expectation when attention is uniform."""
    return jnp.einsum("ntd,nte->de", X, Y) / X.shape[0]


def assignments(tokens: int, heads: int) -> np.ndarray:
    """Every way of giving each head one token: (tokens**heads, heads), the last head's token
    varying fastest."""
    return np.array(list(itertools.product(range(tokens), repeat=heads)), np.int32)


def value_matches(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    W: Float[Array, "heads dim dim"],
) -> Matches:
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
    return Matches(tokens=tokens, residual=best_dist, gap=other - best_dist)


def row_matches(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
) -> Matches:
    """For each output row a: the token b minimising ‖Y_a − x_bᵀS‖, that residual, and the gap
    to the best token of a *different value* (inf when every token has the same value)."""
    found = value_matches(X, Y, S[None])
    return Matches(tokens=found.tokens[..., 0], residual=found.residual, gap=found.gap)


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
    settings: Refinement,
    rounds: int | None = None,
) -> Refined:
    """Alternate matching rows to token assignments (:func:`value_matches`) and least squares
    for every W_i at once, Y_a ≈ Σ_i x_{b_i}ᵀ W_i, on the best-matching share of rows, that
    share shrinking geometrically from ``quantile_start`` to ``quantile_end`` over ``rounds``
    rounds (``None``: ``settings.rounds``). With one head (W0 = ΣW) this is
    :func:`refine_sum_w`. A round whose kept rows' tokens do not determine the values (their
    Gram matrix's smallest eigenvalue below :data:`DETERMINED` times its mean) leaves them
    unchanged: the rows of smallest residual can be a skewed few — at one head and β 8 the 60
    rows the last round kept spanned 5 of 8 dimensions, and their least squares left even the
    true ΣW for one with relative error 0.65. Returns the final values
    and the estimate after each round."""
    rounds = settings.rounds if rounds is None else rounds
    ratio = jnp.asarray(settings.quantile_end / settings.quantile_start)
    shares = settings.quantile_start * ratio ** (jnp.arange(rounds) / max(rounds - 1, 1))
    m, d = W0.shape[0], X.shape[-1]

    def round_(W, share):
        found = value_matches(X, Y, W)
        tokens, keep = found.tokens, smallest_share(found.residual, share).astype(X.dtype)  # (n, a)
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

    W, history = jax.lax.scan(round_, W0, shares)
    return Refined(estimate=W, history=history)


def refine_sum_w(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    settings: Refinement,
) -> Refined:
    """ΣW refitted on the rows where every head attends to one token: :func:`refine_values`
    with the heads taken as one. Returns the final ΣW and the estimate after each round."""
    found = refine_values(X, Y, S0[None], settings)
    return Refined(estimate=found.estimate[0], history=found.history[:, 0])


def trimmed_residual(X, Y, W, share) -> Float[Array, ""]:
    """Mean residual of the best-matching ``share`` of rows (assignments of the values ``W``,
    heads × dim × dim, or ΣW alone), relative to √dim·‖ΣW‖₂."""
    W = W if W.ndim == 3 else W[None]
    res = value_matches(X, Y, W).residual
    keep = smallest_share(res, share)
    return jnp.sum(jnp.where(keep, res, 0.0)) / jnp.maximum(jnp.sum(keep), 1) / row_scale(W.sum(0))


def refine_values_restarts(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    starts: Float[Array, "restarts heads dim dim"],
    settings: Refinement,
    rounds: int | None = None,
) -> Best:
    """:func:`refine_values` (``rounds`` rounds) from each start; keeps the estimate with the
    lowest trimmed residual (the refinement can stall at a wrong fixed point; a NaN score
    ranks last). Returns it and every start's score."""
    # one after another: vmapped, the rounds' products became batched ones, slower on CPU
    finals = jax.lax.map(lambda w: refine_values(X, Y, w, settings, rounds).estimate, starts)
    scores = jax.lax.map(lambda w: trimmed_residual(X, Y, w, settings.quantile_end), finals)
    return Best(estimate=finals[jnp.argmin(nan_last(scores))], scores=scores)


def refine_sum_w_restarts(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S0: Float[Array, "dim dim"],
    settings: Refinement,
) -> Best:
    """:func:`refine_sum_w` from S0 and from ``restarts − 1`` perturbations of it (relative
    size ``noise``), the best kept (:func:`refine_values_restarts`). Returns it and every
    start's score."""
    noise = draws.normal(key, (settings.restarts - 1, *S0.shape), S0.dtype)
    size = jnp.linalg.norm(S0) / S0.shape[0]
    starts = jnp.concatenate([S0[None], S0 + settings.noise * size * noise])
    best = refine_values_restarts(X, Y, starts[:, None], settings)
    return Best(estimate=best.estimate[0], scores=best.scores)


def head_values(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    heads: int,
    refinement: Refinement,
    settings: HeadValues,
) -> Best:
    """Each head's values W_i from the refined ΣW (our extension of the outline, for the
    heads' span methods): :func:`refine_values_restarts` (``settings.rounds`` rounds) on the
    first ``settings.samples`` samples from ``settings.restarts`` starts ΣW/m + noise of
    relative size ``refinement.noise`` (ΣW/m itself gives every head the same values, where every
    assignment ties). The rows it fits are those where each head attends to one token, the
    heads to different tokens or the same: ΣW's refinement with the consensus rows joined by
    the split ones. Returns the values (in an arbitrary order of the heads) and every
    start's score."""
    d = S.shape[0]
    noise = draws.normal(key, (settings.restarts, heads, d, d), S.dtype)
    size = jnp.linalg.norm(S) / d
    starts = S / heads + refinement.noise * size * noise
    first = X.shape[0] if settings.samples is None else settings.samples
    return refine_values_restarts(X[:first], Y[:first], starts, refinement, settings.rounds)
