"""The Chen–Li layer's squared loss and gradient as one Pallas kernel, for accelerators.

:func:`~mhalearn.layer.squared_loss_and_grad` is a chain of XLA operations, each of which
reads its inputs from and writes its outputs to device memory: on a GPU one full-batch step
moves a few bytes per FLOP (``mhalearn.learners.step_cost``) and is bound by memory. Here one
kernel program per instance reads the training set once, in tiles of samples, and keeps the
scores, the attention, the features and the residual of a tile on chip; only the loss and
the gradient (heads × dim × dim numbers) are written back. The formulas are those of
:mod:`mhalearn.layer` (its module docstring), per tile:

- forward, per head h: ``Q = X Θ_h`` (a matrix product over the tile's rows), scores
  ``S[n, t, s] = Q[n, t]·X[n, s]``, ``A = softmax(S)``, ``Φ_h = A X``; ``F = Σ_h Φ_h W_h``,
  residual ``R = F − Y``;
- backward: ``dW_h += Φ_hᵀ R``, ``dΦ = R W_hᵀ``, ``dA[n, t, s] = dΦ[n, t]·X[n, s]``,
  ``P = A ⊙ dA``, ``dQ = P X − rowsum(P) ⊙ Φ_h``, ``dΘ_h += Xᵀ dQ``.

The kernel is written for Pallas on Triton (``jax.experimental.pallas.triton``): blocks are
powers of two and the matrix products take at least 16 rows and columns, so the dimension is
zero-padded to a power of two of at least 16 and the samples to a whole number of tiles
(zero sequences and zero features add nothing to the loss or the gradient); the number of
tokens must be a power of two (:func:`fused_form`). On a CPU it runs in Pallas' interpret
mode, which is how the tests check it against the reference. Whether a problem uses it is
:func:`fused_form`'s answer: only on a GPU, and only where :data:`FUSED_ON_GPU` says it was
measured faster than the XLA kernel (``benchmarks/gpu_check.sh`` times both).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float

#: whether a GPU's full-batch steps take the fused kernel: False until a GPU run of
#: ``benchmarks/gpu_check.sh`` measures it faster than the XLA kernel at the standard shape
FUSED_ON_GPU = False
#: the (sample, token) rows of one tile: at least 16 (Triton's smallest matrix product)
TILE_ROWS = 32


def _pow2(n: int, low: int = 1) -> int:
    return max(low, 1 << (n - 1).bit_length())


def fused_form(tokens: int, dtype) -> bool:
    """Whether a float32 training set with ``tokens`` tokens per sequence takes the fused
    kernel for its full-batch gradients: on a GPU, where :data:`FUSED_ON_GPU`, at a power of
    two number of tokens up to :data:`TILE_ROWS`."""
    return (
        FUSED_ON_GPU
        and jax.default_backend() == "gpu"
        and jnp.dtype(dtype) == jnp.float32
        and tokens == _pow2(tokens)
        and tokens <= TILE_ROWS
    )


def _kernel(tiles: int, per_tile: int, tokens: int, dim: int, heads: int):
    """The kernel of one instance: ``tiles`` tiles of ``per_tile`` samples."""
    rows = per_tile * tokens
    exact = jax.lax.Precision.HIGHEST  # float32 products, not TensorFloat-32

    def dot(a, b):
        return jnp.dot(a, b, precision=exact)

    def pairwise(a, X3):
        """``a[n, t]·X[n, s]`` for every (n, t, s)."""
        return jnp.sum(a[:, :, None, :] * X3[:, None, :, :], axis=-1)

    def weighted(a, X3):
        """``Σ_s a[n, t, s] X[n, s]`` for every (n, t)."""
        return jnp.sum(a[:, :, :, None] * X3[:, None, :, :], axis=2)

    def kernel(x_ref, y_ref, theta_ref, w_ref, loss_ref, dtheta_ref, dw_ref):
        thetas = [theta_ref[h] for h in range(heads)]
        Ws = [w_ref[h] for h in range(heads)]

        def tile(i, carry):
            loss, dtheta, dW = carry
            start = pl.multiple_of(i * rows, rows)
            X2 = x_ref[pl.ds(start, rows), :]
            R = -y_ref[pl.ds(start, rows), :]
            X3 = X2.reshape(per_tile, tokens, dim)
            A, Phi = [], []
            for h in range(heads):
                S = pairwise(dot(X2, thetas[h]).reshape(per_tile, tokens, dim), X3)
                E = jnp.exp(S - jnp.max(S, axis=-1, keepdims=True))
                A.append(E / jnp.sum(E, axis=-1, keepdims=True))
                Phi.append(weighted(A[h], X3))
                R = R + dot(Phi[h].reshape(rows, dim), Ws[h])
            new_dtheta, new_dW = [], []
            for h in range(heads):
                new_dW.append(dW[h] + dot(Phi[h].reshape(rows, dim).T, R))
                P = A[h] * pairwise(dot(R, Ws[h].T).reshape(per_tile, tokens, dim), X3)
                dQ = weighted(P, X3) - jnp.sum(P, axis=-1, keepdims=True) * Phi[h]
                new_dtheta.append(dtheta[h] + dot(X2.T, dQ.reshape(rows, dim)))
            return loss + jnp.sum(R * R), tuple(new_dtheta), tuple(new_dW)

        zero = jnp.zeros((dim, dim), jnp.float32)
        start = (jnp.zeros((), jnp.float32), (zero,) * heads, (zero,) * heads)
        loss, dtheta, dW = jax.lax.fori_loop(0, tiles, tile, start)
        loss_ref[...] = jnp.full(loss_ref.shape, loss)
        for h in range(heads):
            dtheta_ref[h] = dtheta[h]
            dw_ref[h] = dW[h]

    return kernel


def fused_loss_and_grad(
    X: Float[Array, "n tokens dim"],
    Y: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
    *,
    interpret: bool | None = None,
) -> tuple[Float[Array, ""], tuple[Float[Array, "heads dim dim"], Float[Array, "heads dim dim"]]]:
    """:func:`~mhalearn.layer.squared_loss_and_grad` (float32) as one Pallas kernel for one
    instance; ``jax.vmap`` over instances makes them the kernel's grid. ``interpret``: run in
    Pallas' interpret mode (``None``: on a CPU).

    Raises:
        ValueError: tokens not a power of two up to :data:`TILE_ROWS`, or not float32.
    """
    n, T, d = X.shape
    m = theta.shape[0]
    if T != _pow2(T) or T > TILE_ROWS:
        raise ValueError(f"tokens must be a power of two up to {TILE_ROWS}, received {T}")
    if any(jnp.dtype(a.dtype) != jnp.float32 for a in (X, Y, theta, W)):
        raise ValueError("the fused kernel takes float32 arrays")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    D = _pow2(d, 16)
    per_tile = TILE_ROWS // T
    tiles = math.ceil(n / per_tile)

    def pad(a, shape):
        return jnp.pad(a, [(0, s - k) for s, k in zip(shape, a.shape, strict=True)])

    Xp, Yp = (pad(a, (tiles * per_tile, T, D)).reshape(-1, D) for a in (X, Y))
    thetap, Wp = (pad(a, (m, D, D)) for a in (theta, W))
    out = (
        jax.ShapeDtypeStruct((1,), jnp.float32),
        jax.ShapeDtypeStruct((m, D, D), jnp.float32),
        jax.ShapeDtypeStruct((m, D, D), jnp.float32),
    )
    if interpret:
        options = dict(interpret=True)
    else:
        from jax.experimental.pallas import triton as plt

        options = dict(compiler_params=plt.CompilerParams(num_warps=4))
    loss, dtheta, dW = pl.pallas_call(_kernel(tiles, per_tile, T, D, m), out_shape=out, **options)(
        Xp, Yp, thetap, Wp
    )
    size = n * T * d
    return loss[0] / size, (2 / size * dtheta[:, :d, :d], 2 / size * dW[:, :d, :d])
