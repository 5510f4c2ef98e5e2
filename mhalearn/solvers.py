"""Small numerical solvers shared across layers, written once.

- :func:`ridge_solve`: the ridge-regularised normal equations, by Cholesky — the least-squares
  values of variable projection, the baselines and the pipeline's ΣW refits.
- :func:`box_qp`: a concave quadratic maximised over a box by accelerated projected gradient
  (FISTA) — the SVM dual of the NTK margin and the dual of the pipeline's min-norm point.
- the small factorisations of drawing and scoring — :func:`eigenvalues`, :func:`eigh`,
  :func:`singular_values`, :func:`svd`, :func:`spectral_norm`, :func:`orthonormal_basis`,
  :func:`least_squares` — jnp.linalg's, but under ``vmap`` on CPU one matrix after another
  (a batched LAPACK call there can wait for good: :func:`_one_at_a_time_on_cpu`). Every
  eigen-, singular-value and QR factorisation of the package goes through them; the Cholesky
  factors of :func:`ridge_solve` and variable projection's LU factors are taken once per
  instance and step, and the package never vmaps them on CPU (the engine runs a CPU group's
  instances as a loop).

All are matrix-free or O(p³) in a small p, pure and ``vmap``-able. An interior-point QP
(qpax) factors a dense KKT system of the constraint count (up to ~10³ here) at every
iteration; the duals here need only products with the constraint matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree


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


def _one_at_a_time_on_cpu(fn: Callable[..., PyTree]) -> Callable[..., PyTree]:
    """``fn`` (a function of arrays that calls LAPACK) with a batching rule of its own: under
    ``vmap`` on CPU the matrices are taken one after another (``lax.map`` of ``fn``), never as
    one batched call; on other platforms the batched call stays.

    jaxlib's batched LAPACK kernels split the batch over XLA:CPU's intra-op thread pool and
    wait for the pieces from a thread of that pool, so two such calls at once (two instance
    programs on two CPU devices of a two-core machine, or two independent calls of one
    program, which XLA:CPU runs concurrently) can hold every thread of the pool and wait for
    good. Seen with jax 0.10.2: the pipeline's min-norm points of random sub-polyhedra
    (eigenvalues, vmapped), and ``jit(vmap(parameter_errors))`` on 64–256 instances at
    heads 4, dim 16 (the span angle's two QR factorisations), which hung in most runs. Each
    matrix goes through the same LAPACK routine as in the batched call, so the values are the
    same, bit for bit (tested). Not differentiable (none of its uses is)."""
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        if not any(in_batched):
            out = wrapped(*args)
            return out, jax.tree.map(lambda _: False, out)
        args = [
            a if batched else jnp.broadcast_to(a, (axis_size, *jnp.shape(a)))
            for a, batched in zip(args, in_batched, strict=True)
        ]
        out = jax.lax.platform_dependent(
            *args,
            cpu=lambda *a: jax.lax.map(lambda one: wrapped(*one), a),
            default=jax.vmap(fn),
        )
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


@_one_at_a_time_on_cpu
def eigenvalues(a: Float[Array, "p p"]) -> Float[Array, " p"]:
    """The eigenvalues of the symmetric matrix ``a``, ascending (``jnp.linalg.eigvalsh``; under
    ``vmap`` on CPU one matrix after another, see :func:`_one_at_a_time_on_cpu`)."""
    return jnp.linalg.eigvalsh(a)


@_one_at_a_time_on_cpu
def eigh(a: Float[Array, "p p"]) -> tuple[Float[Array, " p"], Float[Array, "p p"]]:
    """Eigenvalues (ascending) and eigenvectors (columns) of the symmetric matrix ``a``
    (``jnp.linalg.eigh``; under ``vmap`` on CPU one matrix after another)."""
    return jnp.linalg.eigh(a)


@_one_at_a_time_on_cpu
def singular_values(a: Float[Array, "m n"]) -> Float[Array, " k"]:
    """The singular values of ``a``, descending (``jnp.linalg.svd`` without vectors; under
    ``vmap`` on CPU one matrix after another)."""
    return jnp.linalg.svd(a, compute_uv=False)


@_one_at_a_time_on_cpu
def svd(
    a: Float[Array, "m n"],
) -> tuple[Float[Array, "m k"], Float[Array, " k"], Float[Array, "k n"]]:
    """The thin singular value decomposition ``U, s, Vᵀ`` of ``a`` (``jnp.linalg.svd`` with
    ``full_matrices=False``; under ``vmap`` on CPU one matrix after another)."""
    return jnp.linalg.svd(a, full_matrices=False)


@_one_at_a_time_on_cpu
def spectral_norm(a: Float[Array, "m n"]) -> Float[Array, ""]:
    """‖a‖₂, the largest singular value (``jnp.linalg.norm(a, ord=2)``; under ``vmap`` on
    CPU one matrix after another)."""
    return jnp.linalg.norm(a, ord=2)


@_one_at_a_time_on_cpu
def orthonormal_basis(a: Float[Array, "m n"]) -> Float[Array, "m n"]:
    """The orthonormal factor Q of the thin QR factorisation of the tall ``a`` (m ≥ n): its
    columns span ``a``'s (``jnp.linalg.qr``; under ``vmap`` on CPU one matrix after
    another)."""
    return jnp.linalg.qr(a)[0]


@_one_at_a_time_on_cpu
def least_squares(a: Float[Array, "m n"], b: Float[Array, " m"]) -> Float[Array, " n"]:
    """The minimum-norm least-squares solution x of ``a x ≈ b`` (``jnp.linalg.lstsq``; under
    ``vmap`` on CPU one system after another)."""
    return jnp.linalg.lstsq(a, b)[0]
