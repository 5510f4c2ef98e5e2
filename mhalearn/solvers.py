"""Small numerical solvers shared across layers, written once.

- :func:`ridge_solve`: the ridge-regularised normal equations, by Cholesky — the least-squares
  values of variable projection, the baselines and the pipeline's ΣW refits.
- :func:`box_qp`: a concave quadratic maximised over a box by accelerated projected gradient
  (FISTA) — the SVM dual of the NTK margin and the dual of the pipeline's min-norm point.
- the small factorisations of drawing and scoring — :func:`eigenvalues`, :func:`eigh`,
  :func:`singular_values`, :func:`svd`, :func:`spectral_norm`, :func:`orthonormal_basis`,
  :func:`least_squares` — jnp.linalg's, but under ``vmap`` batched as each platform allows
  (:func:`_batched_per_platform`): on CPU one matrix after another (a batched LAPACK call
  there can wait for good), on an accelerator from pieces cuSOLVER takes as one batched call
  (:func:`householder_qr` and a factorisation of the small side) where it would otherwise
  loop over the batch. Every eigen-, singular-value and QR factorisation of the package goes
  through them; the Cholesky factors of :func:`ridge_solve` and variable projection's LU
  factors are taken once per instance and step, and the package never vmaps them on CPU (the
  engine runs a CPU group's instances as a loop).

The factorisations return named tuples (:class:`QR`, :class:`SVD`, :class:`Eigh`), like
jnp.linalg's: read by field or unpacked in order.

All are matrix-free or O(p³) in a small p, pure and ``vmap``-able. An interior-point QP
(qpax) factors a dense KKT system of the constraint count (up to ~10³ here) at every
iteration; the duals here need only products with the constraint matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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


class QR(NamedTuple):
    """The thin QR factorisation a = q r."""

    q: Float[Array, "m n"]
    r: Float[Array, "n n"]


class SVD(NamedTuple):
    """The thin singular value decomposition a = u diag(s) vt."""

    u: Float[Array, "m k"]
    s: Float[Array, " k"]
    vt: Float[Array, "k n"]


class Eigh(NamedTuple):
    """The eigenvalues (ascending) and eigenvectors (columns) of a symmetric matrix."""

    eigenvalues: Float[Array, " p"]
    eigenvectors: Float[Array, "p p"]


#: the largest side of a matrix that cuSOLVER factors as one batched call under ``vmap``
#: (jaxlib's CUDA kernels: Jacobi SVD and eigensolver batched up to 32 × 32, full matrices)
BATCHED_SIDE = 32
#: the products of the accelerator forms in full float32 (a GPU's default is TensorFloat-32)
_EXACT = jax.lax.Precision.HIGHEST


def _batched_per_platform(
    on_accelerators: Callable[..., PyTree] | None = None,
) -> Callable[[Callable[..., PyTree]], Callable[..., PyTree]]:
    """A decorator: ``fn`` (a function of arrays that calls LAPACK) with a batching rule of
    its own: under ``vmap`` on CPU the matrices are taken one after another (``lax.map`` of
    ``fn``), never as one batched call; on other platforms ``on_accelerators`` (a function of
    the same arrays, default ``fn``) is vmapped.

    jaxlib's batched LAPACK kernels split the batch over XLA:CPU's intra-op thread pool and
    wait for the pieces from a thread of that pool, so two such calls at once (two instance
    programs on two CPU devices of a two-core machine, or two independent calls of one
    program, which XLA:CPU runs concurrently) can hold every thread of the pool and wait for
    good. Seen with jax 0.10.2: the pipeline's min-norm points of random sub-polyhedra
    (eigenvalues, vmapped), and ``jit(vmap(parameter_errors))`` on 64–256 instances at
    heads 4, dim 16 (the span angle's two QR factorisations), which hung in most runs. Each
    matrix goes through the same LAPACK routine as in the batched call, so the values are the
    same, bit for bit (tested). Not differentiable (none of its uses is).

    On a GPU the converse holds: jaxlib's cuSOLVER kernels take a batch as one call only for
    some shapes (Jacobi SVD and eigensolver up to :data:`BATCHED_SIDE` a side with full
    matrices, Householder QR's R) and otherwise loop over the batch from the host, one
    matrix per library call (the thin SVD of a 256 × 4 matrix, every QR's Q). So where
    ``on_accelerators`` is given it computes the same quantity from batched pieces only:
    Householder QR written in array operations (:func:`householder_qr`) and a factorisation
    of the small side."""

    def decorate(fn: Callable[..., PyTree]) -> Callable[..., PyTree]:
        wrapped = jax.custom_batching.custom_vmap(fn)
        vmapped = jax.vmap(on_accelerators or fn)

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
                default=vmapped,
            )
            return out, jax.tree.map(lambda _: True, out)

        return wrapped

    return decorate


def householder_qr(a: Float[Array, "m n"]) -> QR:
    """The thin QR factorisation ``a = Q R`` of a tall ``a`` (m ≥ n) by n Householder
    reflections written in array operations, LAPACK's conventions (R's diagonal −sign(a_jj)·‖·‖,
    a column already reduced left as it is), so Q and R agree with ``jnp.linalg.qr``'s to
    rounding. O(m n²), no library call: under ``vmap`` on a GPU it is batched whatever the
    batch (cuSOLVER forms a batch's Q one matrix at a time). Defined for rank-deficient
    ``a`` (Q stays orthonormal); ``a`` is scaled by a power of two near its largest entry
    first (exactly), so that no column's squared norm overflows or underflows."""
    m, n = a.shape
    rows = jnp.arange(m)
    _, exponent = jnp.frexp(jnp.max(jnp.abs(a)))
    scale = jnp.ldexp(jnp.ones((), a.dtype), exponent)  # 0 → 1
    a = a / scale

    def reflect(j, carry):
        r, vs, taus = carry
        x = jnp.where(rows >= j, r[:, j], 0.0)
        alpha = x[j]
        below = jnp.sqrt(jnp.sum(jnp.where(rows > j, x, 0.0) ** 2))
        norm = jnp.sqrt(alpha**2 + below**2)
        beta = jnp.where(alpha >= 0, -norm, norm)
        keep = below == 0  # nothing to annihilate: H = I (LAPACK's tau = 0)
        safe = jnp.where(keep, 1.0, alpha - beta)
        v = jnp.where(rows == j, 1.0, x / safe)
        tau = jnp.where(keep, 0.0, (beta - alpha) / jnp.where(keep, 1.0, beta))
        r = r - tau * v[:, None] * jnp.sum(v[:, None] * r, axis=0)
        return r, vs.at[:, j].set(v), taus.at[j].set(tau)

    start = (a, jnp.zeros_like(a), jnp.zeros(n, a.dtype))
    r, vs, taus = jax.lax.fori_loop(0, n, reflect, start)

    def accumulate(i, q):  # Q = H_0 ⋯ H_{n-1} I[:, :n], the last reflection first
        j = n - 1 - i
        v = vs[:, j]
        return q - taus[j] * v[:, None] * jnp.sum(v[:, None] * q, axis=0)

    q = jax.lax.fori_loop(0, n, accumulate, jnp.eye(m, n, dtype=a.dtype))
    return QR(q, jnp.triu(r[:n]) * scale)


def _small_side(a: Float[Array, "m n"]) -> Float[Array, "k k"] | None:
    """The k × k triangle R (k = min(m, n)) with the singular values of ``a``, from
    :func:`householder_qr` of the tall orientation, where ``a`` is too large for a batched
    GPU call but its short side is not; None where ``a`` is already small (or both sides
    large)."""
    m, n = a.shape
    if max(m, n) <= BATCHED_SIDE or min(m, n) > BATCHED_SIDE:
        return None
    return householder_qr(a if m >= n else a.T).r


def _singular_values_batched(a: Float[Array, "m n"]) -> Float[Array, " k"]:
    r = _small_side(a)
    return jnp.linalg.svd(a if r is None else r, compute_uv=False)


def _spectral_norm_batched(a: Float[Array, "m n"]) -> Float[Array, ""]:
    return _singular_values_batched(a)[0]


def _svd_batched(a: Float[Array, "m n"]) -> SVD:
    m, n = a.shape
    k = min(m, n)
    if min(m, n) > BATCHED_SIDE:  # no batched form: cuSOLVER's own loop
        return SVD(*jnp.linalg.svd(a, full_matrices=False))
    if max(m, n) <= BATCHED_SIDE:  # full matrices: cuSOLVER's batched Jacobi
        u, s, vt = jnp.linalg.svd(a, full_matrices=True)
        return SVD(u[:, :k], s, vt[:k])
    q, r = householder_qr(a if m >= n else a.T)
    u, s, vt = jnp.linalg.svd(r, full_matrices=True)
    u = jnp.matmul(q, u, precision=_EXACT)
    return SVD(u, s, vt) if m >= n else SVD(vt.T, s, u.T)


def _orthonormal_basis_batched(a: Float[Array, "m n"]) -> Float[Array, "m n"]:
    return householder_qr(a).q if a.shape[1] <= BATCHED_SIDE else jnp.linalg.qr(a)[0]


def _least_squares_batched(a: Float[Array, "m n"], b: Float[Array, " m"]) -> Float[Array, " n"]:
    """The minimum-norm solution from :func:`_svd_batched`, the singular values above
    jnp.linalg.lstsq's cut-off (eps·max(m, n)·s₁) inverted."""
    u, s, vt = _svd_batched(a)
    keep = s > jnp.finfo(a.dtype).eps * max(a.shape) * s[0]
    coef = jnp.where(keep, jnp.matmul(u.T, b, precision=_EXACT) / jnp.where(keep, s, 1), 0)
    return jnp.matmul(vt.T, coef, precision=_EXACT)


@_batched_per_platform()
def eigenvalues(a: Float[Array, "p p"]) -> Float[Array, " p"]:
    """The eigenvalues of the symmetric matrix ``a``, ascending (``jnp.linalg.eigvalsh``; under
    ``vmap`` on CPU one matrix after another, see :func:`_batched_per_platform`)."""
    return jnp.linalg.eigvalsh(a)


@_batched_per_platform()
def eigh(a: Float[Array, "p p"]) -> Eigh:
    """Eigenvalues (ascending) and eigenvectors (columns) of the symmetric matrix ``a``
    (``jnp.linalg.eigh``; under ``vmap`` on CPU one matrix after another)."""
    return Eigh(*jnp.linalg.eigh(a))


@_batched_per_platform(_singular_values_batched)
def singular_values(a: Float[Array, "m n"]) -> Float[Array, " k"]:
    """The singular values of ``a``, descending (``jnp.linalg.svd`` without vectors; under
    ``vmap`` on CPU one matrix after another, on an accelerator those of R from
    :func:`householder_qr` when one side of ``a`` is long and the other short)."""
    return jnp.linalg.svd(a, compute_uv=False)


@_batched_per_platform(_svd_batched)
def svd(a: Float[Array, "m n"]) -> SVD:
    """The thin singular value decomposition ``U, s, Vᵀ`` of ``a`` (``jnp.linalg.svd`` with
    ``full_matrices=False``; under ``vmap`` on CPU one matrix after another, on an
    accelerator from batched pieces: the full decomposition of a small ``a``, or of R from
    :func:`householder_qr`). Singular vectors are defined up to sign."""
    return SVD(*jnp.linalg.svd(a, full_matrices=False))


@_batched_per_platform(_spectral_norm_batched)
def spectral_norm(a: Float[Array, "m n"]) -> Float[Array, ""]:
    """‖a‖₂, the largest singular value (``jnp.linalg.norm(a, ord=2)``; under ``vmap`` on
    CPU one matrix after another, on an accelerator as :func:`singular_values`)."""
    return jnp.linalg.norm(a, ord=2)


@_batched_per_platform(_orthonormal_basis_batched)
def orthonormal_basis(a: Float[Array, "m n"]) -> Float[Array, "m n"]:
    """The orthonormal factor Q of the thin QR factorisation of the tall ``a`` (m ≥ n): its
    columns span ``a``'s (``jnp.linalg.qr``; under ``vmap`` on CPU one matrix after another,
    on an accelerator :func:`householder_qr`'s Q)."""
    return jnp.linalg.qr(a)[0]


@_batched_per_platform(_least_squares_batched)
def least_squares(a: Float[Array, "m n"], b: Float[Array, " m"]) -> Float[Array, " n"]:
    """The minimum-norm least-squares solution x of ``a x ≈ b`` (``jnp.linalg.lstsq``; under
    ``vmap`` on CPU one system after another, on an accelerator from :func:`svd`'s batched
    pieces)."""
    return jnp.linalg.lstsq(a, b)[0]
