"""The benchmark scripts still run: every script's options parse (fast tier); the GPU check's
steps run on the CPU at trial sizes, and so do the other scripts that need nothing from
outside (slow tier). Their timings are not checked, only that they run and write their rows,
into a temporary folder (``MHALEARN_BENCH_RESULTS``), never into ``benchmarks/results``."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))

#: the scripts outside the GPU check at trial sizes, with the rows each must write
TRIALS = {
    "heads.py": (["--small", "--steps", "20"], ["heads_sweep", "heads_theory"]),
    "kernel_scaling.py": ([], ["kernel_scaling"]),
    "gpu_choices.py": (["--small"], ["gpu_choices"]),
}
#: the scripts whose options alone are checked here, and why: what CI lacks, or a minute
#: each at their smallest sizes, which the suite's time cannot spare (run them by hand:
#: ``python benchmarks/pipeline_phases.py --samples 500 --teachers 1``,
#: ``python benchmarks/recovery.py --small --teachers 2``)
OPTIONS_ONLY = {
    "solvable_side_by_side.py": "the authors' checkouts and PyTorch",
    "fused_registers.py": "the Triton package (--compiler xla: tests/test_gpu_programs.py)",
    "gpu_programs.py": "JAX's CUDA plugin: tried in tests/test_gpu_programs.py (-m gpu_compile)",
    "pipeline_phases.py": "35 s at 500 samples",
    "recovery.py": "47 s at 2 teachers",
}
#: the rows the GPU check writes, one file per step but its last (the verdict on its targets)
GPU_CHECK_ROWS = ["accelerator_agreement", "compare", "throughput", "recovery_speed", "stages"]
GPU_CHECK_ROWS += ["linalg_ops", "fused"]
GPU_CHECK_STEPS = len(GPU_CHECK_ROWS) + 1


def _env(results: Path) -> dict[str, str]:
    return {**os.environ, "MHALEARN_BENCH_RESULTS": str(results), "PYTHON": sys.executable}


def _rows(results: Path, name: str) -> list[dict]:
    with (results / f"{name}.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_benchmark_script_parses_its_options():
    """Each script imported and its ``--help`` printed (one process, so that the scripts that
    set float64 at import touch no other test)."""
    code = (
        "import runpy, sys\n"
        "for path in sys.argv[1:]:\n"
        "    sys.argv = [path, '--help']\n"
        "    try:\n"
        "        runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), (path, e.code)\n"
        "    else:\n"
        "        raise AssertionError(f'{path}: --help did not exit')\n"
        "    print('parsed', path, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, SCRIPTS)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("usage:") == len(SCRIPTS) >= 10
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("parsed")] == [
        str(p) for p in SCRIPTS
    ]


def test_the_gpu_check_refuses_an_unknown_option():
    out = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), "--gpu"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "usage" in out.stderr


#: what the GPU machines' Python lacks of the package's dependencies (and cannot install: they
#: reach no registry); the GPU check must run without them
ABSENT_ON_GPU_MACHINES = ("tyro", "h5netcdf", "submitit")
BLOCKER = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {ABSENT_ON_GPU_MACHINES!r}:
            raise ModuleNotFoundError(f"{{name}} is not on the GPU machines")
sys.meta_path.insert(0, Absent())
"""


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_on_the_cpu_at_trial_sizes(tmp_path):
    """Every step at trial sizes, with the package imported from the checkout as on a GPU
    machine and the dependencies it lacks made unimportable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    results = tmp_path / "results"
    root = str(BENCHMARKS.parent)
    env = {**_env(results), "PYTHONPATH": os.pathsep.join([str(site), root])}
    for name in ABSENT_ON_GPU_MACHINES:  # the blocker holds in the steps' interpreter
        probe = subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True, text=True, env=env
        )
        assert probe.returncode == 1 and "not on the GPU machines" in probe.stderr, name
    out = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), "--cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "failed:" not in out.stdout
    assert out.stdout.count("=== exit 0 after") == GPU_CHECK_STEPS
    for name in GPU_CHECK_ROWS:
        rows = _rows(results, name)
        assert rows, name
    # the engine and the naive baseline at every shape, each against its ceiling
    compare = _rows(results, "compare")
    impls = {row["impl"] for row in compare}
    assert {"mhalearn", "mhalearn_fit", "jax_naive"} <= impls
    # on a CPU the fused kernel is no choice: every engine step after its timing ran with it off
    assert "full-batch GPU steps in the steps below: fused kernel off" in out.stdout
    assert {row["fused_on_gpu"] for row in compare} == {"off"}
    assert all(float(row["inst_steps_per_s"]) > 0 for row in compare)
    # variable projection's rows say the chunks its sums took: the engine's for a CPU
    from mhalearn.learners import reduced

    chunks = {row["chunk_rows"] for row in _rows(results, "recovery_speed")}
    assert chunks == {str(reduced.chunk_rows("cpu"))}
    # the verdict read this run's rows, variable projection's against a recorded CPU row
    verdict = out.stdout[out.stdout.index("benchmarks/gpu_targets.py") :]
    lines = ("1. end to end on cpu", "2. the fit alone on cpu", "3. variable projection on")
    for line in [*lines, "the fused kernel on cpu"]:
        assert line in verdict
    assert "no 2-core CPU row recorded" not in verdict


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TRIALS))
def test_the_other_benchmarks_run_at_trial_sizes(script, tmp_path):
    args, written = TRIALS[script]
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for name in written:
        assert _rows(tmp_path, name), name


def test_every_script_outside_the_gpu_check_is_tried_or_named():
    """A new benchmark script is added to a trial here or to the GPU check, or named among
    those whose options alone are checked, with the reason."""
    check = (BENCHMARKS / "gpu_check.sh").read_text()
    in_check = {p.name for p in SCRIPTS if f"benchmarks/{p.name}" in check}
    assert len(in_check) == GPU_CHECK_STEPS
    assert {p.name for p in SCRIPTS} == in_check | set(TRIALS) | set(OPTIONS_ONLY)


def _targets():
    spec = importlib.util.spec_from_file_location("gpu_targets", BENCHMARKS / "gpu_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fused_kernels_setting_reaches_the_engine_through_the_environment(monkeypatch):
    """gpu_check.sh's choice, in MHALEARN_BENCH_FUSED, sets mhalearn.fused in every script
    that imports _common; a malformed one is refused with the form it should have."""
    probe = "import _common; from mhalearn import fused; print(_common.fused_setting(), fused.FORM)"
    env = {
        **os.environ,
        "PYTHONPATH": str(BENCHMARKS),
        "MHALEARN_BENCH_FUSED": "blocks,recompute,32,4",
    }
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["blocks,recompute,32,4", "blocks"]
    env["MHALEARN_BENCH_FUSED"] = "pairs,16,8"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "FORM,keep|recompute,TILE_ROWS,WARPS" in out.stderr

    spec = importlib.util.spec_from_file_location("_common", BENCHMARKS / "_common.py")
    common = importlib.util.module_from_spec(spec)
    monkeypatch.delenv("MHALEARN_BENCH_FUSED", raising=False)
    spec.loader.exec_module(common)
    from mhalearn import fused

    for name in ("FUSED_ON_GPU", "FORM", "RECOMPUTE", "TILE_ROWS", "WARPS"):
        monkeypatch.setattr(fused, name, getattr(fused, name))  # restored after the test
    assert common.fused_setting() == "off"
    common.use_fused("pairs,keep,16,4")
    assert (fused.FUSED_ON_GPU, fused.FORM, fused.RECOMPUTE, fused.WARPS) == (
        True,
        "pairs",
        False,
        4,
    )
    assert common.fused_setting() == "pairs,keep,16,4"
    common.use_fused("off")
    assert not fused.FUSED_ON_GPU and common.fused_setting() == "off"
    for bad in ("on", "rows,keep,16,8", "pairs,kept,16,8", "pairs,keep,16,eight"):
        with pytest.raises(ValueError, match="MHALEARN_BENCH_FUSED"):
            common.use_fused(bad)


def test_the_targets_are_judged_from_the_rows():
    """The verdicts on hand-made rows: the slowest shape decides end to end, only rows at the
    standard shape with enough instances count for the fit, and variable projection is set
    against the latest 2-core CPU row at its own cell."""
    t = _targets()
    shape = dict(heads=2, dim=8, tokens=4, samples=32, instances=1024, device_kind="H200")
    compare = [
        {**shape, "impl": "mhalearn", "inst_steps_per_s": 90},
        {**shape, "impl": "jax_naive", "inst_steps_per_s": 100},
        {**shape, "samples": 512, "impl": "mhalearn", "inst_steps_per_s": 300},
        {**shape, "samples": 512, "impl": "jax_naive", "inst_steps_per_s": 100},
    ]
    lines = t.end_to_end(compare)
    assert "0.9× jit(vmap(scan))" in lines[0] and lines[0].endswith("NOT met")
    assert "full-batch steps through the XLA kernel" in lines[0]  # rows before the column
    fused_rows = [{**row, "fused_on_gpu": "pairs,keep,16,8"} for row in compare]
    assert "through the fused kernel (pairs,keep,16,8)" in t.end_to_end(fused_rows)[0]
    lines = t.end_to_end(compare[2:])
    assert "3× jit(vmap(scan))" in lines[0] and lines[0].endswith(": met")
    with pytest.raises(LookupError):
        t.end_to_end(compare[:1])

    standard = {**t.STANDARD, "device_kind": "H200", "ceiling_gflops": 5e4, "precision": "highest"}
    fit = [
        {**standard, "instances": 256, "fit_pct_of_ceiling": 50},  # too few instances
        {**standard, "instances": 16384, "fit_pct_of_ceiling": 29.5},
        {**standard, "heads": 2, "instances": 16384, "fit_pct_of_ceiling": 60},  # another shape
    ]
    assert t.fit_alone(fit, 16384)[0].endswith(
        "29.5% of the float32 ceiling (50000 GFLOP/s at 'highest') (target: 30%): NOT met"
    )
    assert t.fit_alone(fit, 256)[0].endswith(": met")
    with pytest.raises(LookupError):
        t.fit_alone(fit[2:], 16384)

    cell = dict(dim="8", tokens="4", heads="2", samples="1000", teachers="16")
    cpu = dict(cell, learner="varpro", device_kind="cpu", cores="2", s_per_recovered_wall="0.2")
    cpu_chunks = str(t.chunk_rows("cpu"))
    recorded = [
        {**cpu, "timestamp": "a", "s_per_recovered_steady": "1.0"},
        {**cpu, "timestamp": "b", "s_per_recovered_steady": "0.02", "chunk_rows": cpu_chunks},
        {**cpu, "cores": "16", "timestamp": "c", "s_per_recovered_steady": "9"},
        {**cpu, "teachers": "64", "timestamp": "d", "s_per_recovered_steady": "9"},
        {**cpu, "chunk_rows": "4096", "timestamp": "e", "s_per_recovered_steady": "9"},
    ]  # "b" the latest with the CPU's own chunks
    gpu = dict(cell, learner="varpro", device_kind="H200", recovered="16")
    row = {**gpu, "s_per_recovered_steady": "0.001", "s_per_recovered_wall": "0.1"}
    (line,) = t.varpro([row], recorded)
    assert "20× (target: 20×): met" in line and line.endswith("2×")
    row["s_per_recovered_steady"] = "0.002"
    assert "10× (target: 20×): NOT met" in t.varpro([row], recorded)[0]
    assert "no 2-core CPU row" in t.varpro([{**row, "teachers": "8"}], recorded)[0]

    fused = dict(t.STANDARD, instances=4096, device_kind="H100", tile_rows="16")
    rows = [
        {**fused, "kernel": "xla", "dim": 8, "us_per_instance": "1", "warps": ""},  # earlier
        {**fused, "kernel": "xla", "us_per_instance": "10", "tile_rows": "", "warps": ""},
        {**fused, "kernel": "fused_pairs", "warps": "8", "us_per_instance": "12"},
        {**fused, "kernel": "fused_blocks_recompute", "warps": "4", "us_per_instance": "5"},
        {**fused, "dim": 8, "kernel": "fused_pairs", "warps": "8", "us_per_instance": "1"},
        {**fused, "kernel": "fused_blocks", "warps": "8", "us_per_instance": "", "error": "E"},
        {**fused, "kernel": "fused_pairs", "warps": "4", "us_per_instance": "1"},  # wrong
    ]
    for row in rows:
        row.setdefault("max_rel_diff", "3e-7")
    rows[-1]["max_rel_diff"] = "0.01"
    head, *left_out, advice = t.fused_choice(rows)
    assert "fused_blocks_recompute (16 rows, 4 warps), 5 µs" in head and head.endswith("2×")
    assert left_out == [
        "  left out: fused_blocks on 8 warps: E",
        "  left out: fused_pairs on 4 warps: differs from the XLA kernel by 0.01",
    ]
    assert advice.endswith(
        "FORM = 'blocks', RECOMPUTE = True, TILE_ROWS = 16, WARPS = 4, FUSED_ON_GPU = True"
    )
    assert t.choose_fused(rows) == "blocks,recompute,16,4"  # what the later steps take
    head, advice = t.fused_choice(rows[:3])
    assert head.endswith("0.833×") and advice.endswith("keep FUSED_ON_GPU = False")
    assert t.choose_fused(rows[:3]) == "off"
    assert t.choose_fused([{**r, "device_kind": "cpu"} for r in rows]) == "off"
    with pytest.raises(LookupError):  # no fused row at the latest XLA row's shape
        t.fused_choice([rows[1], rows[4]])
    with pytest.raises(LookupError):
        t.fused_choice(rows[2:])
