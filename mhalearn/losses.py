"""Losses on one instance's predictions, numerically stable in float32 and float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def mean_square(residual: Float[Array, ...]) -> Float[Array, ""]:
    """Mean of the squared entries of a residual."""
    return jnp.mean(residual**2)


def squared_loss(pred: Float[Array, ...], target: Float[Array, ...]) -> Float[Array, ""]:
    """Mean squared error over every entry (samples × tokens × dim)."""
    return mean_square(pred - target)


def logistic_loss(
    scores: Float[Array, " samples"], y: Float[Array, " samples"]
) -> Float[Array, ""]:
    """Mean of ℓ(y·s) = log(1 + e^{−y·s}), computed as softplus(−y·s) (no overflow)."""
    return jnp.mean(jax.nn.softplus(-y * scores))


def zero_one_error(
    scores: Float[Array, " samples"], y: Float[Array, " samples"]
) -> Float[Array, ""]:
    """Share of samples whose score has the wrong sign (a score of exactly 0 counts as wrong)."""
    return jnp.mean((y * scores <= 0).astype(scores.dtype))
