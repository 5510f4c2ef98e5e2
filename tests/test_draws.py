"""mhalearn.draws gives jax.random's own numbers (drawn flat, then shaped), under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhalearn import draws

SHAPES = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_float_draws_are_jax_randoms(shape, dtype):
    key = jax.random.key(11)
    for ours, theirs in [
        (draws.normal, jax.random.normal),
        (draws.uniform, jax.random.uniform),
        (draws.rademacher, jax.random.rademacher),
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
