"""Test entry point: float64 is enabled here (never by the library itself).

float32 behaviour is tested by passing float32 arrays explicitly, and the default-precision
path (x64 off) by the CLI tests, which run in a subprocess.
"""

import os
import pathlib
import shutil

import numpy as np
import pytest

# Compiled programs are kept in JAX's persistent cache, shared by the two workers, by later
# runs and by the processes the tests start (which read these variables): most of the fast
# tier's time is XLA compiling, and a program already compiled, by this run or an earlier
# one, is read instead. The cache holds XLA's binary for the same program, options and
# versions, so no result changes. Programs that compile in under CACHE_SECONDS are not kept
# (writing thousands of them cost more than it saved). JAX_COMPILATION_CACHE_DIR set
# beforehand names another folder; set empty, nothing is kept.
CACHE = pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax"
CACHE_SECONDS = 0.3
CACHE_LIMIT = 2**30  # bytes; a larger cache is emptied when a run starts
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(CACHE_SECONDS))


def _folder_bytes(folder: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


# pytest-xdist's controller empties an oversized cache before its workers start
_cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
if _cache and "PYTEST_XDIST_WORKER" not in os.environ:
    if _folder_bytes(pathlib.Path(_cache)) > CACHE_LIMIT:
        shutil.rmtree(_cache, ignore_errors=True)

# after the variables: JAX reads them when imported
from mhalearn.batch import enable_compilation_cache, set_precision  # noqa: E402

set_precision("float64")
if _cache:  # in this process too, where a plugin imported JAX before this file
    enable_compilation_cache(
        _cache, float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
    )


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
