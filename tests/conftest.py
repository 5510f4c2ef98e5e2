"""Test entry point: float64 is enabled here (never by the library itself).

float32 behaviour is tested by passing float32 arrays explicitly, and the default-precision
path (x64 off) by the CLI tests, which run in a subprocess.
"""

import numpy as np
import pytest

from mhalearn.batch import set_precision

set_precision("float64")


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(scope="session")
def tiny_results(tmp_path_factory):
    """Each tiny study run once through a store: name → (study, path of results.nc)."""
    from mhalearn.experiments import STUDIES, run_study
    from mhalearn.store import Store

    root = tmp_path_factory.mktemp("studies")
    out = {}
    for name, cls in STUDIES.items():
        study = cls.preset("tiny")
        store = Store(root / name, study.config())
        run_study(study, store)
        out[name] = (study, store.results_path)
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The groups pytest-xdist's workers take whole (``--dist loadgroup``, the default in
    pyproject.toml): a module's tests (its compiled programs and fixtures made once), and
    every test that reads the tiny studies (computed once, by the worker that runs them).

    First among the hooks: pytest-xdist's own, which reads the marks into each test's id for
    its scheduler, runs before a conftest's otherwise, and sees none. pytest 9.2 ignores that
    rewritten id (pytest-xdist issue 1386), hence the test extra's ``pytest<9.2``;
    ``tests/test_workers.py`` fails where the groups are lost."""
    for item in items:
        tiny = "tiny_results" in getattr(item, "fixturenames", ())
        group = "tiny_results" if tiny else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True, scope="module")
def _fresh_compiled_state():
    """Each test module starts without the compiled programs of the ones before: a full run
    in one process crashed (a segmentation fault inside XLA's CPU compiler, reproducibly at
    the same test, never when the module ran alone) once hundreds of programs had piled up."""
    import gc

    import jax

    from mhalearn.batch import clear_programs

    yield
    clear_programs()
    jax.clear_caches()
    gc.collect()
