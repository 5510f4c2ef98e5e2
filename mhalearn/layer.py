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
  surrounding matrix products, which ran slower).

Notation, per sample n and head h: ``Q_h = X Θ_h``, ``A_h = softmax(Q_h Xᵀ)``,
``Φ_h = A_h X``, ``F = Σ_h Φ_h W_h``, loss ``L = mean((F − Y)²)`` over every entry, so
``dF = 2(F − Y)/size``. Backward: ``dW_h = Σ_n Φ_hᵀ dF``, ``dΦ_h = dF W_hᵀ``,
``dA_h = dΦ_h Xᵀ``, ``dS_h = A_h ⊙ (dA_h − c_h)`` with ``c_h = rowsum(A_h ⊙ dA_h)``,
``dΘ_h = Σ_n Xᵀ dS_h X`` — computed as ``Xᵀ (P X − c ⊙ Φ_h)`` with ``P = A_h ⊙ dA_h``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from mhalearn._validate import arrays, check_shapes
from mhalearn.losses import mean_square


def _features(
    X: Float[Array, "n tokens dim"], theta: Float[Array, "heads dim dim"]
) -> tuple[Float[Array, "n tokens*heads tokens"], Float[Array, "n tokens*heads dim"]]:
    """Attention ``A`` and per-head features ``Φ = A X``, rows ordered (token, head)."""
    n, T, d = X.shape
    m = theta.shape[0]
    Q = X.reshape(n * T, d) @ theta.transpose(1, 0, 2).reshape(d, m * d)
    scores = jnp.einsum("nqe,nse->nqs", Q.reshape(n, T * m, d), X)
    A = jax.nn.softmax(scores, axis=-1)
    return A, jnp.einsum("nqs,nse->nqe", A, X)


def layer_outputs(
    X: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
) -> Float[Array, "n tokens dim"]:
    """``mha`` applied to each of ``n`` sequences (equal to ``jax.vmap(mha)``)."""
    X, theta, W = arrays(X=X, theta=theta, W=W)
    check_shapes(
        ("X", X, "n tokens dim"), ("theta", theta, "heads dim dim"), ("W", W, "heads dim dim")
    )
    n, T, d = X.shape
    m = theta.shape[0]
    _, Phi = _features(X, theta)
    return (Phi.reshape(n * T, m * d) @ W.reshape(m * d, d)).reshape(n, T, d)


def squared_loss_and_grad(
    X: Float[Array, "n tokens dim"],
    Y: Float[Array, "n tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
) -> tuple[Float[Array, ""], tuple[Float[Array, "heads dim dim"], Float[Array, "heads dim dim"]]]:
    """``mean((layer(X) − Y)²)`` and its gradient with respect to ``(theta, W)``: equal to
    ``jax.value_and_grad`` of the reference loss, in one forward and one backward pass."""
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
    A, Phi = _features(X, theta)
    Phi_rows = Phi.reshape(n * T, m * d)
    R = Phi_rows @ Wf - Y.reshape(n * T, d)  # residual, (n·T, d)
    scale = 1.0 / (n * T * d)
    loss = mean_square(R)
    dW = (R.T @ Phi_rows).reshape(d, m, d).transpose(1, 2, 0)  # (f, h, e) -> (h, e, f)
    dPhi = (R @ Wf.T).reshape(n, T * m, d)
    P = A * jnp.einsum("nqe,nse->nqs", dPhi, X)  # A ⊙ dA
    c = jnp.einsum("nqs,s->nq", P, jnp.ones(T, X.dtype))  # row sums, as a product
    dQ = jnp.einsum("nqs,nse->nqe", P, X) - c[..., None] * Phi
    dtheta = (rows.T @ dQ.reshape(n * T, m * d)).reshape(d, m, d).transpose(1, 0, 2)
    return loss, (2 * scale * dtheta, 2 * scale * dW)
