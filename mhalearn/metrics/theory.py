"""The quantities the theory of Deora et al. speaks about, for one instance (reconstructed).

- NTK features (per-sample gradients of the score Φ with respect to the parameters, split into
  the U-part and the W-part) and their Gram matrix;
- the NTK margin γ = 1/√(Σα*) of the hard-margin SVM (no bias) on that Gram matrix, with a
  flag — not an exception — when the data are not separable;
- the extreme eigenvalues of a Hessian by Lanczos on Hessian-vector products: ‖∇²Φ‖, and
  −λ_min(∇²L̂)/L̂;
- the stability proxy (η/n)·Σ_t L̂(θ_t), and whether a run was stable (monotone descent);
- attention mass on the relevant positions.

Every function is pure and ``vmap``-able. (Parameter movement ‖θ_t − θ₀‖ is a property of
the parameters: :func:`mhalearn.params.movement`.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from mhalearn import draws
from mhalearn.kernels import ClassifierSpec, classifier_attention, classifier_score
from mhalearn.params import ClassifierParams
from mhalearn.solvers import box_qp, eigenvalues, eigh


def ntk_features(
    params: ClassifierParams,
    X: Float[Array, "n tokens dim"],
    spec: ClassifierSpec,
    head_mask: Float[Array, " heads"] | None = None,
) -> dict[str, Float[Array, "n features"]]:
    """Per-sample gradients of Φ: ``{"U": ∂Φ/∂U, "W": ∂Φ/∂W (and ∂Φ/∂prompt), "all": both}``,
    each flattened to one row per sample."""

    def score(p, x):
        return classifier_score(x, p.W, p.U, spec, p.prompt, head_mask)

    grads = jax.vmap(jax.grad(score), in_axes=(None, 0))(params, X)
    flat = lambda tree: jax.vmap(lambda g: ravel_pytree(g)[0])(tree)  # noqa: E731
    u_part = flat(grads.U)
    w_part = flat((grads.W, grads.prompt))
    return {"U": u_part, "W": w_part, "all": jnp.concatenate([u_part, w_part], axis=1)}


def ntk_gram(features: Float[Array, "n features"]) -> Float[Array, "n n"]:
    """The NTK Gram matrix K = ΦΦᵀ of per-sample features (:func:`ntk_features`)."""
    return features @ features.T


class SVMMargin(eqx.Module):
    """The hard-margin SVM on a Gram matrix (:func:`svm_margin`)."""

    margin: Float[Array, ""]
    """γ = 1/√(Σα*); 0 when not separable."""
    separable: Bool[Array, ""]
    """The dual certifies separability (a certificate when true)."""
    alpha_sum: Float[Array, ""]
    """Σα* of the dual's solution."""


def svm_margin(
    gram: Float[Array, "n n"],
    y: Float[Array, " n"],
    iterations: int = 5000,
    cap: float = 1e8,
) -> SVMMargin:
    """Hard-margin SVM without bias on a Gram matrix, through its dual

        max_{α ≥ 0}  Σα − ½ αᵀ (yyᵀ ⊙ K) α,   margin γ = 1/‖w‖ = 1/√(Σα*)

    solved by accelerated projected gradient (:func:`~mhalearn.solvers.box_qp`). Separable data
    have a finite optimum; otherwise Σα grows without bound: the data are flagged not
    separable when Σα passes ``cap`` or the primal solution w = Σ α_i y_i φ_i misses some
    y_i⟨w, φ_i⟩ ≥ 1 by more than 1e-3.
    """
    Q = gram * (y[:, None] * y[None, :])
    step = 1.0 / jnp.maximum(eigenvalues(Q)[-1], jnp.finfo(Q.dtype).tiny)
    alpha = box_qp(lambda a: Q @ a, jnp.ones_like(y), step, iterations, cap)
    total = jnp.sum(alpha)
    functional_margins = Q @ alpha  # y_i ⟨w, φ_i⟩
    separable = (total < 0.99 * cap) & jnp.all(functional_margins >= 1 - 1e-3)
    margin = jnp.where(separable, 1.0 / jnp.sqrt(jnp.maximum(total, jnp.finfo(y.dtype).tiny)), 0.0)
    return SVMMargin(margin=margin, separable=separable, alpha_sum=total)


def hessian_vector_product(
    f: Callable[[PyTree], Float[Array, ""]], params: PyTree, v: PyTree
) -> PyTree:
    """∇²f(params)·v by forward-over-reverse differentiation, without forming the Hessian."""
    return jax.jvp(jax.grad(f), (params,), (v,))[1]


class HessianExtremes(eqx.Module):
    """The extreme eigenvalues of a Hessian from Lanczos, each with the residual norm of its
    Ritz pair: a true eigenvalue lies within ``*_residual`` of the estimate."""

    low: Float[Array, ""]
    high: Float[Array, ""]
    low_residual: Float[Array, ""]
    high_residual: Float[Array, ""]

    @property
    def norm(self) -> Float[Array, ""]:
        """The spectral norm max(|λ_min|, |λ_max|)."""
        return jnp.maximum(jnp.abs(self.low), jnp.abs(self.high))


#: Lanczos steps (Hessian-vector products) by default: on the classifier studies' problems
#: (up to several thousand parameters) both ends of the spectrum agree with a dense Hessian
#: far inside 1e-3 relative (tests/metrics/test_theory.py).
LANCZOS_MATVECS = 64


class Tridiagonal(NamedTuple):
    """Lanczos's tridiagonal T = QᵀAQ and the norm of its last residual."""

    matrix: Float[Array, "depth depth"]
    residual: Float[Array, ""]


def lanczos_tridiagonal(
    matvec: Callable[[Float[Array, " p"]], Float[Array, " p"]],
    key: PRNGKeyArray,
    p: int,
    depth: int,
    dtype,
) -> Tridiagonal:
    """``depth`` Lanczos steps on a symmetric operator of size ``p`` from a random start, with
    full reorthogonalisation (two Gram–Schmidt passes against every earlier vector).

    Returns the tridiagonal T = QᵀAQ and the norm of the last residual. When the Krylov space
    becomes invariant (a rank-deficient Hessian has few distinct eigenvalues), the next vector
    is a fresh random direction orthogonal to the basis and its coupling is 0, so T stays
    QᵀAQ (block diagonal) instead of amplifying round-off — which the library Lanczos we tried
    does (``matfree.decomp.tridiag_sym``: Ritz values 100× the spectrum at full depth).
    """
    k_start, k_fresh = jax.random.split(key)
    eps = jnp.finfo(dtype).eps

    def orthogonalise(Q, w):
        for _ in range(2):
            w = w - Q.T @ (Q @ w)
        return w

    def unit(v):
        return v / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(dtype).tiny)

    def body(i, state):
        Q, alpha, beta, scale = state
        w = matvec(Q[i])
        a = jnp.vdot(Q[i], w)
        w = orthogonalise(Q, w)
        b = jnp.linalg.norm(w)
        scale = jnp.maximum(scale, jnp.abs(a) + b)
        invariant = b <= 64 * eps * scale

        def fresh():  # only computed (unbatched) when the Krylov space turned invariant
            v = orthogonalise(Q, draws.normal(jax.random.fold_in(k_fresh, i), (p,), dtype))
            return unit(v)

        Q = Q.at[i + 1].set(jax.lax.cond(invariant, fresh, lambda: w / b))
        return Q, alpha.at[i].set(a), beta.at[i].set(jnp.where(invariant, 0.0, b)), scale

    Q = jnp.zeros((depth + 1, p), dtype).at[0].set(unit(draws.normal(k_start, (p,), dtype)))
    zeros = jnp.zeros(depth, dtype)
    _, alpha, beta, _ = jax.lax.fori_loop(0, depth, body, (Q, zeros, zeros, jnp.zeros((), dtype)))
    T = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
    return Tridiagonal(T, beta[-1])


def hessian_extremes(
    f: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    matvecs: int = LANCZOS_MATVECS,
) -> HessianExtremes:
    """λ_min and λ_max of ∇²f(params) by Lanczos (:func:`lanczos_tridiagonal`) on
    Hessian-vector products, never forming ∇²f; the Krylov depth is
    ``min(matvecs, number of parameters)``."""
    flat, unravel = ravel_pytree(params)
    depth = min(matvecs, flat.size)

    def hvp(v):
        return ravel_pytree(hessian_vector_product(f, params, unravel(v)))[0]

    T, last = lanczos_tridiagonal(hvp, key, flat.size, depth, flat.dtype)
    ritz, vectors = eigh(T)
    residual = last * jnp.abs(vectors[-1])  # ‖∇²f·y − θ·y‖ of each Ritz pair (θ, y)
    return HessianExtremes(
        low=ritz[0], high=ritz[-1], low_residual=residual[0], high_residual=residual[-1]
    )


def hessian_spectral_norm(
    f: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    matvecs: int = LANCZOS_MATVECS,
) -> Float[Array, ""]:
    """‖∇²f(params)‖₂ by Lanczos (:func:`hessian_extremes`)."""
    return hessian_extremes(f, params, key, matvecs).norm


def weak_convexity_ratio(
    loss: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    matvecs: int = LANCZOS_MATVECS,
) -> Float[Array, ""]:
    """−λ_min(∇²L̂)/L̂ at ``params`` (the self-bounded weak-convexity constant it bounds)."""
    return -hessian_extremes(loss, params, key, matvecs).low / loss(params)


def stability_proxy(lr: Float[Array, ""], samples: int, loss_sum: Float[Array, ""]):
    """(η/n)·Σ_t L̂(θ_t), from ``loss_sum`` = Σ_t L̂(θ_t) over every step (GD's
    ``Fit.info["loss_sum"]``); elementwise, so it takes arrays of runs too."""
    return lr / samples * loss_sum


def stable_steps(
    loss: Float[Array, "... steps"], diverged: Bool[Array, ...], rise_tol: float
) -> Bool[Array, ...]:
    """Whether each run was stable: finite (not ``diverged``) and its training loss, logged at
    every step, never rose by more than ``rise_tol`` relative (descent, as the smooth theory
    promises below 2/‖∇²L̂‖). Works on numpy arrays of many runs."""
    before, after = loss[..., :-1], loss[..., 1:]
    rises = (after - before > rise_tol * abs(before)).any(axis=-1)
    return (diverged == 0) & ~rises


def relevant_attention(
    params: ClassifierParams,
    X: Float[Array, "n tokens dim"],
    relevant: Bool[Array, "n tokens"],
    spec: ClassifierSpec,
    head_mask: Float[Array, " heads"] | None = None,
) -> Float[Array, ""]:
    """Mean over samples, active heads and queries of the attention on relevant positions."""
    A = jax.vmap(lambda x: classifier_attention(x, params.W, spec, params.prompt))(X)  # (n,h,q,t)
    mass = jnp.einsum("nhqt,nt->nhq", A, relevant.astype(A.dtype)).mean(axis=(0, 2))  # (heads,)
    mask = jnp.ones_like(mass) if head_mask is None else jnp.asarray(head_mask, mass.dtype)
    return jnp.sum(mask * mass) / jnp.maximum(jnp.sum(mask), 1)
