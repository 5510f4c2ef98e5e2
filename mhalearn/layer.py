"""The Chen–Li layer on a whole training set at once, laid out for few, large matrix products.

:func:`mhalearn.kernels.mha` states the layer for one sequence; mapped over samples with
``jax.vmap`` and differentiated by ``jax.value_and_grad`` it is the *reference*. The functions
here compute the same numbers (tests compare values and gradients in float32 and float64):

- every head in one product (``Q = X Θ`` is one ``(samples·tokens, dim) × (dim, heads·dim)``
  matrix product, and so are the outputs ``Φ W``), scores and attention-weighted values as
  products batched over samples, and the gradient derived by hand (below);
- at small sequences (dim and tokens at most :data:`BROADCAST_MAX`) the per-sample products
  ``Q Xᵀ``, ``dΦ Xᵀ`` and ``Φ = A X`` as broadcast products summed over an axis;
  ``products`` forces either form;
- for many gradients of one training set (every step of GD), the samples as the *minor* axis:
  :class:`Lanes`, :func:`lay_out` once, then :func:`lanes_loss_and_grad`; a regression
  problem lays itself out where :func:`lanes_form` says (float32, arrays within
  :data:`LANES_MAX` and :data:`LANES_MAX_BYTES`), through
  :meth:`RegressionProblem.prepared <mhalearn.problems.RegressionProblem.prepared>`. The
  samples are padded with zero sequences, which add nothing, so that a row takes an odd
  number of cache lines.

Which form is fastest where, measured: the documentation's performance page ("The layer's
forms").

Notation, per sample n and head h: ``Q_h = X Θ_h``, ``A_h = softmax(Q_h Xᵀ)``,
``Φ_h = A_h X``, ``F = Σ_h Φ_h W_h``, loss ``L = mean((F − Y)²)`` over every entry, so
``dF = 2(F − Y)/size``. Backward: ``dW_h = Σ_n Φ_hᵀ dF``, ``dΦ_h = dF W_hᵀ``,
``dA_h = dΦ_h Xᵀ``, ``dS_h = A_h ⊙ (dA_h − c_h)`` with ``c_h = rowsum(A_h ⊙ dA_h)``,
``dΘ_h = Σ_n Xᵀ dS_h X`` — computed as ``Xᵀ (P X − c ⊙ Φ_h)`` with ``P = A_h ⊙ dA_h``.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from mhalearn._validate import arrays, check_shapes, choice
from mhalearn.losses import mean_square

#: the largest dim and tokens at which ``products="auto"`` takes the broadcast form
BROADCAST_MAX = 8

Products = Literal["auto", "batched", "broadcast"]


def broadcast_form(products: Products, tokens: int, dim: int) -> bool:
    """Whether the per-sample products (scores and features) take the broadcast form at
    (tokens, dim) under ``products`` (see the module); an unknown ``products`` raises."""
    choice("products", products, ("auto", "batched", "broadcast"))
    if products == "auto":
        return max(tokens, dim) <= BROADCAST_MAX
    return products == "broadcast"


def _scores(
    rows: Float[Array, "n q dim"], X: Float[Array, "n tokens dim"], broadcast: bool
) -> Float[Array, "n q tokens"]:
    """``rows Xᵀ`` for every sample: a batched matrix product, or a broadcast product summed
    over dim."""
    if broadcast:
        return jnp.sum(rows[:, :, None, :] * X[:, None, :, :], axis=-1)
    return jnp.einsum("nqe,nse->nqs", rows, X)


def _features(
    X: Float[Array, "n tokens dim"], theta: Float[Array, "heads dim dim"], broadcast: bool
) -> tuple[Float[Array, "n tokens*heads tokens"], Float[Array, "n tokens*heads dim"]]:
    """Attention ``A`` and per-head features ``Φ = A X``, rows ordered (token, head)."""
    n, T, d = X.shape
    m = theta.shape[0]
    Q = X.reshape(n * T, d) @ theta.transpose(1, 0, 2).reshape(d, m * d)
    A = jax.nn.softmax(_scores(Q.reshape(n, T * m, d), X, broadcast), axis=-1)
    if broadcast:  # A X as a broadcast product summed over tokens, like the scores
        return A, jnp.sum(A[..., :, None] * X[:, None, :, :], axis=2)
    return A, jnp.einsum("nqs,nse->nqe", A, X)


def design(
    X: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    *,
    products: Products = "auto",
) -> Float[Array, "n*tokens heads*dim"]:
    """The layer's features, one row per (sample, token), one column per (head, feature):
    Z[(n,t), (i,a)] = (A_i(X_n) X_n)[t, a], so that the layer's outputs are Z·[W_1; …; W_m]
    — the design of the values' least squares (:mod:`mhalearn.learners.linear`)."""
    X, theta = arrays(X=X, theta=theta)
    check_shapes(("X", X, "n tokens dim"), ("theta", theta, "heads dim dim"))
    return _design(X, theta, products)


def _design(
    X: Float[Array, "n tokens dim"], theta: Float[Array, "heads dim dim"], products: Products
) -> Float[Array, "n*tokens heads*dim"]:
    """:func:`design` on validated arrays."""
    n, T, d = X.shape
    _, Phi = _features(X, theta, broadcast_form(products, T, d))
    return Phi.reshape(n * T, theta.shape[0] * d)


def layer_outputs(
    X: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
    *,
    products: Products = "auto",
) -> Float[Array, "n tokens dim"]:
    """``mha`` applied to each of ``n`` sequences (equal to ``jax.vmap(mha)``); ``products``:
    the form of the per-sample products (see the module)."""
    X, theta, W = arrays(X=X, theta=theta, W=W)
    check_shapes(
        ("X", X, "n tokens dim"), ("theta", theta, "heads dim dim"), ("W", W, "heads dim dim")
    )
    n, T, d = X.shape
    return (_design(X, theta, products) @ W.reshape(-1, d)).reshape(n, T, d)


def squared_loss_and_grad(
    X: Float[Array, "n tokens dim"],
    Y: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
    *,
    products: Products = "auto",
) -> tuple[Float[Array, ""], tuple[Float[Array, "heads dim dim"], Float[Array, "heads dim dim"]]]:
    """``mean((layer(X) − Y)²)`` and its gradient with respect to ``(theta, W)``: equal to
    ``jax.value_and_grad`` of the reference loss, in one forward and one backward pass;
    ``products``: the form of the per-sample products (see the module)."""
    X, Y, theta, W = arrays(X=X, Y=Y, theta=theta, W=W)
    check_shapes(
        ("X", X, "n tokens dim"),
        ("Y", Y, "n tokens dim"),
        ("theta", theta, "heads dim dim"),
        ("W", W, "heads dim dim"),
    )
    n, T, d = X.shape
    m = theta.shape[0]
    rows = X.reshape(n * T, d)
    Wf = W.reshape(m * d, d)
    broadcast = broadcast_form(products, T, d)
    A, Phi = _features(X, theta, broadcast)
    Phi_rows = Phi.reshape(n * T, m * d)
    R = Phi_rows @ Wf - Y.reshape(n * T, d)  # residual, (n·T, d)
    scale = 1.0 / (n * T * d)
    loss = mean_square(R)
    dW = (R.T @ Phi_rows).reshape(d, m, d).transpose(1, 2, 0)  # (f, h, e) -> (h, e, f)
    dPhi = (R @ Wf.T).reshape(n, T * m, d)
    P = A * _scores(dPhi, X, broadcast)  # A ⊙ dA
    c = jnp.einsum("nqs,s->nq", P, jnp.ones(T, X.dtype))  # row sums, as a product
    dQ = jnp.einsum("nqs,nse->nqe", P, X) - c[..., None] * Phi
    dtheta = (rows.T @ dQ.reshape(n * T, m * d)).reshape(d, m, d).transpose(1, 0, 2)
    return loss, (2 * scale * dtheta, 2 * scale * dW)


class Lanes(eqx.Module):
    """A training set laid out with its samples along the minor axis (:func:`lay_out`), for
    many gradients of one training set (:func:`lanes_loss_and_grad`): every per-sample
    product is then an elementwise product over long rows, which XLA:CPU vectorises across
    samples. Column k = t·n' + n holds sample n's token t; the samples are padded from
    ``samples`` to n' with zero sequences, which add nothing to the loss or its gradient."""

    X: Float[Array, "dim lanes"]  # X[n, t, e] at [e, t·n' + n]
    Xs: Float[Array, "dim tokens lanes"]  # X[n, s, e] at [e, s, t·n' + n]: every key, per query
    Y: Float[Array, "dim lanes"]  # Y[n, t, f] at [f, t·n' + n]
    samples: int = eqx.field(static=True)  # n, before padding


#: the largest heads · dim · tokens at which a problem lays its training set out as
#: :class:`Lanes`
LANES_MAX = 128
#: the most bytes a :class:`Lanes` layout may take (its keys hold tokens² · samples · dim numbers)
LANES_MAX_BYTES = 8 * 2**20


def lanes_form(samples: int, heads: int, tokens: int, dim: int, itemsize: int) -> bool:
    """Whether a training set of this shape is laid out as :class:`Lanes` for repeated
    gradients: in float32 (``itemsize`` 4), at heads · dim · tokens ≤ :data:`LANES_MAX`,
    within :data:`LANES_MAX_BYTES`. Measured with both cores busy, one GD kernel on each, as
    the engine runs them (``python benchmarks/kernel_scaling.py --products --pair``): the lanes
    kernel's elementwise loops stream arrays of heads · dim · tokens · samples numbers, and
    where those outgrow the caches it is slower than the samples-major kernel — at
    (4, 16, 8, 512), (8, 8, 8, 512), (2, 16, 8, 2000) and (1, 8, 16, 2000). In float64, where
    a vector holds half as many samples, it was slower than the best samples-major form at
    most shapes from 256 samples up, and at most a tenth faster anywhere
    (``python benchmarks/kernel_scaling.py --products --float64``)."""
    n = padded_samples(samples, tokens, itemsize)
    size = (tokens + 2) * tokens * n * dim * itemsize
    return itemsize == 4 and heads * dim * tokens <= LANES_MAX and size <= LANES_MAX_BYTES


def padded_samples(samples: int, tokens: int, itemsize: int) -> int:
    """The samples a :class:`Lanes` layout holds: the fewest n' ≥ ``samples`` whose rows of
    ``tokens·n'`` numbers take an odd number of 64-byte cache lines, when a row takes 4 KiB or
    more (rows a multiple of 4 KiB apart share the L1 cache's sets and evict each other); else
    ``samples``."""
    if tokens * samples * itemsize < 4096:
        return samples
    for n in range(samples, samples + 128):
        if (tokens * n * itemsize) % 128 == 64:
            return n
    return samples  # no such n' (tokens·itemsize a multiple of 128)


def lay_out(X: Float[Array, "n tokens dim"], Y: Float[Array, "n tokens dim"]) -> Lanes:
    """``(X, Y)`` as :class:`Lanes`."""
    X, Y = arrays(X=X, Y=Y)
    check_shapes(("X", X, "n tokens dim"), ("Y", Y, "n tokens dim"))
    n, T, d = X.shape
    pad = ((0, padded_samples(n, T, X.dtype.itemsize) - n), (0, 0), (0, 0))
    Xt, Yt = (jnp.pad(a, pad).transpose(2, 1, 0) for a in (X, Y))  # (dim, tokens, n')
    lanes = T * Xt.shape[-1]
    Xs = jnp.broadcast_to(Xt[:, :, None, :], (d, T, T, Xt.shape[-1])).reshape(d, T, lanes)
    return Lanes(X=Xt.reshape(d, lanes), Xs=Xs, Y=Yt.reshape(d, lanes), samples=n)


def _per_feature(
    a: Float[Array, "heads tokens lanes"], dim: int
) -> Float[Array, "heads*dim tokens lanes"]:
    """``a`` repeated for each of a head's ``dim`` features (rows (head, feature))."""
    m, T, K = a.shape
    return jnp.broadcast_to(a[:, None], (m, dim, T, K)).reshape(m * dim, T, K)


def _key_sum(
    a: Float[Array, "heads tokens lanes"], lanes: Lanes
) -> Float[Array, "heads*dim lanes"]:
    """``Σ_s a[h, s, k] · X[e, s, k]`` for every (h, e): a sum over the keys."""
    m, d = a.shape[0], lanes.X.shape[0]
    keys = jnp.broadcast_to(lanes.Xs[None], (m, *lanes.Xs.shape)).reshape(m * d, *a.shape[1:])
    return jnp.sum(_per_feature(a, d) * keys, axis=1)


def _dim_sum(
    a: Float[Array, "heads*dim lanes"], lanes: Lanes
) -> Float[Array, "heads tokens lanes"]:
    """``Σ_e a[(h, e), k] · X[e, s, k]`` for every (h, s): a sum over dim."""
    d, K = lanes.X.shape
    return jnp.sum(a.reshape(-1, d, 1, K) * lanes.Xs[None], axis=1)


def _lanes_forward(
    lanes: Lanes, theta: Float[Array, "heads dim dim"], W: Float[Array, "heads dim dim"]
) -> tuple[
    Float[Array, "heads tokens lanes"], Float[Array, "heads*dim lanes"], Float[Array, "dim lanes"]
]:
    """Attention ``A[h, s, k]``, features ``Φ[(h, e), k]`` and residual ``R[f, k]``."""
    m, d, _ = theta.shape
    Q = theta.transpose(0, 2, 1).reshape(m * d, d) @ lanes.X  # Q[(h, e), k]
    A = jax.nn.softmax(_dim_sum(Q, lanes), axis=1)  # scores S[h, s, k]
    Phi = _key_sum(A, lanes)
    return A, Phi, W.transpose(2, 0, 1).reshape(d, m * d) @ Phi - lanes.Y


def _sum_of_squares(R: Float[Array, "dim lanes"]) -> Float[Array, ""]:
    """Σ R² over every entry, written as the squares' product with a vector of ones along the
    lanes (the fastest form measured by ``python benchmarks/kernel_scaling.py --products``)."""
    return jnp.sum(jnp.ones(R.shape[1], R.dtype) @ (R * R).T)


def lanes_loss_and_grad(
    lanes: Lanes, theta: Float[Array, "heads dim dim"], W: Float[Array, "heads dim dim"]
) -> tuple[Float[Array, ""], tuple[Float[Array, "heads dim dim"], Float[Array, "heads dim dim"]]]:
    """:func:`squared_loss_and_grad` on a training set laid out as :class:`Lanes`: the same
    formulas (see the module), every array with the (token, sample) columns as its minor
    axis. Scores ``S[h, s, k]`` and their gradient are sums over dim of elementwise products,
    the features ``Φ[(h, e), k]`` and ``dQ`` sums over the keys; the four products with Θ and
    W and the two weight gradients are matrix products."""
    m, d, _ = theta.shape
    A, Phi, R = _lanes_forward(lanes, theta, W)
    dW = jnp.einsum("ak,fk->af", Phi, R).reshape(m, d, d)
    dA = _dim_sum(W.reshape(m * d, d) @ R, lanes)  # from dΦ[(h, e), k]
    dQ = _key_sum(A * (dA - jnp.sum(A * dA, axis=1, keepdims=True)), lanes)  # from dS
    dtheta = jnp.einsum("ak,jk->aj", dQ, lanes.X).reshape(m, d, d).transpose(0, 2, 1)
    size = lanes.samples * lanes.Xs.shape[1] * d
    return _sum_of_squares(R) / size, (2 / size * dtheta, 2 / size * dW)
