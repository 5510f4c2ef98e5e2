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
tokens must be a power of two (:func:`fused_form`). The per-sample products (the scores and
the attention-weighted sums) take one of two forms (:data:`FORMS`), and a tile's backward pass
either keeps every head's attention and features from the forward pass or forms them again one
head at a time (:data:`RECOMPUTE`: fewer registers, more FLOPs); a GPU is to choose between
them (``benchmarks/fused.py``). On a CPU it runs in Pallas' interpret
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

from mhalearn.platforms import platform

#: whether a GPU's full-batch steps take the fused kernel: False until a GPU run of
#: ``benchmarks/gpu_check.sh`` measures it faster than the XLA kernel at the standard shape
FUSED_ON_GPU = False
#: the (sample, token) rows of one tile (a power of two, at least 16: Triton's smallest matrix
#: product) and the warps of one kernel program: compiled for sm_90 (the H100 and H200) at the
#: standard shape by the Triton package 3.9, 32 rows or 4 warps spill registers to the stack,
#: 16 rows on 8 warps do not; by jaxlib 0.10.2's XLA and its own Triton no variant at 16 rows
#: spills (``benchmarks/fused_registers.py``, and ``--compiler xla``)
TILE_ROWS = 16
WARPS = 8
#: the forms of the per-sample products (scores and attention-weighted sums) inside a tile:
#: ``"pairs"``, each sample's tokens against its own tokens as broadcast products summed
#: (samples per tile × tokens × tokens × dim numbers on chip); ``"blocks"``, the tile's rows
#: against all its rows as matrix products, the scores between different samples masked out
#: of the softmax (samples per tile times the multiplications of those products, but only
#: (rows, rows) and (rows, dim) arrays)
FORMS = ("pairs", "blocks")
#: the form a GPU's full-batch steps take
FORM = "pairs"
#: whether a tile's backward pass forms each head's attention and features again, one head on
#: chip at a time, rather than keeping every head's from the forward pass (which the registers
#: of one program grow with: ``benchmarks/fused_registers.py``)
RECOMPUTE = False
#: the largest dimension whose problems take the kernel: the standard shape's, which the GPU
#: check times; compiled for sm_90 at 16 rows on 8 warps, at dimension 32 the forms that keep
#: every head spill registers by the Triton package 3.9 (by XLA's own Triton only ``blocks``
#: kept, 104 bytes, and ``pairs`` recomputed, 16), and every form spills at 64 by either
#: (``benchmarks/fused_registers.py --dim``)
MAX_DIM = 16


def settings() -> tuple:
    """The settings above as they stand, which decide the programs compiled for a GPU: part of
    the key under which the engine keeps its compiled programs, so that a change of them
    within a process compiles anew."""
    return (FUSED_ON_GPU, FORM, RECOMPUTE, TILE_ROWS, WARPS, MAX_DIM)


def _pow2(n: int, low: int = 1) -> int:
    return max(low, 1 << (n - 1).bit_length())


def fused_form(tokens: int, dim: int, dtype) -> bool:
    """Whether a float32 training set of ``tokens`` tokens of dimension ``dim`` per sequence
    takes the fused kernel for its full-batch gradients: in a program traced for a GPU
    (:func:`~mhalearn.platforms.platform`), where :data:`FUSED_ON_GPU`, at a power of two
    number of tokens up to :data:`TILE_ROWS` and a dimension up to :data:`MAX_DIM`, in
    :data:`FORM` (and :data:`RECOMPUTE`)."""
    return (
        FUSED_ON_GPU
        and platform() == "gpu"
        and jnp.dtype(dtype) == jnp.float32
        and tokens == _pow2(tokens)
        and tokens <= TILE_ROWS
        and dim <= MAX_DIM
    )


def _kernel(
    tiles: int, per_tile: int, tokens: int, dim: int, heads: int, form: str, recompute: bool
):
    """The kernel of one instance: ``tiles`` tiles of ``per_tile`` samples, their per-sample
    products in ``form`` (:data:`FORMS`), each head's attention formed again for the backward
    pass where ``recompute``."""
    rows = per_tile * tokens
    exact = jax.lax.Precision.HIGHEST  # float32 products, not TensorFloat-32

    def dot(a, b):
        return jnp.dot(a, b, precision=exact)

    if form == "pairs":

        def scores(Q, X2):
            """``S[n, t, s] = Q[n, t]·X[n, s]`` for every (n, t, s)."""
            Q3, X3 = Q.reshape(per_tile, tokens, dim), X2.reshape(per_tile, tokens, dim)
            return jnp.sum(Q3[:, :, None, :] * X3[:, None, :, :], axis=-1)

        def attend(A, X2):
            """``Σ_s A[n, t, s] X[n, s]`` for every (n, t), as (rows, dim)."""
            X3 = X2.reshape(per_tile, tokens, dim)
            return jnp.sum(A[:, :, :, None] * X3[:, None, :, :], axis=2).reshape(rows, dim)

        def own(S):
            return S

    else:  # "blocks": the tile's rows against its rows, the other samples' blocks masked

        def scores(Q, X2):
            return dot(Q, X2.T)

        def attend(A, X2):
            return dot(A, X2)

        def own(S):
            """The scores of each sample's tokens against its own; the others −∞."""
            row = jax.lax.broadcasted_iota(jnp.int32, (rows, rows), 0) // tokens
            col = jax.lax.broadcasted_iota(jnp.int32, (rows, rows), 1) // tokens
            return jnp.where(row == col, S, -jnp.inf)

    def softmax(S):
        E = jnp.exp(S - jnp.max(S, axis=-1, keepdims=True))
        return E / jnp.sum(E, axis=-1, keepdims=True)

    def kernel(x_ref, y_ref, theta_ref, w_ref, loss_ref, dtheta_ref, dw_ref):
        def attention(X2, h):
            """Head ``h``'s attention of a tile's rows."""
            return softmax(own(scores(dot(X2, theta_ref[h]), X2)))

        def backward(X2, R, A, Phi, h):
            """Head ``h``'s gradient of a tile: (dΘ_h, dW_h)."""
            P = A * scores(dot(R, w_ref[h].T), X2)
            dQ = attend(P, X2) - jnp.sum(P, axis=-1, keepdims=True).reshape(rows, 1) * Phi
            return dot(X2.T, dQ), dot(Phi.T, R)

        def tile(i, carry):
            loss, dtheta, dW = carry
            start = pl.multiple_of(i * rows, rows)
            X2 = x_ref[pl.ds(start, rows), :]
            R = -y_ref[pl.ds(start, rows), :]
            if not recompute:  # every head's attention and features on chip
                A = [attention(X2, h) for h in range(heads)]
                Phi = [attend(A[h], X2) for h in range(heads)]
                R = R + sum(dot(Phi[h], w_ref[h]) for h in range(heads))
                grads = [backward(X2, R, A[h], Phi[h], h) for h in range(heads)]
                dtheta = tuple(a + g for a, (g, _) in zip(dtheta, grads, strict=True))
                dW = tuple(a + g for a, (_, g) in zip(dW, grads, strict=True))
                return loss + jnp.sum(R * R), dtheta, dW

            # one head on chip at a time: its forward pass again in the backward pass, in
            # loops that the compiler cannot merge back into one
            def residual(h, R):
                return R + dot(attend(attention(X2, h), X2), w_ref[h])

            R = jax.lax.fori_loop(0, heads, residual, R)

            def gradient(h, carry):
                dtheta, dW = carry
                Ah = attention(X2, h)
                g_theta, g_W = backward(X2, R, Ah, attend(Ah, X2), h)
                at = jax.lax.broadcasted_iota(jnp.int32, (heads, dim, dim), 0) == h
                return (
                    jnp.where(at, dtheta + g_theta[None], dtheta),
                    jnp.where(at, dW + g_W[None], dW),
                )

            dtheta, dW = jax.lax.fori_loop(0, heads, gradient, (dtheta, dW))
            return loss + jnp.sum(R * R), dtheta, dW

        zero = jnp.zeros((dim, dim), jnp.float32)
        if recompute:
            grads = (jnp.zeros((heads, dim, dim), jnp.float32),) * 2
        else:
            grads = ((zero,) * heads, (zero,) * heads)
        start = (jnp.zeros((), jnp.float32), *grads)
        loss, dtheta, dW = jax.lax.fori_loop(0, tiles, tile, start)
        loss_ref[...] = jnp.full(loss_ref.shape, loss)
        if recompute:
            dtheta_ref[...] = dtheta
            dw_ref[...] = dW
        else:
            for h in range(heads):
                dtheta_ref[h] = dtheta[h]
                dw_ref[h] = dW[h]

    return kernel


def _pad(a: Array, shape: tuple[int, ...]) -> Array:
    return jnp.pad(a, [(0, s - k) for s, k in zip(shape, a.shape, strict=True)])


def _tiling(n: int, tokens: int, dim: int, tile_rows: int) -> tuple[int, int, int]:
    """(tiles, samples per tile, padded dimension) of ``n`` samples in the kernel."""
    per_tile = tile_rows // tokens
    return math.ceil(n / per_tile), per_tile, _pow2(dim, 16)


def pad_training_set(
    X: Float[Array, "n tokens dim"], Y: Float[Array, "n tokens dim"], tile_rows: int = TILE_ROWS
) -> tuple[Float[Array, "rows padded_dim"], Float[Array, "rows padded_dim"]]:
    """X and Y as the kernel reads them: zero samples up to whole tiles of ``tile_rows``
    rows, the dimension zero-padded to a power of two of at least 16, one (sample, token)
    per row. A fit pads its training set once (``padded=`` of :func:`fused_loss_and_grad`),
    not at every step."""
    n, T, d = X.shape
    tiles, per_tile, D = _tiling(n, T, d, tile_rows)
    return tuple(_pad(a, (tiles * per_tile, T, D)).reshape(-1, D) for a in (X, Y))


def fused_loss_and_grad(
    X: Float[Array, "n tokens dim"],
    Y: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
    *,
    form: str = FORM,
    tile_rows: int = TILE_ROWS,
    warps: int = WARPS,
    recompute: bool = RECOMPUTE,
    interpret: bool | None = None,
    padded: tuple[Float[Array, "rows padded_dim"], Float[Array, "rows padded_dim"]] | None = None,
) -> tuple[Float[Array, ""], tuple[Float[Array, "heads dim dim"], Float[Array, "heads dim dim"]]]:
    """:func:`~mhalearn.layer.squared_loss_and_grad` (float32) as one Pallas kernel for one
    instance; ``jax.vmap`` over instances makes them the kernel's grid. ``form``: how the
    per-sample products are formed inside a tile (:data:`FORMS`); ``tile_rows``: the
    (sample, token) rows of a tile; ``warps``: of a program on a GPU; ``recompute``: each
    head's attention formed again in the backward pass, one head on chip at a time
    (:data:`RECOMPUTE`). ``interpret``: run in Pallas' interpret mode (``None``: everywhere but
    on a CUDA GPU, decided when the program is lowered, so that a program placed on the host
    CPU of a GPU machine runs too).
    ``padded``: :func:`pad_training_set` of X and Y at ``tile_rows``, made once by the caller
    (``None``: X and Y are padded here).

    Raises:
        ValueError: tokens not a power of two up to ``tile_rows``, ``tile_rows`` not a power
            of two of at least 16, not float32, an unknown form, or ``padded`` not shaped as
            :func:`pad_training_set` pads X and Y.
    """
    n, T, d = X.shape
    m = theta.shape[0]
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, received {form!r}")
    if tile_rows != _pow2(tile_rows, 16):
        raise ValueError(f"tile_rows must be a power of two of at least 16, received {tile_rows}")
    if T != _pow2(T) or T > tile_rows:
        raise ValueError(f"tokens must be a power of two up to {tile_rows}, received {T}")
    if any(jnp.dtype(a.dtype) != jnp.float32 for a in (X, Y, theta, W)):
        raise ValueError("the fused kernel takes float32 arrays")
    tiles, per_tile, D = _tiling(n, T, d, tile_rows)
    if padded is None:
        padded = pad_training_set(X, Y, tile_rows)
    Xp, Yp = padded
    if Xp.shape != (tiles * per_tile * T, D) or Yp.shape != Xp.shape:
        raise ValueError(
            f"padded must be pad_training_set(X, Y, {tile_rows}): two arrays of shape "
            f"{(tiles * per_tile * T, D)}, received {Xp.shape} and {Yp.shape}"
        )
    thetap, Wp = (_pad(a, (m, D, D)) for a in (theta, W))
    out = (
        jax.ShapeDtypeStruct((1,), jnp.float32),
        jax.ShapeDtypeStruct((m, D, D), jnp.float32),
        jax.ShapeDtypeStruct((m, D, D), jnp.float32),
    )
    kernel = _kernel(tiles, per_tile, T, D, m, form, recompute)
    interpreted = pl.pallas_call(kernel, out_shape=out, interpret=True)
    from jax.experimental.pallas import triton as plt

    triton = pl.pallas_call(
        kernel, out_shape=out, compiler_params=plt.CompilerParams(num_warps=warps)
    )
    args = (Xp, Yp, thetap, Wp)
    if interpret is None:  # decided where the program is lowered, not by the default device
        loss, dtheta, dW = jax.lax.platform_dependent(*args, cuda=triton, default=interpreted)
    else:
        loss, dtheta, dW = (interpreted if interpret else triton)(*args)
    size = n * T * d
    return loss[0] / size, (2 / size * dtheta[:, :d, :d], 2 / size * dW[:, :d, :d])
