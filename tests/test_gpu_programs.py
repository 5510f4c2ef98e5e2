"""The engine's programs compiled for a GPU on this machine, which has none: by the XLA GPU
compiler of the installed jaxlib for a compile-only H100 (``benchmarks/gpu_programs.py``).

They need JAX's CUDA plugin (``pip install -e ".[gpu-compile]"``) and ``JAX_PLATFORMS=cpu``,
and run as their own tier: ``JAX_PLATFORMS=cpu pytest -m gpu_compile``. CI installs the
plugin and sets ``MHALEARN_REQUIRE_GPU_COMPILER``, under which a missing plugin fails them
instead of skipping them."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

pytestmark = pytest.mark.gpu_compile

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("gpu_programs", BENCHMARKS / "gpu_programs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu():
    """(the script's module, a compile-only GPU)."""
    module = _script()
    try:
        return module, module.gpu_device()
    except SystemExit as err:
        if os.environ.get("MHALEARN_REQUIRE_GPU_COMPILER"):
            pytest.fail(f"{err} (and JAX_PLATFORMS=cpu)")
        pytest.skip(f"{err} (and JAX_PLATFORMS=cpu)")


def _counts(gpu, fn, *args, trips=None, branch=None):
    module, device = gpu
    text = module.compiled_text(fn, args, device)
    return module.count(text, trips or _refuse, branch or _refuse)


def _refuse(*_):
    raise AssertionError("no loop of unknown length or branch was expected")


def _run(script: str, args: list[str], results: Path) -> list[dict]:
    """The rows a benchmark script run with ``args`` writes, its results into ``results``."""
    env = {**os.environ, "MHALEARN_BENCH_RESULTS": str(results), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with (results / f"{Path(script).stem}.csv").open(newline="") as f:
        return list(csv.DictReader(f))


X = jax.ShapeDtypeStruct((64, 32), jnp.float32)


def _scan(steps):
    def fn(x):
        def step(x, _):
            y = jnp.tanh(x @ x.T) @ x
            return y / jnp.sum(y), None

        return jax.lax.scan(step, x, None, steps)[0]

    return fn


def test_a_scan_runs_its_body_again_and_again_without_asking_the_host(gpu):
    short, long = (_counts(gpu, _scan(n), X) for n in (7, 14))
    per_step = (long["launches"] - short["launches"]) / 7
    assert per_step >= 1 and per_step == int(per_step)
    assert short["launches"] >= 7 * per_step
    assert short["host_reads"] == long["host_reads"] == 0


def test_a_loop_of_unknown_length_asks_the_host_before_every_trip(gpu):
    def fn(x):
        body = _scan(1)
        return jax.lax.while_loop(lambda x: jnp.sum(x) < 1e3, body, x)

    runs = {n: _counts(gpu, fn, X, trips=lambda function, n=n: n) for n in (0, 5)}
    assert runs[0]["host_reads"] == 1 and runs[5]["host_reads"] == 6
    assert runs[5]["launches"] > runs[0]["launches"]


def test_a_branch_counts_what_runs_in_it(gpu):
    def fn(x):
        return jax.lax.cond(jnp.sum(x) > 0, _scan(6), lambda x: x, x)

    def taking(which):
        def branch(function, branches):
            # the branch of six steps is the one with the loop
            steps = [i for i, (loops, _) in enumerate(branches) if 6 in loops]
            return [float((i in steps) == which) for i in range(len(branches))]

        return branch

    ran, skipped = (_counts(gpu, fn, X, branch=taking(w)) for w in (True, False))
    assert ran["host_reads"] == skipped["host_reads"] == 1
    assert ran["launches"] > skipped["launches"]


def test_the_engine_compiles_for_a_gpu_with_its_fused_kernel_once_a_step(gpu, tmp_path):
    """The whole instance program (draw, fit, score) and the fit, with the fused Pallas kernel
    compiled by XLA's own Triton for sm_90: one kernel call per GD step and nothing else of
    the gradient's, and the fit in fewer launches than jit(vmap(scan)) at the phase cells'
    shape, where launches are what a GPU's time goes to."""
    args = ["--shapes", "3", "--steps", "20", "--fused"]
    rows = {row["program"]: row for row in _run("gpu_programs.py", args, tmp_path)}
    assert set(rows) == {"engine", "engine_fit", "jax_naive"}
    assert int(rows["engine"]["triton_calls"]) == int(rows["engine_fit"]["triton_calls"]) == 20
    assert int(rows["jax_naive"]["triton_calls"]) == 0
    assert int(rows["jax_naive"]["host_reads"]) == 0
    assert int(rows["engine_fit"]["launches"]) < int(rows["jax_naive"]["launches"])


def test_the_fused_kernel_as_xlas_own_triton_compiles_it_for_sm_90(gpu, tmp_path):
    """fused_registers.py --compiler xla: the kernel's PTX from XLA's dump, assembled by
    ptxas, in both forms kept and recomputed, at the default tile on 8 warps."""
    args = ["--compiler", "xla", "--tile-rows", "16", "--warps", "8"]
    rows = _run("fused_registers.py", args, tmp_path)
    assert len(rows) == 4 and all(row["compiler"].endswith("XLA") for row in rows)
    assert all(0 < int(row["registers"]) <= 255 for row in rows)
    assert all(int(row["shared_bytes"]) > 0 for row in rows)


def test_variable_projection_for_a_gpu_sums_its_system_in_fewer_rounds(gpu, tmp_path):
    """gpu_programs.py --varpro: one start of variable projection over 256 teachers, compiled
    for a GPU, its Gauss–Newton sums in the CPU's chunks and in an accelerator's (one chunk at
    this cell): fewer launches, the same host reads (one per iteration and per start), more
    temporary memory."""
    rows = _run("gpu_programs.py", ["--varpro"], tmp_path)
    cpu_chunks, gpu_chunks = rows
    from mhalearn.learners import reduced

    assert int(cpu_chunks["chunk_rows"]) == reduced.chunk_rows("cpu")
    assert int(gpu_chunks["chunk_rows"]) == reduced.chunk_rows("gpu") > reduced.chunk_rows("cpu")
    assert int(gpu_chunks["launches"]) < int(cpu_chunks["launches"])
    memory = [float(row["temp_mb_per_teacher"]) for row in rows]
    assert 0 < memory[0] < memory[1]
    iterations = int(gpu_chunks["steps"])
    assert int(gpu_chunks["host_reads"]) == int(cpu_chunks["host_reads"]) == iterations + 3
