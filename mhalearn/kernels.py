"""Pure attention math on ONE sequence: no randomness, no batching.

Vocabulary (docs: The science): ``tokens`` = k (Chen–Li) / T (Deora et al.), ``dim`` = d,
``heads`` = m / H, ``theta`` = per-head query·key matrix, ``W`` = per-head value·output
matrix (Chen–Li) or merged key·query matrix (classifier), ``U`` = classifier readout.

Every function here is written for a single sequence ``X`` of shape ``(tokens, dim)``;
map it over samples and instances with ``jax.vmap``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from mhalearn._validate import arrays, check_shapes, choice, in_range


@jax.custom_vjp
def saturating_softmax(x: Float[Array, "*rows n"]) -> Float[Array, "*rows n"]:
    """``jax.nn.softmax`` over the last axis, whose gradient stays accurate when attention
    saturates.

    The usual backward pass s ⊙ (g − s·g) loses the largest weight's entry once its weight
    rounds to 1 (1 − s_m below the dtype's epsilon: a logit gap above ~37 in float64, ~16 in
    float32): g_m − s·g cancels to 0 although its true value, s_m Σ_{j≠m} s_j (g_m − g_j),
    is as large as the other entries. Gradient descent on a saturating head then follows a
    wrong direction (its selected token's pull vanishes). Here the product is taken relative
    to the largest entry, h = g − g_m: x̄ = s ⊙ (h − s·h), where every term is computed from
    the small weights directly. Reverse mode only (forward-over-reverse, e.g. Hessian-vector
    products, works; ``jax.jvp`` of this function itself does not).
    """
    return jax.nn.softmax(x, axis=-1)


def _softmax_forward(x):
    s = jax.nn.softmax(x, axis=-1)
    return s, s


def _softmax_backward(s, g):
    m = jnp.argmax(s, axis=-1, keepdims=True)
    h = g - jnp.take_along_axis(g, m, axis=-1)
    return (s * (h - jnp.sum(s * h, axis=-1, keepdims=True)),)


saturating_softmax.defvjp(_softmax_forward, _softmax_backward)


def _attend(
    queries: Float[Array, "queries dim"],
    keys: Float[Array, "tokens dim"],
    theta: Float[Array, "heads dim dim"],
    temperature: float = 1.0,
    softmax=saturating_softmax,
) -> Float[Array, "heads queries tokens"]:
    """softmax over keys of ``temperature * queries Θ_h keysᵀ`` for every head.

    The softmax subtracts the row maximum, so large finite scores give (near-)argmax
    attention instead of ``inf``/``NaN``.
    """
    scores = jnp.einsum("qd,hde,ke->hqk", queries, theta, keys)
    return softmax(temperature * scores)


def attention_weights(
    X: Float[Array, "tokens dim"], theta: Float[Array, "heads dim dim"]
) -> Float[Array, "heads tokens tokens"]:
    """Attention of every head: ``A_i = softmax(X Θ_i Xᵀ)``, each row summing to one over keys."""
    X, theta = arrays(X=X, theta=theta)
    check_shapes(("X", X, "tokens dim"), ("theta", theta, "heads dim dim"))
    # the library softmax: the Chen–Li layer keeps forward-mode derivatives (jax.jvp)
    return _attend(X, X, theta, softmax=partial(jax.nn.softmax, axis=-1))


def head_features(
    X: Float[Array, "tokens dim"], theta: Float[Array, "heads dim dim"]
) -> Float[Array, "heads tokens dim"]:
    """Per-head features ``Φ_i(X) = A_i(X) X``; the layer is ``Σ_i Φ_i W_i``, linear in ``W``."""
    (X,) = arrays(X=X)
    return attention_weights(X, theta) @ X


def mha(
    X: Float[Array, "tokens dim"],
    theta: Float[Array, "heads dim dim"],
    W: Float[Array, "heads dim dim"],
) -> Float[Array, "tokens dim"]:
    """The Chen–Li multi-head attention layer ``F(X) = Σ_i softmax(X Θ_i Xᵀ) X W_i``.

    No 1/√d temperature (the scale lives in Θ), no mask, residual, bias or normalisation;
    the softmax is row-wise over keys.

    Args:
        X: one sequence, tokens × dim.
        theta: the heads' attention matrices Θ_i, heads × dim × dim.
        W: the heads' value matrices W_i, heads × dim × dim.

    Returns:
        F(X), tokens × dim.

    Raises:
        ValueError: the shapes do not agree (the message names the expected and the
            received shapes).

    References:
        Chen & Li, "Provably learning a multi-head attention layer", arXiv:2402.04084.
    """
    X, theta, W = arrays(X=X, theta=theta, W=W)
    check_shapes(
        ("X", X, "tokens dim"), ("theta", theta, "heads dim dim"), ("W", W, "heads dim dim")
    )
    return jnp.einsum("htd,hde->te", head_features(X, theta), W)


# --------------------------------------------------------------------------------------
# The classifier score family of Deora et al. (reconstructed; every choice is an option)

Query = Literal["all", "first", "prompt", "given"]
Readout = Literal["matrix", "vector"]
HeadScaling = Literal["sqrt", "mean", "sum"]


@dataclasses.dataclass(frozen=True)
class ClassifierSpec:
    """Structural choices of the classifier ``Φ(X) = α_H Σ_h ⟨U_h, softmax(τ·Q W_h Xᵀ) X⟩``.

    - ``query``: ``"all"`` (Q = X, every token queries), ``"first"`` (Q = x_1: the
      self-attention of Tarzanagh et al.), ``"prompt"`` (Q = p, a trainable prompt vector) or
      ``"given"`` (Q = z, a query token given with each sample: their cross-attention).
    - ``readout``: ``"matrix"`` (U_h of shape ``(queries, dim)``) or ``"vector"`` (u_h of
      shape ``(dim,)`` applied to every query's output and summed, i.e. U_h = 1 u_hᵀ).
    - ``head_scaling``: α_H = 1/√H (``"sqrt"``), 1/H (``"mean"``) or 1 (``"sum"``), with H
      the number of *active* heads under the head mask.
    - ``temperature``: τ multiplying the scores (1, or ``1/math.sqrt(dim)``).

    Transpose convention: query q scores token x as ``qᵀ W_h x`` (W acts on the query from the
    left). Tarzanagh et al. ("Transformers as Support Vector Machines") write ``xᵀ W z``: their
    W is our ``W_hᵀ``.
    """

    query: Query = "all"
    readout: Readout = "matrix"
    head_scaling: HeadScaling = "sqrt"
    temperature: float = 1.0

    def __post_init__(self):
        choice("query", self.query, ("all", "first", "prompt", "given"))
        choice("readout", self.readout, ("matrix", "vector"))
        choice("head_scaling", self.head_scaling, ("sqrt", "mean", "sum"))
        in_range("temperature", self.temperature, 0.0, open_low=True)

    def queries(self, tokens: int) -> int:
        """Number of query rows: ``tokens`` when every token queries, else one."""
        return tokens if self.query == "all" else 1

    def readout_axes(self) -> str:
        """The named shape of U for this readout."""
        return "heads queries dim" if self.readout == "matrix" else "heads dim"


def head_scale(active_heads: Float[Array, ""], scaling: HeadScaling) -> Float[Array, ""]:
    """α_H from the number of active heads (at least one, so an all-masked model scores 0)."""
    h = jnp.maximum(active_heads, 1)
    if scaling == "sqrt":
        return 1.0 / jnp.sqrt(h)
    if scaling == "mean":
        return 1.0 / h
    return jnp.ones_like(h)


def _query_vector(name: str, query: str, value, dim: int) -> Float[Array, "1 dim"]:
    if value is None:
        raise ValueError(f"{name}: query={query!r} needs a {name} of shape (dim,), received None")
    (value,) = arrays(**{name: value})
    check_shapes((name, value, "dim"), dim=dim)
    return value[None, :]


def classifier_attention(
    X: Float[Array, "tokens dim"],
    W: Float[Array, "heads dim dim"],
    spec: ClassifierSpec,
    prompt: Float[Array, " dim"] | None = None,
    query_token: Float[Array, " dim"] | None = None,
) -> Float[Array, "heads queries tokens"]:
    """Attention of the classifier's queries over the tokens, for every head: query q gives
    token x the weight ∝ exp(τ·qᵀ W_h x). ``query_token`` is the sample's query when
    ``spec.query == "given"``."""
    X, W = arrays(X=X, W=W)
    check_shapes(("X", X, "tokens dim"), ("W", W, "heads dim dim"))
    if spec.query == "prompt":
        queries = _query_vector("prompt", spec.query, prompt, X.shape[1])
    elif spec.query == "given":
        queries = _query_vector("query_token", spec.query, query_token, X.shape[1])
    else:
        queries = X if spec.query == "all" else X[:1]
    return _attend(queries, X, W, spec.temperature)


def classifier_score(
    X: Float[Array, "tokens dim"],
    W: Float[Array, "heads dim dim"],
    U: Float[Array, "heads queries dim"] | Float[Array, "heads dim"],
    spec: ClassifierSpec,
    prompt: Float[Array, " dim"] | None = None,
    head_mask: Float[Array, " heads"] | None = None,
    query_token: Float[Array, " dim"] | None = None,
) -> Float[Array, ""]:
    """The classifier's real-valued score ``Φ(X)``; the label is its sign. ``query_token``:
    the sample's query when ``spec.query == "given"``.

    ``head_mask`` (0/1 per head, an array so it can vary under ``vmap``) switches heads off:
    a masked head contributes nothing and α_H is computed from the active count, so models
    with different numbers of heads share one compilation.
    """
    X, W, U = arrays(X=X, W=W, U=U)
    A = classifier_attention(X, W, spec, prompt, query_token)
    sizes = check_shapes(
        ("U", U, spec.readout_axes()),
        heads=W.shape[0],
        queries=A.shape[1],
        dim=X.shape[1],
    )
    out = A @ X  # (heads, queries, dim)
    per_head = (
        jnp.sum(U * out, axis=(-2, -1))
        if spec.readout == "matrix"
        else jnp.einsum("hd,hqd->h", U, out)
    )
    if head_mask is None:
        head_mask = jnp.ones(sizes["heads"], per_head.dtype)
    else:
        check_shapes(("head_mask", head_mask, "heads"), heads=sizes["heads"])
        (head_mask,) = arrays(head_mask=head_mask)
        head_mask = head_mask.astype(per_head.dtype)
    alpha = head_scale(jnp.sum(head_mask), spec.head_scaling)
    return alpha * jnp.sum(head_mask * per_head)
