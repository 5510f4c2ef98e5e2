"""Phase 3 of the certify-and-sculpt reconstruction: the polyhedron K and queries to it.

Each certified (row a, token b) gives, for every distinct other token c,
⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ), valid for every head: a polyhedron K holding every Θ_i
(:func:`constraints`; duplicates removed; :func:`head_bodies`: one K_i per head). Its
minimum-norm point (a QP, solved by accelerated projected gradient on the dual, in JAX:
:func:`min_norm_point`) lies mostly in span{Θ_i}; the projections onto its recession cone
serve the span phase.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import choice
from mhalearn.learners.chen_li.certify import Certificate
from mhalearn.solvers import box_qp, eigenvalues


class Body(eqx.Module):
    """K's settings: the certificate's δ (its bound is log((1−δ)/δ)) and the first
    ``max_rows`` certified rows."""

    delta: float | Array = 0.1
    max_rows: int = eqx.field(static=True, default=256)


class QP(eqx.Module):
    """The queries' settings: ``iterations`` of the dual's projected gradient, their products
    in ``products`` (``"float32"``; ``None``: the problem's precision)."""

    iterations: int = eqx.field(static=True, default=600)
    products: str | None = eqx.field(static=True, default="float32")

    def __check_init__(self):
        if self.products is not None:
            choice("qp_products", self.products, ("float32",))


class Constraints(eqx.Module):
    """The polyhedron K (or, stacked on a leading axis, one K_i per head)."""

    G: Float[Array, "constraints params"]  # rows vec(x_a (x_b − x_c)ᵀ)
    valid: Bool[Array, " constraints"]  # certified, distinct tokens, first of its duplicates
    bound: Float[Array, ""]  # log((1−δ)/δ)
    rows: Bool[Array, "samples tokens"]  # the certified rows whose constraints K holds


def constraints(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    cert: Certificate,
    settings: Body,
) -> Constraints:
    """The polyhedron K: ⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for the first ``max_rows``
    certified rows and every token c of a different value, duplicates removed (a row per
    certified row and token c ≠ b; those of c with x_c = x_b, of uncertified rows and of
    duplicates are marked invalid)."""
    n, k, d = X.shape
    rows = min(settings.max_rows, n * k)
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
    bound = jnp.log((1 - settings.delta) / settings.delta)
    used = jnp.zeros(n * k, bool).at[order].set(flat[order]).reshape(n, k)
    return Constraints(G=G, valid=valid, bound=jnp.asarray(bound, G.dtype), rows=used)


def head_bodies(
    key: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    cert: Certificate,
    settings: Body,
) -> Constraints:
    """One polyhedron K_i per head (stacked on a leading axis), from rows certified by
    :func:`certify_values`: ⟨Θ_i, x_a(x_{b_i} − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for head i's own token
    b_i (:func:`constraints` for each head). K_i holds Θ_i alone — where K's constraints,
    valid for every head, come from the consensus rows only."""
    tokens = jnp.moveaxis(cert.token, -1, 0)  # (heads, samples, tokens)
    return jax.vmap(lambda t: constraints(key, X, Certificate(cert.certified, t), settings))(tokens)


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


def qp_body(K: Constraints, qp: QP) -> Constraints:
    """K in the precision of the queries (``qp.products``)."""
    if qp.products is None:
        return K
    low = jnp.dtype(qp.products)
    return dataclasses.replace(K, G=K.G.astype(low), bound=K.bound.astype(low))


def k_min_norm_point(K: Constraints, qp: QP) -> Float[Array, " params"]:
    """K's min-norm point p (:func:`min_norm_point` in the queries' precision, returned in
    K's)."""
    low = qp_body(K, qp)
    return min_norm_point(low.G, low.valid, low.bound, qp.iterations).astype(K.G.dtype)
