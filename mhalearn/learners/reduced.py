"""The variable-projection problem: the training loss with W eliminated by least squares
(W = W*(Θ)), its gradient in Θ, and its Gauss–Newton systems, over all of Θ or restricted to a
subspace: what :func:`~mhalearn.learners.varpro.levenberg_marquardt` solves."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from mhalearn.kernels import attention_weights
from mhalearn.layer import layer_outputs
from mhalearn.learners.linear import design, values_and_residual
from mhalearn.losses import mean_square
from mhalearn.params import LayerParams
from mhalearn.platforms import platform
from mhalearn.problems import RegressionProblem
from mhalearn.solvers import ridge_solve


class Reduced(eqx.Module):
    """The reduced cost at Θ and the values W*(Θ) it is taken at."""

    cost: Float[Array, ""]
    W: Float[Array, "heads dim dim"]


class System(eqx.Module):
    """A Gauss–Newton system: the matrix J_KᵀJ_K and the gradient J_Kᵀr (over flattened Θ, or
    over a subspace's coefficients)."""

    H: Float[Array, "params params"]
    g: Float[Array, " params"]


def reduced_cost(problem: RegressionProblem, theta, ridge) -> Reduced:
    """The training loss at Θ with W = W*(Θ) (the problem's mean squared error), and W*."""
    W, residual = values_and_residual(problem.X, problem.Y, theta, ridge)
    return Reduced(cost=mean_square(residual), W=W)


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The index pairs (a ≤ b) of a symmetric n × n matrix, and for every (a, b) the position
    of its pair in that list."""
    a, b = np.triu_indices(n)
    where = np.zeros((n, n), int)
    where[a, b] = where[b, a] = np.arange(a.size)
    return a, b, where


def reduced_gradient(problem: RegressionProblem, theta, W) -> Float[Array, " params"]:
    """J_Kᵀ r at Θ with W = W*(Θ) (flattened Θ), from the layer's gradient with W held: the
    reduced cost's gradient, since its gradient in W vanishes there."""
    _, grads = problem.loss_and_grad(LayerParams(theta=theta, W=W))
    return grads.theta.reshape(-1) * (problem.Y.size / 2)


#: (sample, token) rows a chunk of the Gauss–Newton sums takes when no ``sample_chunk`` is
#: given, by the platform the program is traced for (elsewhere: 4096). A chunk's intermediates
#: hold about heads · dim² numbers a row: on a CPU 512 rows keep them small (on the CPU split
#: into its cores 4096 were no faster at any of recovery_speed.py's cells, and slower at dim
#: 16: ``--chunk-rows``); on an accelerator every chunk is one more round of the sums'
#: kernels, and 4096 rows make the GPU check's variable projection cell (dim 8, tokens 4,
#: heads 2, 1000 samples) one chunk: 20 iterations of 256 teachers in 4160 launches instead
#: of 9760 (``benchmarks/gpu_programs.py --varpro``)
CHUNK_ROWS: dict[str, int] = {"cpu": 512}


def chunk_rows(name: str | None = None) -> int:
    """The (sample, token) rows of a chunk on the platform ``name`` (default: the platform
    being traced for, :func:`mhalearn.platforms.platform`)."""
    return CHUNK_ROWS.get(name or platform(), 4096)


def _sample_chunks(arrays, sample_chunk: int | None):
    """Each (samples, tokens, dim) array zero-padded to a multiple of the chunk and split into
    (chunks, chunk, tokens, dim) — the chunk ``sample_chunk`` samples, ``None``: about
    :data:`CHUNK_ROWS` (sample, token) rows — and the chunk size."""
    n, T, d = arrays[0].shape
    chunk = min(sample_chunk or max(1, chunk_rows() // T), n)
    pad = jnp.zeros(((-n) % chunk, T, d), arrays[0].dtype)
    return tuple(jnp.concatenate([a, pad]).reshape(-1, chunk, T, d) for a in arrays), chunk


def gauss_newton_system(
    problem: RegressionProblem,
    theta,
    W,
    sample_chunk: int | None = None,
    products: str | None = None,
) -> System:
    """(J_Kᵀ J_K, J_Kᵀ r) of the reduced residual at Θ (W = W*(Θ)), over flattened Θ.

    The Jacobian of F w.r.t. Θ_i[p, q] for one sample is x_t[p]·C_i[t, q, e] with
    C_i[t] = K_i[t] W_i and K_i[t] = Σ_s A_i[t, s] (x_s − x̄_i[t])(x_s − x̄_i[t])ᵀ the
    attention-weighted covariance of the tokens (symmetric), x̄_i[t] = Σ_s A_i[t, s] x_s. So

        J_Θᵀ J_Θ[(i,p,q), (j,r,s)] = Σ_(n,t) x_t[p] x_t[r] (C_i[t] C_j[t]ᵀ)[q, s]
        B[(i,a), e, (j,p,q)]       = Σ_(n,t) x̄_i[t][a] x_t[p] (K_j[t] W_j)[q, e]

    are each one matrix product over the (sample, token) rows, taken between symmetric halves
    (p ≤ r, heads i ≤ j and q ≤ s within a head for the first, q ≤ b of K for the second):
    3.7× and 1.9× fewer products than the full tensors at dim 16, two heads; memory O(P²)
    whatever the number of samples. The design's ZᵀZ is summed over the same rows.
    ``products="float32"`` computes all but the residual in float32: the matrix only sets the
    step, and the gradient's relative error of ~1e-7 only slows the last, quadratic iterations
    by that factor (the residual, and the cost that accepts a step, stay in the problem's
    precision)."""
    X, Y = problem.X, problem.Y
    _, T, d = X.shape
    m = theta.shape[0]
    P = theta.size
    # padding samples are all-zero tokens: their K, x̄, C and residual are exactly zero
    (Xp, Yp), chunk = _sample_chunks((X, Y), sample_chunk)
    rows = chunk * T
    dp, dq, d_pair = _pairs(d)
    hi, hj, h_pair = _pairs(m)
    low = X.dtype if products is None else jnp.dtype(products)

    def body(acc, batch):
        x, y = batch
        A = jax.vmap(attention_weights, in_axes=(0, None))(x, theta)  # (c, m, T, T)
        xbar = jnp.einsum("cmts,csa->mcta", A, x)  # the per-head features Φ_i
        r = jnp.einsum("mcta,mae->cte", xbar, W) - y  # residual: the problem's precision
        Z = jnp.moveaxis(xbar, 0, 2).reshape(rows, m * d)  # the design's rows
        ZZ = acc[3] + Z.T @ Z
        # the rest only sets the step (and the gradient's last digits): ``low`` precision
        A, x, xbar, r = (a.astype(low) for a in (A, x, xbar, r))
        K = jnp.einsum("cmts,csq,csa->mctqa", A, x, x) - xbar[..., :, None] * xbar[..., None, :]
        C = jnp.einsum("mctqa,mae->mctqe", K, W.astype(low)).reshape(m, rows, d, d)
        G, B, g, _ = acc
        xr = x.reshape(rows, d)
        cr = jnp.einsum("mrqe,re->mrq", C, r.reshape(rows, d))
        g = g + jnp.einsum("rp,mrq->mpq", xr, cr).reshape(P).astype(g.dtype)
        CC = [
            jnp.einsum("rqe,rse->rqs", C[i], C[i]).reshape(rows, -1)[:, dp * d + dq]  # q ≤ s
            if i == j
            else jnp.einsum("rqe,rse->rqs", C[i], C[j]).reshape(rows, -1)
            for i, j in zip(hi, hj, strict=True)
        ]
        G = G + ((xr[:, dp] * xr[:, dq]).T @ jnp.concatenate(CC, axis=1)).astype(G.dtype)
        z = (jnp.moveaxis(xbar, 0, 2).reshape(rows, m * d, 1) * xr[:, None]).reshape(rows, -1)
        Ku = K.reshape(m, rows, d * d)[:, :, dp * d + dq]  # (m, rows, pairs)
        # (pairs of K) × (features ⊗ x): the short side as the product's rows, which XLA:CPU
        # runs faster than the transposed product
        Bt = jnp.moveaxis(Ku, 0, 1).reshape(rows, -1).T @ z
        B = B + Bt.reshape(B.shape).astype(B.dtype)
        return (G, B, g, ZZ), None

    pairs = dp.size
    # G's columns: a block per pair of heads i ≤ j, its (q, s) all d² of them, or q ≤ s
    # (pairs) when i = j
    widths = np.where(hi == hj, pairs, d * d)
    zeros = (
        jnp.zeros((pairs, widths.sum()), X.dtype),
        jnp.zeros((m, pairs, m * d * d), X.dtype),
        jnp.zeros(P, X.dtype),
        jnp.zeros((m * d, m * d), X.dtype),
    )
    (G, B, g, ZZ), _ = jax.lax.scan(body, zeros, (Xp, Yp))
    B = jnp.moveaxis(B, 2, 0)  # (i,a,p), j, (q,b)
    # the full tensors back from the halves: G[(i,p,q), (j,r,s)] (from the block (j, i) at
    # (s, q) when i > j, from (s, q) when i = j and q > s; x_t[p] x_t[r] is symmetric) and
    # B[(i,a), e, (j,p,q)] = Σ_b B̃[(i,a,p), j, (q,b)] W_j[b, e]
    i, p, q, j, r, s = np.indices((m, d, d, m, d, d)).reshape(6, -1)
    q, s = np.where(i > j, s, q), np.where(i > j, q, s)
    block = h_pair[i, j]
    column = np.cumsum(widths)[block] - widths[block]
    column += np.where(i == j, d_pair[q, s], q * d + s)
    G = G[d_pair[p, r], column].reshape(P, P)
    B = B.reshape(m * d, d, m, pairs)[..., d_pair]  # (i,a), p, j, q, b
    B = jnp.einsum("kpjqb,jbe->kejpq", B, W).reshape(m * d, d, P)
    solved = ridge_solve(ZZ, B.reshape(m * d, -1), 1e-12).reshape(B.shape)
    # the projection's share, a product of P³ multiply-adds (m·d·d = P): in ``low`` precision
    correction = jnp.einsum("iep,ieq->pq", B.astype(low), solved.astype(low))
    return System(H=G - correction.astype(G.dtype), g=g)


def restricted_system(
    problem: RegressionProblem,
    theta,
    W,
    basis: Float[Array, "params coefficients"],
    sample_chunk: int | None = None,
) -> System:
    """(BᵀJ_KᵀJ_K B, BᵀJ_Kᵀr): :func:`gauss_newton_system` restricted to span(B) (B:
    ``basis``), from the residual's derivative along each column b of B with W held, J_Θb (one
    forward-mode pass per column), projected off the range of the design Z:

        BᵀJ_KᵀJ_K B = Σ_e (J_Θ B)_eᵀ(J_Θ B)_e − (Zᵀ(J_Θ B)_e)ᵀ (ZᵀZ)⁻¹ Zᵀ(J_Θ B)_e

    — as many passes as columns instead of the full P × P system, accumulated over
    ``sample_chunk`` samples at a time (memory independent of the number of samples), in the
    problem's precision."""
    X = problem.X
    d = X.shape[-1]
    # padding samples are all-zero tokens: their outputs, derivatives and design rows are zero
    (Xp,), _ = _sample_chunks((X,), sample_chunk)
    width = theta.shape[0] * d  # columns of the design

    def body(acc, x):
        def along(b):  # J_Θ b on this chunk, (rows, d)
            tangent = b.reshape(theta.shape)
            return jax.jvp(lambda t: layer_outputs(x, t, W), (theta,), (tangent,))[1].reshape(-1, d)

        J = jax.vmap(along, in_axes=1)(basis)  # (columns, rows, d)
        Z = design(x, theta)  # (rows, width)
        JJ, ZJ, ZZ = acc
        JJ = JJ + jnp.einsum("crd,srd->cs", J, J)
        return (JJ, ZJ + jnp.einsum("rk,crd->kcd", Z, J), ZZ + Z.T @ Z), None

    cols = basis.shape[1]
    zeros = (
        jnp.zeros((cols, cols), X.dtype),
        jnp.zeros((width, cols, d), X.dtype),
        jnp.zeros((width, width), X.dtype),
    )
    (JJ, ZJ, ZZ), _ = jax.lax.scan(body, zeros, Xp)
    coef = ridge_solve(ZZ, ZJ.reshape(width, -1), 1e-12).reshape(ZJ.shape)
    H = JJ - jnp.einsum("kcd,ksd->cs", ZJ, coef)
    return System(H=H, g=basis.T @ reduced_gradient(problem, theta, W))
