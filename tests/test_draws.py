"""mhalearn.draws gives jax.random's own numbers (drawn flat, then shaped), under jit and vmap;
its Rademacher signs are the bits of raw words, checked against that definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhalearn import draws

SHAPES = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_float_draws_are_jax_randoms(shape, dtype):
    key = jax.random.key(11)
    for ours, theirs in [
        (draws.normal, jax.random.normal),
        (draws.uniform, jax.random.uniform),
    ]:
        got = jax.jit(lambda k, f=ours: f(k, shape, dtype))(key)
        want = theirs(key, shape, dtype=dtype)
        assert got.shape == shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("shape", SHAPES)
def test_integer_and_boolean_draws_are_jax_randoms(shape):
    key = jax.random.key(5)
    np.testing.assert_array_equal(
        draws.randint(key, shape, 0, 9), jax.random.randint(key, shape, 0, 9)
    )
    np.testing.assert_array_equal(
        draws.bernoulli(key, 0.3, shape), jax.random.bernoulli(key, 0.3, shape)
    )


def test_vmapped_draws_are_jax_randoms():
    keys = jax.random.split(jax.random.key(2), 4)
    got = jax.vmap(lambda k: draws.normal(k, (3, 4)))(keys)
    want = jax.vmap(lambda k: jax.random.normal(k, (3, 4)))(keys)
    np.testing.assert_array_equal(got, want)


def test_raw_uint32_keys_give_the_same_numbers_too():
    key = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(draws.normal(key, (2, 5)), jax.random.normal(key, (2, 5)))


@pytest.mark.parametrize("shape", [(1,), (31,), (32,), (33,), (3, 5, 7), (2, 64)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_rademacher_signs_are_the_bits_of_raw_words_32_to_a_word(shape, dtype):
    key = jax.random.key(7)
    got = np.asarray(jax.jit(lambda k: draws.rademacher(k, shape, dtype))(key))
    n = int(np.prod(shape))
    words = np.asarray(jax.random.bits(key, (-(-n // 32),), jnp.uint32))
    want = np.empty(n)
    for i in range(n):  # entry i: bit i % 32 of word i // 32
        want[i] = 1.0 if (int(words[i // 32]) >> (i % 32)) & 1 else -1.0
    assert got.shape == shape and got.dtype == dtype
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_rademacher_signs_are_fair_and_independent_of_their_neighbours():
    """Over 2^20 signs: the mean within 5 standard errors of 0, and so is the mean product of
    every pair of neighbours at lags 1–64 (the bits within a word and across words)."""
    x = np.asarray(draws.rademacher(jax.random.key(3), (2**20,)), np.float64)
    se = 1 / np.sqrt(x.size)
    assert set(np.unique(x)) == {-1.0, 1.0}
    assert abs(x.mean()) < 5 * se
    for lag in range(1, 65):
        assert abs(np.mean(x[:-lag] * x[lag:])) < 5 * se, lag
