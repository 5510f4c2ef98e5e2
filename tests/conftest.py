"""Test entry point: float64 is enabled here (never by the library itself).

float32 behaviour is tested by passing float32 arrays explicitly, and the default-precision
path (x64 off) by the CLI tests, which run in a subprocess.
"""

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)
