"""The losses against closed forms and loops, including where a naive formula overflows."""

import math

import jax.numpy as jnp
import numpy as np

from mhalearn import losses


def test_squared_loss_is_the_mean_over_every_entry(rng):
    pred, target = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    total = sum(
        (pred[i, j, k] - target[i, j, k]) ** 2 for i in range(3) for j in range(4) for k in range(5)
    )
    np.testing.assert_allclose(losses.squared_loss(pred, target), total / 60, rtol=1e-12)
    np.testing.assert_allclose(losses.mean_square(pred - target), total / 60, rtol=1e-12)


def test_logistic_loss_is_stable_at_large_margins():
    y = jnp.array([1.0, -1.0, 1.0, -1.0])
    s = jnp.array([800.0, 800.0, -800.0, 0.0])  # e^{800} overflows float64
    # log(1 + e^{-m}) for margins m = 800, −800, −800, 0: ≈ e^{-800}, 800, 800, log 2
    expected = (math.exp(-800) + 800 + 800 + math.log(2)) / 4
    value = losses.logistic_loss(s, y)
    assert np.isfinite(value)
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    small = jnp.array([0.3, -1.2])
    loop = np.mean([math.log1p(math.exp(-m)) for m in (0.3, 1.2)])
    np.testing.assert_allclose(losses.logistic_loss(small, jnp.array([1.0, -1.0])), loop)


def test_zero_one_error_counts_a_zero_score_as_wrong():
    y = jnp.array([1.0, -1.0, 1.0, -1.0])
    s = jnp.array([0.5, 0.5, 0.0, -2.0])
    np.testing.assert_allclose(losses.zero_one_error(s, y), 0.5)  # the 2nd and the tie
