"""The Chen–Li layer on a whole training set at once, laid out for few, large matrix products.

:func:`mhalearn.kernels.mha` states the layer for one sequence; mapped over samples with
``jax.vmap`` and differentiated by ``jax.value_and_grad`` it is the *reference*. The functions
here compute the same numbers (tests compare values and gradients in float32 and float64)
in the form that XLA:CPU runs fastest, measured with ``benchmarks/compare.py``:

- every head in one product: ``Q = X Θ`` is one ``(samples·tokens, dim) × (dim, heads·dim)``
  matrix product, and so are the outputs ``Φ W``;
- scores and attention-weighted values are products batched over samples, with the
  ``tokens·heads`` query rows of a sample stacked, so no sample-sized tensor is ever
  transposed (XLA's autodiff of the reference transposes several per step);
- the gradient is derived by hand (below), so the backward pass materialises nothing it only
  reduces, its weight gradients are plain matrix products, and the one row sum of the softmax
  backward is a product with a vector of ones (XLA:CPU fused a plain reduction into the
  surrounding matrix products, which ran slower);
- at small sequences (dim and tokens at most :data:`BROADCAST_MAX`, the recovery studies' and
  phase diagrams' dim 8, tokens 4) the two per-sample products that give scores, ``Q Xᵀ`` and
  ``dΦ Xᵀ``, are written as broadcast products summed over dim, which XLA:CPU fuses into one
  loop instead of calling a batched matrix product on 4 × 8 blocks: about a fifth less time
  per GD step there, and slower at dim 16 (``python benchmarks/kernel_scaling.py --products``).
  So are the features ``Φ = A X`` (summed over tokens): another sixth less at (2, 8, 4, 256)
  (83 → 69 µs per step in ``kernel_scaling.py --products``, one run before and one after).
  The backward's ``(A ⊙ dA) X`` stays a batched product: in the broadcast form the step took
  longer in a one-off trial.
  ``products`` forces either form; they agree to rounding (tested against the reference).

Notation, per sample n and head h: ``Q_h = X Θ_h``, ``A_h = softmax(Q_h Xᵀ)``,
``Φ_h = A_h X``, ``F = Σ_h Φ_h W_h``, loss ``L = mean((F − Y)²)`` over every entry, so
``dF = 2(F − Y)/size``. Backward: ``dW_h = Σ_n Φ_hᵀ dF``, ``dΦ_h = dF W_hᵀ``,
``dA_h = dΦ_h Xᵀ``, ``dS_h = A_h ⊙ (dA_h − c_h)`` with ``c_h = rowsum(A_h ⊙ dA_h)``,
``dΘ_h = Σ_n Xᵀ dS_h X`` — computed as ``Xᵀ (P X − c ⊙ Φ_h)`` with ``P = A_h ⊙ dA_h``.
"""

from __future__ import annotations

from typing import Literal

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
