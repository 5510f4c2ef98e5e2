"""The quantities the theory of Deora et al. speaks about, for one instance (reconstructed).

- NTK features (per-sample gradients of the score Φ with respect to the parameters, split into
  the U-part and the W-part) and their Gram matrix;
- the NTK margin γ = 1/√(Σα*) of the hard-margin SVM (no bias) on that Gram matrix, with a
  flag — not an exception — when the data are not separable;
- ‖∇²Φ‖ by power iteration on Hessian-vector products, and −λ_min(∇²L̂)/L̂;
- parameter movement ‖θ_t − θ₀‖ (U and W, absolute and relative);
- the stability proxy (η/n)·Σ_t L̂(θ_t), and whether a run was stable (monotone descent);
- attention mass on the relevant positions.

Every function is pure and ``vmap``-able.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from mhalearn import draws
from mhalearn.kernels import ClassifierSpec, classifier_attention, classifier_score
from mhalearn.params import ClassifierParams
from mhalearn.solvers import box_qp


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
    return features @ features.T


class SVMMargin(eqx.Module):
    margin: Float[Array, ""]  # γ = 1/√(Σα*); 0 when not separable
    separable: Bool[Array, ""]
    alpha_sum: Float[Array, ""]


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
    step = 1.0 / jnp.maximum(jnp.linalg.eigvalsh(Q)[-1], jnp.finfo(Q.dtype).tiny)
    alpha = box_qp(lambda a: Q @ a, jnp.ones_like(y), step, iterations, cap)
    total = jnp.sum(alpha)
    functional_margins = Q @ alpha  # y_i ⟨w, φ_i⟩
    separable = (total < 0.99 * cap) & jnp.all(functional_margins >= 1 - 1e-3)
    margin = jnp.where(separable, 1.0 / jnp.sqrt(jnp.maximum(total, jnp.finfo(y.dtype).tiny)), 0.0)
    return SVMMargin(margin=margin, separable=separable, alpha_sum=total)


def hessian_vector_product(
    f: Callable[[PyTree], Float[Array, ""]], params: PyTree, v: PyTree
) -> PyTree:
    return jax.jvp(jax.grad(f), (params,), (v,))[1]


def _flat_hvp(f, params: PyTree, key: PRNGKeyArray):
    """v ↦ ∇²f(params)·v on flattened parameters, and a random starting vector."""
    flat, unravel = ravel_pytree(params)

    def hvp(v):
        return ravel_pytree(hessian_vector_product(f, params, unravel(v)))[0]

    return hvp, draws.normal(key, flat.shape, flat.dtype)


def _power(matvec, v0: Float[Array, " p"], iterations: int) -> Float[Array, ""]:
    """Largest |eigenvalue| of a symmetric operator by power iteration (Rayleigh quotient)."""

    def body(v, _):
        w = matvec(v)
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(w.dtype).tiny), None

    v, _ = jax.lax.scan(body, v0 / jnp.linalg.norm(v0), None, iterations)
    return jnp.vdot(v, matvec(v))


def hessian_spectral_norm(
    f: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    iterations: int = 100,
) -> Float[Array, ""]:
    """‖∇²f(params)‖₂ by power iteration on Hessian-vector products (never forming ∇²f)."""
    hvp, v0 = _flat_hvp(f, params, key)
    return jnp.abs(_power(hvp, v0, iterations))


def hessian_min_eigenvalue(
    f: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    iterations: int = 100,
) -> Float[Array, ""]:
    """λ_min(∇²f) by power iteration on the shifted operator ‖∇²f‖·I − ∇²f."""
    k1, k2 = jax.random.split(key)
    top = hessian_spectral_norm(f, params, k1, iterations)
    hvp, v0 = _flat_hvp(f, params, k2)
    return top - _power(lambda v: top * v - hvp(v), v0, iterations)


def weak_convexity_ratio(
    loss: Callable[[PyTree], Float[Array, ""]],
    params: PyTree,
    key: PRNGKeyArray,
    iterations: int = 100,
) -> Float[Array, ""]:
    """−λ_min(∇²L̂)/L̂ at ``params`` (the self-bounded weak-convexity constant it bounds)."""
    return -hessian_min_eigenvalue(loss, params, key, iterations) / loss(params)


def movement(params: PyTree, start: PyTree) -> dict[str, Float[Array, ""]]:
    """‖θ − θ₀‖_F per parameter field (``movement_W``, ``movement_U``, …), absolute and
    relative to ‖θ₀‖_F (``inf`` when the field started at zero and moved)."""
    out = {}
    pairs = zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(start), strict=True)
    for (path, new), old in pairs:
        name = jax.tree_util.keystr(path, simple=True, separator="_")
        moved = jnp.linalg.norm((new - old).ravel())
        out[f"movement_{name}"] = moved
        out[f"movement_{name}_relative"] = moved / jnp.linalg.norm(old.ravel())
    return out


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
