"""Input distributions: Boolean and Gaussian tokens, and the tokenized mixture.

Every generator takes ``key`` first and draws in the default float dtype (float32, or
float64 when the caller has enabled ``jax_enable_x64``) unless ``dtype`` is given.
"""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import choice, in_range, positive_int, positive_shape

TokenDistribution = Literal["boolean", "gaussian"]
TOKEN_DISTRIBUTIONS = ("boolean", "gaussian")


def _float_dtype(dtype):
    return jnp.result_type(float) if dtype is None else jnp.dtype(dtype)


def boolean_tokens(key: PRNGKeyArray, shape, dtype=None) -> Float[Array, ...]:
    """Entries i.i.d. uniform on {-1, +1} (Chen–Li's main input distribution)."""
    shape = positive_shape("shape", shape)
    return draws.rademacher(key, shape, dtype=_float_dtype(dtype))


def gaussian_tokens(key: PRNGKeyArray, shape, dtype=None) -> Float[Array, ...]:
    """Entries i.i.d. standard normal (same first two moments as the Boolean tokens)."""
    shape = positive_shape("shape", shape)
    return draws.normal(key, shape, dtype=_float_dtype(dtype))


def same_token(X: Float[Array, "samples tokens dim"]) -> Bool[Array, "samples tokens tokens"]:
    """``[n, b, c]``: tokens b and c of sequence n have the same value (identical vectors)."""
    return jnp.all(X[:, :, None, :] == X[:, None, :, :], axis=-1)


def sample_tokens(
    key: PRNGKeyArray, distribution: TokenDistribution, shape, dtype=None
) -> Float[Array, ...]:
    """Draw tokens from a distribution named ``"boolean"`` or ``"gaussian"``."""
    choice("distribution", distribution, TOKEN_DISTRIBUTIONS)
    draw = boolean_tokens if distribution == "boolean" else gaussian_tokens
    return draw(key, shape, dtype)


# --------------------------------------------------------------------------------------
# Tokenized mixture (Deora et al.; reconstructed, every knob exposed)


class MixtureSpec(eqx.Module):
    """The tokenized-mixture model (reconstructed from the published summaries).

    Label y uniform on {-1, +1}. A set R of ``ceil(relevant_fraction * tokens)`` relevant
    positions (``positions="random"``: drawn afresh per sample; ``"fixed"``: the first
    positions). Relevant token: ``x_t = μ_y + z_t``; irrelevant token: ``x_t = ν_j + z_t``
    with j uniform over ``irrelevant_means`` means; ``z_t ~ N(0, noise² I / dim)``.

    ``decoys`` more positions (the ones after R when fixed, random otherwise) carry the
    *other* label's mean: ``x_t = μ_{−y} + z_t`` (our construction, not the paper's). With
    ``decoys == n_relevant`` the token average has the same law under both labels (its label
    part is n_R·(μ_+ + μ_-)/T either way), so the mean-pooled linear model — the classifier at
    W = 0, whose attention is uniform — is at chance, while with ``positions="fixed"`` the
    label is read off position 0 by any model whose attention tells positions' tokens apart
    (self-attention with W ∝ I, say): a family where attention is necessary. With
    ``positions="random"`` and ``decoys == n_relevant`` the sequence has the same law under
    both labels: no model beats chance (a null control).

    Means lie along standard basis vectors: ``means="orthogonal"`` puts μ_+, μ_- on e_0, e_1
    and ν_j on e_{2+j}; ``"antipodal"`` puts μ_± = ±signal_norm·e_0 and ν_j on e_{1+j}.
    (The noise is isotropic, so any orthonormal frame gives the same distribution up to a
    rotation.) ``signal_norm``, ``irrelevant_norm`` and ``noise`` are numbers that may be
    swept: pass arrays and ``vmap``.
    """

    tokens: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    relevant_fraction: float = eqx.field(static=True, default=0.25)
    irrelevant_means: int = eqx.field(static=True, default=2)
    decoys: int = eqx.field(static=True, default=0)
    positions: Literal["random", "fixed"] = eqx.field(static=True, default="random")
    means: Literal["orthogonal", "antipodal"] = eqx.field(static=True, default="orthogonal")
    signal_norm: float | Array = 1.0
    irrelevant_norm: float | Array = 1.0
    noise: float | Array = 0.5

    def __check_init__(self):
        positive_int("tokens", self.tokens)
        positive_int("dim", self.dim)
        in_range("relevant_fraction", self.relevant_fraction, 0.0, 1.0, open_low=True)
        if not isinstance(self.irrelevant_means, int) or self.irrelevant_means < 0:
            raise ValueError(
                f"irrelevant_means must be an integer >= 0, received {self.irrelevant_means!r}"
            )
        if not isinstance(self.decoys, int) or self.decoys < 0:
            raise ValueError(f"decoys must be an integer >= 0, received {self.decoys!r}")
        if self.n_relevant + self.decoys > self.tokens:
            raise ValueError(
                f"decoys must be <= tokens - n_relevant = {self.tokens - self.n_relevant}, "
                f"received {self.decoys}"
            )
        if self.n_relevant + self.decoys < self.tokens and self.irrelevant_means == 0:
            raise ValueError(
                "irrelevant_means must be >= 1 when some positions are irrelevant "
                f"(relevant_fraction={self.relevant_fraction}, decoys={self.decoys}, "
                f"tokens={self.tokens})"
            )
        choice("positions", self.positions, ("random", "fixed"))
        choice("means", self.means, ("orthogonal", "antipodal"))
        need = self.irrelevant_means + (2 if self.means == "orthogonal" else 1)
        if self.dim < need:
            raise ValueError(
                f"dim must be >= {need} for {self.means} means with "
                f"{self.irrelevant_means} irrelevant means, received dim={self.dim}"
            )
        for name in ("signal_norm", "irrelevant_norm", "noise"):
            in_range(name, getattr(self, name), 0.0)

    @property
    def n_relevant(self) -> int:
        """|R| = ceil(relevant_fraction * tokens)."""
        return math.ceil(self.relevant_fraction * self.tokens - 1e-9)

    def label_means(self, dtype=None) -> Float[Array, "2 dim"]:
        """Rows μ_- and μ_+ (indexed by (y + 1) / 2)."""
        eye = jnp.eye(self.dim, dtype=_float_dtype(dtype))
        plus = eye[0]
        minus = -eye[0] if self.means == "antipodal" else eye[1]
        return self.signal_norm * jnp.stack([minus, plus])

    def irrelevant_mean_vectors(self, dtype=None) -> Float[Array, "irrelevant dim"]:
        """Rows ν_1 .. ν_M."""
        first = 1 if self.means == "antipodal" else 2
        eye = jnp.eye(self.dim, dtype=_float_dtype(dtype))
        return self.irrelevant_norm * eye[first : first + self.irrelevant_means]


class Mixture(eqx.Module):
    """A sample of the tokenized mixture."""

    X: Float[Array, "samples tokens dim"]
    y: Float[Array, " samples"]
    relevant: Bool[Array, "samples tokens"]


def tokenized_mixture(key: PRNGKeyArray, spec: MixtureSpec, samples: int, dtype=None) -> Mixture:
    """Draw ``samples`` labelled sequences from the tokenized mixture ``spec``."""
    samples = positive_int("samples", samples)
    dtype = _float_dtype(dtype)
    k_label, k_pos, k_which, k_noise = jax.random.split(key, 4)
    T, d = spec.tokens, spec.dim

    y = draws.rademacher(k_label, (samples,), dtype=dtype)
    if spec.positions == "random":
        u = draws.uniform(k_pos, (samples, T))
        rank = jnp.argsort(jnp.argsort(u, axis=1), axis=1)
    else:
        rank = jnp.broadcast_to(jnp.arange(T), (samples, T))
    relevant = rank < spec.n_relevant

    decoy = (rank >= spec.n_relevant) & (rank < spec.n_relevant + spec.decoys)

    label_means = spec.label_means(dtype)
    signal = label_means[((y + 1) // 2).astype(jnp.int32)]  # (samples, dim)
    other = label_means[((1 - y) // 2).astype(jnp.int32)]  # μ_{−y}
    if spec.irrelevant_means > 0:
        which = draws.randint(k_which, (samples, T), 0, spec.irrelevant_means)
        background = spec.irrelevant_mean_vectors(dtype)[which]  # (samples, T, dim)
    else:
        background = jnp.zeros((samples, T, d), dtype)
    background = jnp.where(decoy[..., None], other[:, None, :], background)
    mean = jnp.where(relevant[..., None], signal[:, None, :], background)
    z = draws.normal(k_noise, (samples, T, d), dtype=dtype)
    X = mean + (spec.noise / math.sqrt(d)) * z
    return Mixture(X=X.astype(dtype), y=y, relevant=relevant)
