"""Small numerical solvers shared across layers, written once.

- :func:`ridge_solve`: the ridge-regularised normal equations, by Cholesky — the least-squares
  values of variable projection, the baselines and the pipeline's ΣW refits.
- :func:`box_qp`: a concave quadratic maximised over a box by accelerated projected gradient
  (FISTA) — the SVM dual of the NTK margin and the dual of the pipeline's min-norm point.
- :func:`eigenvalues`: of a symmetric matrix, one matrix after another under ``vmap`` — the
  step size of those duals and the pipeline's test that its ΣW refits are determined.

All are matrix-free or O(p³) in a small p, pure and ``vmap``-able. An interior-point QP
(qpax) factors a dense KKT system of the constraint count (up to ~10³ here) at every
iteration; the duals here need only products with the constraint matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def ridge_solve(
    gram: Float[Array, "p p"], rhs: Float[Array, "p k"], ridge: float | Array
) -> Float[Array, "p k"]:
    """(G + ridge·scale·I)⁻¹ rhs with scale = trace(G)/p, the mean diagonal (a relative
    ridge, so the solve is defined when columns coincide), by Cholesky."""
    p = gram.shape[0]
    regularised = gram + ridge * (jnp.trace(gram) / p) * jnp.eye(p, dtype=gram.dtype)
    return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(regularised), rhs)


def box_qp(
    matvec: Callable[[Float[Array, " n"]], Float[Array, " n"]],
    linear: Float[Array, " n"],
    step: Float[Array, ""],
    iterations: int,
    upper: float | Array = jnp.inf,
    start: Float[Array, " n"] | None = None,
) -> Float[Array, " n"]:
    """argmax over 0 ≤ λ ≤ upper of ⟨linear, λ⟩ − ½ λᵀQλ (Q positive semi-definite, given by
    ``matvec``), by ``iterations`` FISTA steps of size ``step`` (at most 1/‖Q‖₂) from λ =
    ``start`` (default 0; a warm start is clipped into the box)."""

    def body(carry, _):
        lam, z, t = carry
        lam_new = jnp.clip(z + step * (linear - matvec(z)), 0.0, upper)
        t_new = (1 + jnp.sqrt(1 + 4 * t**2)) / 2
        return (lam_new, lam_new + ((t - 1) / t_new) * (lam_new - lam), t_new), None

    lam0 = jnp.zeros_like(linear) if start is None else jnp.clip(start, 0.0, upper)
    start = (lam0, lam0, jnp.asarray(1.0, linear.dtype))
    (lam, _, _), _ = jax.lax.scan(body, start, None, iterations)
    return lam


@jax.custom_batching.custom_vmap
def eigenvalues(a: Float[Array, "p p"]) -> Float[Array, " p"]:
    """The eigenvalues of the symmetric matrix ``a``, ascending (LAPACK's ``syevd`` on CPU).

    Under ``vmap`` the matrices are taken one after another (``lax.map`` of this unbatched
    function), never as one batched call: jaxlib's batched LAPACK kernels split the batch over
    XLA:CPU's intra-op thread pool and wait for the pieces from a thread of that pool, so two
    instance programs on two CPU devices of a two-core machine, each inside such a call, held
    both threads and waited for good (seen with the pipeline's min-norm points of random
    sub-polyhedra, vmapped, jax 0.10.2). Each matrix goes through the same routine as in the
    batched call, so the values are the same."""
    return jnp.linalg.eigvalsh(a)


@eigenvalues.def_vmap
def _eigenvalues_vmap(axis_size, in_batched, a):
    del axis_size
    (batched,) = in_batched
    if not batched:
        return eigenvalues(a), False
    return jax.lax.map(eigenvalues, a), True
