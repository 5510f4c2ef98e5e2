"""Token selection by attention, and the attention SVM it converges to in direction.

Tarzanagh, Li, Thrampoulidis & Oymak ("Transformers as Support Vector Machines") show that
gradient descent on the key·query matrix W of single-query attention converges in direction
to the solution of a max-margin problem that separates, for every sample i, its selected
token ``opt_i`` from the others:

    min ‖W‖  subject to  z_iᵀ W (x_{i,opt_i} − x_{i,j}) ≥ 1  for every i and j ≠ opt_i,

with ‖·‖ the Frobenius norm (the nuclear norm when W is trained as a product KQᵀ). Our
convention: query z scores token x as ``zᵀ W x``; the paper writes ``xᵀ W z``, so its W is
our ``Wᵀ`` (the solution here is the transpose of theirs, the correlations are the same).

Everything is for ONE head; map over heads with ``jax.vmap`` (each head with its own
selected tokens). Solved in JAX: the Frobenius problem through its dual, a box-constrained
QP (:func:`~mhalearn.solvers.box_qp`), then polished on the active set by conjugate
gradients; the nuclear problem by ADMM whose projections are that QP.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn.metrics.theory import lanczos_tridiagonal
from mhalearn.solvers import box_qp, eigh, singular_values, spectral_norm, svd

Norm = Literal["fro", "nuclear"]


def token_scores(
    W: Float[Array, "dim dim"], X: Float[Array, "n tokens dim"], Z: Float[Array, "n dim"]
) -> Float[Array, "n tokens"]:
    """``z_iᵀ W x_{i,j}``: the attention logit of every token j of every sample i."""
    return jnp.einsum("nd,de,nte->nt", Z, W, X)


def selected_tokens(
    W: Float[Array, "dim dim"], X: Float[Array, "n tokens dim"], Z: Float[Array, "n dim"]
) -> Int[Array, " n"]:
    """The token each sample's attention weights most (``argmax_j z_iᵀ W x_{i,j}``)."""
    return jnp.argmax(token_scores(W, X, Z), axis=-1)


def selected_weight(
    W: Float[Array, "dim dim"],
    X: Float[Array, "n tokens dim"],
    Z: Float[Array, "n dim"],
    selected: Int[Array, " n"],
) -> Float[Array, " n"]:
    """The softmax weight each sample puts on its ``selected`` token (1: hard selection)."""
    weights = jax.nn.softmax(token_scores(W, X, Z), axis=-1)
    return jnp.take_along_axis(weights, selected[:, None], axis=-1)[:, 0]


def direction_correlation(A: Float[Array, "*shape"], B: Float[Array, "*shape"]) -> Float[Array, ""]:
    """⟨A, B⟩ / (‖A‖_F ‖B‖_F): 1 when A and B point the same way."""
    norms = jnp.linalg.norm(A.ravel()) * jnp.linalg.norm(B.ravel())
    return jnp.vdot(A.ravel(), B.ravel()) / jnp.maximum(norms, jnp.finfo(A.dtype).tiny)


class AttentionSVM(eqx.Module):
    """The solution of the attention SVM and how well it was solved."""

    W: Float[Array, "dim dim"]  # the max-margin matrix (our convention: zᵀ W x), feasible
    multipliers: Float[Array, "n tokens"]  # dual variables λ_ij ≥ 0 (0 on selected tokens)
    # min over constraints of z_iᵀW(x_opt − x_j) of the solver's iterate (1: it was feasible);
    # W is that iterate divided by it, so W's smallest constraint value is exactly 1
    worst_margin: Float[Array, ""]
    objective: Float[Array, ""]  # ‖W‖ in the chosen norm
    # relative gap between ‖W‖ (of a feasible W) and a dual lower bound on the optimum:
    # ≥ 0 up to round-off, and W is that close to optimal
    gap: Float[Array, ""]
    polished: Bool[Array, ""]  # the active-set polish was accepted (Frobenius only)


def _constraints(X, Z, selected):
    """Differences D_ij = x_{i,opt_i} − x_{i,j}, the constraint mask (j ≠ opt_i), the
    operator λ ↦ Σ λ_ij z_i D_ijᵀ with its adjoint W ↦ (z_iᵀ W D_ij)_ij, and the dual's Gram
    operator on flat λ (the adjoint after the operator)."""
    D = jnp.take_along_axis(X, selected[:, None, None], axis=1) - X
    mask = jnp.arange(X.shape[1])[None, :] != selected[:, None]

    def combine(lam):  # Σ_ij λ_ij z_i D_ijᵀ
        return jnp.einsum("nd,nte,nt->de", Z, D, jnp.where(mask, lam, 0.0))

    def values(W):  # z_iᵀ W D_ij
        return jnp.where(mask, jnp.einsum("nd,de,nte->nt", Z, W, D), 0.0)

    def gram(v):  # flat λ ↦ values(combine(λ))
        return values(combine(v.reshape(mask.shape))).ravel()

    return mask, combine, values, gram


def _operator_norm(matvec, size, key, dtype) -> Float[Array, ""]:
    """‖Q‖₂ of the dual's Gram operator, by Lanczos (top Ritz value plus its residual, so a
    step of its inverse is safe)."""
    depth = min(32, size)
    T, last = lanczos_tridiagonal(matvec, key, size, depth, dtype)
    ritz, vectors = eigh(T)
    return ritz[-1] + last * jnp.abs(vectors[-1, -1])


def _frobenius(X, Z, selected, iterations, key):
    mask, combine, values, matvec = _constraints(X, Z, selected)
    shape = mask.shape
    dtype = X.dtype
    step = 1.0 / _operator_norm(matvec, mask.size, key, dtype)
    upper = jnp.where(mask, jnp.inf, 0.0).ravel()
    ones = mask.astype(dtype).ravel()
    lam = box_qp(matvec, ones, step, iterations, upper)
    # Polish: on the active set S the constraints hold with equality, so the multipliers
    # solve Q_SS μ = 1 — by conjugate gradients on the operator restricted to S.
    active = (lam > 1e-3 * jnp.max(lam)) & (upper > 0)

    def restricted(v):
        return jnp.where(active, matvec(jnp.where(active, v, 0.0)), v)

    mu, _ = jax.scipy.sparse.linalg.cg(
        restricted, jnp.where(active, 1.0, 0.0), x0=lam, tol=1e-14, maxiter=10 * lam.size
    )
    mu = jnp.where(active, mu, 0.0)
    W_fista, W_polish = combine(lam.reshape(shape)), combine(mu.reshape(shape))
    margin = lambda W: jnp.min(jnp.where(mask, values(W), jnp.inf))  # noqa: E731
    tol = 1e2 * jnp.finfo(dtype).eps ** 0.5
    polished = (margin(W_polish) >= 1 - tol) & (jnp.min(mu) >= -tol) & jnp.all(jnp.isfinite(mu))
    lam = jnp.where(polished, mu, lam)
    W = jnp.where(polished, W_polish, W_fista)
    worst = margin(W)
    W = W / worst  # feasible: its smallest constraint value is exactly 1
    primal = 0.5 * jnp.sum(W**2)
    dual = jnp.sum(lam) - 0.5 * jnp.sum(combine(lam.reshape(shape)) ** 2)
    return AttentionSVM(
        W=W,
        multipliers=lam.reshape(shape),
        worst_margin=worst,
        objective=jnp.sqrt(2 * primal),
        gap=(primal - dual) / primal,
        polished=polished,
    )


def _nuclear(X, Z, selected, iterations, key, rho):
    """ADMM on min ‖W‖_* + [A(V) ≥ 1] subject to W = V: singular-value thresholding for W,
    the Euclidean projection onto the constraints for V (its dual is the box QP, warm
    started), and the scaled multiplier U."""
    mask, combine, values, matvec = _constraints(X, Z, selected)
    shape = mask.shape
    step = 1.0 / _operator_norm(matvec, mask.size, key, X.dtype)
    upper = jnp.where(mask, jnp.inf, 0.0).ravel()
    ones = mask.astype(X.dtype).ravel()

    def project(C, lam):  # argmin ‖V − C‖ s.t. A(V) ≥ 1:  V = C + Aᵀλ
        lam = box_qp(matvec, ones - values(C).ravel(), step, 50, upper, start=lam)
        return C + combine(lam.reshape(shape)), lam

    def shrink(C):
        U, s, Vt = svd(C)
        return (U * jnp.maximum(s - 1.0 / rho, 0.0)) @ Vt

    def body(carry, _):
        V, U, lam = carry
        W = shrink(V - U)
        V, lam = project(W + U, lam)
        return (V, U + W - V, lam), None

    d = X.shape[-1]
    start = (jnp.zeros((d, d), X.dtype), jnp.zeros((d, d), X.dtype), jnp.zeros_like(ones))
    (V, _, lam), _ = jax.lax.scan(body, start, None, iterations)
    worst = jnp.min(jnp.where(mask, values(V), jnp.inf))
    W = V / worst  # feasible: its smallest constraint value is exactly 1
    objective = jnp.sum(singular_values(W))
    # A dual certificate: ν = ρU ∈ ∂‖W‖_* at the fixed point; rescaled to ‖ν‖₂ ≤ 1 it bounds
    # the optimum from below by ⟨ν, W⟩ / ‖ν‖₂ on the active constraints (weak duality).
    dual_lam = rho * lam
    M = combine(dual_lam.reshape(shape))
    dual = jnp.sum(dual_lam) / jnp.maximum(spectral_norm(M), jnp.finfo(X.dtype).tiny)
    return AttentionSVM(
        W=W,
        multipliers=dual_lam.reshape(shape),
        worst_margin=worst,
        objective=objective,
        gap=(objective - dual) / objective,
        polished=jnp.asarray(False),
    )


def attention_svm(
    X: Float[Array, "n tokens dim"],
    Z: Float[Array, "n dim"],
    selected: Int[Array, " n"],
    norm: Norm = "fro",
    iterations: int | None = None,
    key: PRNGKeyArray | None = None,
    rho: float = 1.0,
) -> AttentionSVM:
    """The attention SVM of one head: min ‖W‖ (``norm``: ``"fro"`` or ``"nuclear"``) s.t.
    ``z_iᵀ W (x_{i,selected_i} − x_{i,j}) ≥ 1`` for j ≠ selected_i.

    Frobenius: the dual max_{λ≥0} Σλ − ½‖Σ λ_ij z_i D_ijᵀ‖² by ``iterations`` (default 4000)
    FISTA steps, then the active set's equalities solved exactly (accepted when feasible with
    nonnegative multipliers: ``polished``). Nuclear: ``iterations`` (default 2000) ADMM steps
    with penalty ``rho``. ``key`` draws the Lanczos start of the step size (any key: the
    result does not depend on it beyond round-off). The problem is feasible whenever
    ``selected`` is the argmax of some W's scores (that W, scaled, satisfies it).
    """
    key = jax.random.key(0) if key is None else key
    if norm == "fro":
        return _frobenius(X, Z, selected, iterations or 4000, key)
    if norm == "nuclear":
        return _nuclear(X, Z, selected, iterations or 2000, key, rho)
    raise ValueError(f"norm must be 'fro' or 'nuclear', received {norm!r}")
