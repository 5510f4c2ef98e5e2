"""Random draws, flat and then shaped: jax.random's numbers, compiled faster.

With the partitionable threefry (JAX's default) a draw of shape ``(a, b, c)`` is the flat draw
of ``a·b·c`` numbers in row-major order, reshaped — but XLA:CPU compiles the n-dimensional
counter it builds for the former about six times slower (≈ 1 s against 0.15 s for 36 000
Gaussians; every draw in an instance program pays it). These functions draw flat and reshape:
the same numbers (``tests/test_draws.py`` holds them bitwise equal to ``jax.random``'s), less
compile time. Every random draw in the package goes through them (but the minibatch choice
of ``learners/gd.py``, a permutation). One is not jax.random's: :func:`rademacher` takes its
signs from the bits of raw words, 32 to a word.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray


def _flat(draw, key: PRNGKeyArray, shape: Sequence[int], *args, **kwargs) -> Array:
    shape = tuple(int(s) for s in shape)
    return draw(key, (math.prod(shape),), *args, **kwargs).reshape(shape)


def normal(key: PRNGKeyArray, shape: Sequence[int], dtype=None) -> Array:
    """``jax.random.normal(key, shape, dtype)``."""
    return _flat(jax.random.normal, key, shape, dtype=dtype or jnp.result_type(float))


def uniform(key: PRNGKeyArray, shape: Sequence[int], dtype=None) -> Array:
    """``jax.random.uniform(key, shape, dtype)`` on [0, 1)."""
    return _flat(jax.random.uniform, key, shape, dtype=dtype or jnp.result_type(float))


def rademacher(key: PRNGKeyArray, shape: Sequence[int], dtype=None) -> Array:
    """±1 with equal probability, independently: entry ``32·w + b`` (row-major) is bit ``b``
    of word ``w`` of ``jax.random.bits(key, (⌈n/32⌉,), uint32)``, 1 ↦ +1 and 0 ↦ −1.

    Not ``jax.random.rademacher``'s numbers: that spends a 32-bit word (a uniform float) on
    every sign, this one bit, so it draws 32 times fewer words: at the small shapes of the
    recovery studies, drawing the Boolean inputs was a sizeable share of an instance's run
    (docs: Performance)."""
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    words = jax.random.bits(key, (-(-n // 32),), jnp.uint32)
    bits = (words[:, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    signs = 2 * bits.reshape(-1)[:n].astype(dtype or jnp.result_type(float)) - 1
    return signs.reshape(shape)


def randint(key: PRNGKeyArray, shape: Sequence[int], low: int, high: int) -> Array:
    """``jax.random.randint(key, shape, low, high)``."""
    return _flat(jax.random.randint, key, shape, low, high)


def bernoulli(key: PRNGKeyArray, p: float | Array, shape: Sequence[int]) -> Array:
    """``jax.random.bernoulli(key, p, shape)`` for a scalar ``p``."""
    shape = tuple(int(s) for s in shape)
    return jax.random.bernoulli(key, p, (math.prod(shape),)).reshape(shape)
