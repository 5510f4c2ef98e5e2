"""The command: runs in a subprocess (which also exercises the default precision, x64 off),
bad arguments in process."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import xarray as xr

from mhalearn import cli
from mhalearn.experiments import STUDIES
from mhalearn.options import field_docs, options, study_options
from mhalearn.store import load

TINY_RUN = ["run", "regimes", "--beta", "1", "4", "--heads", "1", "2", "--inputs", "boolean",
            "--samples", "16", "--instances", "2"]  # fmt: skip


def mhalearn(*args, cwd=None, flags=()):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    return subprocess.run(
        [sys.executable, *flags, "-m", "mhalearn", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )


def snapshot(folder):
    return {
        p.relative_to(folder): (None if p.is_dir() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.slow
def test_run_writes_netcdf_and_png_and_resumes(tmp_path):
    out = mhalearn(*TINY_RUN, "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "regimes"
    ds = load(folder / "results.nc")
    assert ds.attrs["precision"] == "float32" and ds.sizes["beta"] == 2
    assert json.loads((folder / "config.json").read_text())["precision"] == "float32"
    assert (folder / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "agreement (median over 2 instances)" in out.stdout and "regimes: 2 of 2" in out.stdout
    again = mhalearn(*TINY_RUN, "--out", str(tmp_path))
    assert again.returncode == 0 and "regimes: 0 of 2 cells run" in again.stdout
    assert load(folder / "results.nc").identical(ds)


@pytest.mark.slow
def test_quiet_float64_and_plot(tmp_path):
    out = mhalearn(*TINY_RUN, "--out", str(tmp_path), "--precision", "float64", "--quiet")
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    results = tmp_path / "regimes" / "results.nc"
    assert load(results).attrs["precision"] == "float64"
    drawn = mhalearn("plot", str(results), "--figure", str(tmp_path / "again.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    folder = mhalearn("plot", str(tmp_path / "regimes"))  # a folder stands for its results.nc
    assert folder.returncode == 0 and folder.stdout.strip().endswith("regimes/figure.png")


@pytest.mark.slow
def test_a_refused_run_leaves_the_folder_exactly_as_it_was(tmp_path):
    assert mhalearn(*TINY_RUN, "--out", str(tmp_path), "--quiet").returncode == 0
    (tmp_path / "regimes" / "stray.txt").write_text("from the old run")
    before = snapshot(tmp_path)
    for bad in (["--devices", "99"], ["--chunk-size", "0"], ["--instances", "3", "--dim", "0"]):
        out = mhalearn(*TINY_RUN, *bad, "--out", str(tmp_path), "--overwrite")
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert snapshot(tmp_path) == before
    out = mhalearn(*TINY_RUN, "--instances", "3", "--out", str(tmp_path), "--quiet")
    assert out.returncode == 2 and "instances is 2 there, 3 here" in out.stderr
    assert snapshot(tmp_path) == before
    fresh = tmp_path / "never"
    assert mhalearn(*TINY_RUN, "--devices", "99", "--out", str(fresh)).returncode == 2
    assert not fresh.exists()
    replaced = mhalearn(*TINY_RUN, "--instances", "3", "--out", str(tmp_path), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert load(tmp_path / "regimes" / "results.nc").sizes["instance"] == 3
    assert not (tmp_path / "regimes" / "stray.txt").exists()


@pytest.mark.slow
def test_growing_the_grid_from_the_command_computes_only_new_cells(tmp_path):
    assert mhalearn(*TINY_RUN, "--out", str(tmp_path), "--quiet").returncode == 0
    larger = [*TINY_RUN, "--heads", "1", "2", "3"]  # the last --heads wins
    grown = mhalearn(*larger, "--out", str(tmp_path))
    assert grown.returncode == 0, grown.stderr
    assert "regimes: 1 of 3 cells run" in grown.stdout
    fresh = mhalearn(*larger, "--out", str(tmp_path / "fresh"), "--quiet")
    assert fresh.returncode == 0
    xr.testing.assert_identical(
        load(tmp_path / "regimes" / "results.nc"), load(tmp_path / "fresh" / "regimes")
    )


@pytest.mark.slow
def test_two_learners_with_different_diagnostics_and_no_warning(tmp_path):
    run = ["run", "recovery", "--learner", "varpro", "chen_li", "--samples", "40", "--heads", "2",
           "--dim", "4", "--tokens", "3", "--instances", "2", "--quiet"]  # fmt: skip
    out = mhalearn(*run, "--out", str(tmp_path), flags=("-W", "error"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    ds = load(tmp_path / "recovery")
    varpro = ds.sel(learner="varpro")
    assert np.isnan(varpro["info_rows_certified"]).all()  # varpro has no such field
    assert np.isnan(varpro["info_accepted"]).all()
    chen_li = ds.sel(learner="chen_li")
    assert np.isin(chen_li["info_accepted"], [0, 1]).all()
    assert (chen_li["info_rows_certified"] >= 0).all()
    assert ds["success"].dtype == np.int8 and ds["success"].attrs["tolerance"] == 1e-3
    assert ds["teacher_accepted"].dtype == np.int8


def test_list_names_every_study_with_its_options_and_their_meaning():
    out = mhalearn("list")
    assert out.returncode == 0
    for name, cls in STUDIES.items():
        assert f"{name}" in out.stdout and cls.summary in out.stdout
    assert "phase (default)" in out.stdout and "--instances 64" in out.stdout
    assert "Random teachers per grid point." in out.stdout
    lines = out.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("    --"):  # each option is followed by its one-line meaning
            assert lines[i + 1].startswith("        ") and len(lines[i + 1].strip()) > 10, line


def test_help_describes_the_tool_and_every_option_in_plain_text():
    top = mhalearn("--help")
    assert top.returncode == 0
    assert "Simulate how multi-head attention layers are learned" in top.stdout
    for name in STUDIES:
        assert f"{name}:" in top.stdout
    for name, cls in STUDIES.items():
        text = mhalearn("run", name, "--help").stdout
        assert "``" not in text and ":func:" not in text and "{None" not in text, name
        docs = field_docs(cls)
        for field in (f.name for f in dataclasses.fields(cls)):  # each one has a meaning
            assert docs.get(field), f"{name}.{field} has no docstring"
            assert "``" not in docs[field] and ":func:" not in docs[field]
            assert f"--{field.replace('_', '-')}" in text
    bench = mhalearn("bench", "--help").stdout
    assert all(name in bench for name in ("compare", "throughput", "recovery", "heads"))


def test_bench_wants_a_name_and_refuses_unknown_ones():
    out = mhalearn("bench")
    assert out.returncode == 2 and "name the benchmarks to run" in out.stderr
    out = mhalearn("bench", "nonsense")
    assert out.returncode == 2 and "unknown benchmark 'nonsense'" in out.stderr


@pytest.mark.slow
def test_options_may_come_before_the_study_name(tmp_path):
    args = ["run", "--instances", "2", "regimes", "--beta", "1", "--heads", "1", "--inputs",
            "boolean", "--samples", "8", "--quiet", "--out", str(tmp_path)]  # fmt: skip
    out = mhalearn(*args)
    assert out.returncode == 0, out.stderr
    assert load(tmp_path / "regimes").sizes["instance"] == 2


def test_a_closed_pipe_is_no_traceback():
    """`mhalearn list | head`: the reader is gone before the command writes (closed here at
    once, so the write must fail: the command starts in about a second)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mhalearn", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    code = proc.wait(timeout=120)
    stderr = proc.stderr.read()
    assert code == 141, (code, stderr)  # 128 + SIGPIPE, as `yes | head` ends
    assert stderr == ""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths for the bad inputs: a regular file, a truncated results file, a folder."""
    root = tmp_path_factory.mktemp("bad")
    (root / "afile").write_text("x")
    good = root / "good"
    assert mhalearn(*TINY_RUN, "--quiet", "--out", str(good)).returncode == 0
    data = (good / "regimes" / "results.nc").read_bytes()
    (root / "truncated.nc").write_bytes(data[: len(data) // 2])
    (root / "folder").mkdir()
    return root


#: (arguments, what the one-line message must say); {root}: the fixture's folder
BAD = [
    (
        ["run", "nonsense"],
        "unknown study 'nonsense'; expected one of aim, attention_phase, heads, margin, max_margin",
    ),
    (["run", "regimes", "--instances", "1.5"], "--instances: expected an integer"),
    (["run", "regimes", "--beta", "x"], "--beta: cannot read 'x' (expected --beta [FLOAT"),
    (["run", "regimes", "--heads", "0"], "heads must be an integer >= 1, received 0"),
    (["run", "recovery", "--instances", "0"], "instances must be an integer >= 1"),
    (["run", "regimes", "--dim", "0"], "dim must be an integer >= 1"),
    (["run", "regimes", "--delta", "0.9"], "delta must lie in (0.0, 0.5]"),
    (["run", "regimes", "--beta", "inf"], "(a finite number), received inf"),
    (["run", "regimes", "--beta", "nan"], "(a finite number), received nan"),
    (["run", "recovery", "--beta", "-1"], "beta must lie in [0.0, inf)"),
    (["run", "heads", "--lr", "0"], "lr must lie in (0.0, inf)"),
    (["run", "recovery", "--success-tol", "0"], "success_tol must lie in (0.0"),
    (["run", "stepsize", "--rise-tol", "-1"], "rise_tol must lie in"),
    (["run", "regimes", "--seed", "-1"], "seed must lie in [0"),
    (["run", "recovery", "--family", "two_tokens"], "needs tokens == 2"),
    (["run", "recovery", "--learner", "magic"], "learner must be one of"),
    (["run", "regimes", "--inputs", "uniform"], "invalid choice 'uniform'"),
    (["run", "margin", "--init", "random"], "invalid choice 'random'"),
    (["run", "regimes", "--precision", "float16"], "invalid choice 'float16'"),
    (["run", "recovery", "--samples", "100", "100"], "samples: values must be distinct"),
    (["run", "recovery", "--heads"], "heads: expected at least one value"),
    (["run", "--bogus"], "Unrecognized options: --bogus"),
    (["run", "regimes", "--cpu-devices", "0"], "cpu_devices must be an integer >= 1"),
    (["run", "regimes", "--chunk-size", "0"], "chunk_size must be an integer >= 1"),
    (["run", "regimes", "--devices", "99"], "devices must lie in [1, 1] here, received 99"),
    (["run", "regimes", "--out", "/proc/forbidden"], "out: cannot write to /proc/forbidden"),
    (["run", "regimes", "--out", "{root}/afile"], "which is a file"),
    (["run", "regimes", "--compilation-cache", "{root}/afile"], "compilation-cache: "),
    (["plot", "nowhere.nc"], "no results file at nowhere.nc"),
    (["plot", "{root}/truncated.nc"], "truncated.nc is not a readable netCDF results file"),
    (["plot", "{root}/afile"], "afile is not a readable netCDF results file"),
    (["plot", "{root}/folder"], "folder is a folder without a results.nc"),
    (["plot", "{root}/good/regimes", "--figure", "/proc/forbidden/x.png"], "--figure: cannot"),
    (["bench"], "name the benchmarks to run"),
]


@pytest.mark.parametrize(("args", "fragment"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_every_bad_input_gets_one_line_exit_2_and_no_traceback(args, fragment, files, capsys):
    code = cli.main([a.replace("{root}", str(files)) for a in args])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert "__tyro" not in out.err, out.err
    assert code == 2, out.err
    assert len(lines) == 1 and lines[0].startswith("mhalearn: error: "), out.err
    assert fragment.replace("{root}", str(files)) in lines[0], lines[0]
    assert "Traceback" not in out.err
    assert out.out == ""


def test_a_bad_argument_is_answered_without_jax_or_the_studies():
    """Parsing and the checks every study shares touch neither JAX nor a study module."""
    script = (
        "import sys\n"
        "from mhalearn.cli import main\n"
        "codes = [main(a) for a in (['run', '--heads', '0'], ['run', 'regimes', '--beta', '-1'],"
        " ['run', '--bogus'], ['run', 'recovery', '--instances', '1.5'])]\n"
        "loaded = [m for m in sys.modules if m == 'jax' or m.startswith('mhalearn.experiments')]\n"
        "print(codes, loaded)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "[2, 2, 2, 2] []", run.stdout + run.stderr


def test_the_options_file_matches_the_study_classes():
    """mhalearn/studies.json is current (rewrite it with
    mhalearn.options.write_study_options() after a study's fields change)."""
    assert options() == json.loads(json.dumps(study_options()))


@pytest.mark.slow
def test_each_study_brings_its_precision_unless_told(tmp_path):
    tiny = ["run", "recovery", "--learner", "uniform", "--samples", "20", "--heads", "1",
            "--dim", "3", "--tokens", "2", "--instances", "2", "--quiet"]  # fmt: skip
    out = mhalearn(*tiny, "--out", str(tmp_path / "a"))
    assert out.returncode == 0, out.stderr
    assert load(tmp_path / "a" / "recovery" / "results.nc").attrs["precision"] == "float64"
    out = mhalearn(*tiny, "--precision", "float32", "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    assert load(tmp_path / "b" / "recovery" / "results.nc").attrs["precision"] == "float32"


def test_teachers_that_failed_their_checks_are_reported():
    ds = xr.Dataset({"teacher_accepted": ("instance", np.array([1.0, 0.0, np.nan, 0.0]))})
    (line,) = cli.actions._teacher_report(ds)
    assert "2 of 3 instances used a teacher that failed" in line
    assert (
        cli.actions._teacher_report(xr.Dataset({"teacher_accepted": ("instance", np.ones(3))}))
        == []
    )


# ---- interrupts ------------------------------------------------------------------------------

INTERRUPTED = ["run", "regimes", "--beta", "1", "4", "--heads", "1", "2", "--inputs", "boolean",
               "--samples", "16", "--instances", "2", "--quiet"]  # fmt: skip


def _start(out):
    """The command started, returned once it has taken over SIGTERM (its handlers are in
    place: from then on a signal must end it cleanly), with that moment."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mhalearn", *INTERRUPTED, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return proc, time.monotonic()
        time.sleep(0.005)
    raise AssertionError("the command never took over SIGTERM")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_and_sigterm_end_cleanly_in_every_phase_and_resume(tmp_path):
    proc, ready = _start(tmp_path / "whole")
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    length = time.monotonic() - ready  # compiling, running and saving, both cells
    reference = load(tmp_path / "whole" / "regimes")

    def trial(number: int, fraction: float) -> str:
        sig = signal.SIGINT if number % 2 == 0 else signal.SIGTERM
        out = tmp_path / f"trial{number}"
        proc, ready = _start(out)
        time.sleep(max(0.0, ready + fraction * length - time.monotonic()))
        if proc.poll() is None:
            proc.send_signal(sig)
        code = proc.wait(timeout=300)
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "Segmentation" not in stderr, stderr
        assert "Exception ignored" not in stderr, stderr
        if code == 0:  # it had finished: the signal came too late
            outcome = "finished first"
        else:
            outcome = "interrupted"
            assert code == 128 + sig, (number, code, stderr)
            lines = stderr.strip().splitlines()
            assert len(lines) == 1, stderr
            assert lines[0] == (
                f"mhalearn: {sig.name}: interrupted; finished cells are kept; run the same "
                "command to resume"
            )
        for cell in (out / "regimes" / "cells").glob("*.nc"):
            load(cell)  # every finished cell is whole
        again = mhalearn(*INTERRUPTED, "--out", str(out))
        assert again.returncode == 0, again.stderr
        xr.testing.assert_identical(load(out / "regimes"), reference)
        assert not list((out / "regimes").glob("**/.*.tmp*"))
        return outcome

    fractions = np.linspace(0.0, 0.95, 10)  # from the handlers' installation to the end
    with ThreadPoolExecutor(2) as pool:  # two at a time: they only run slower, never faster
        outcomes = list(pool.map(trial, range(len(fractions)), fractions))
    counts = {k: outcomes.count(k) for k in ("interrupted", "finished first")}
    print(f"interrupt trials: {counts}")
    assert counts["interrupted"] >= 8, counts


@pytest.mark.slow
def test_run_through_local_jobs_detached_then_status_merges(tmp_path):
    # the cells as jobs (local processes): detached, the command returns once they are queued;
    # `mhalearn status` reports, and merges once every cell is stored; the results equal a run
    # in one process
    out = mhalearn(*TINY_RUN, "--out", str(tmp_path / "jobs"), "--executor", "local", "--detach")
    assert out.returncode == 0, out.stderr
    assert "jobs queued" in out.stdout and "submitted" in out.stderr
    folder = tmp_path / "jobs" / "regimes"
    for _ in range(300):
        report = mhalearn("status", str(folder))
        assert report.returncode == 0, report.stderr
        if "merged:" in report.stdout:
            break
        time.sleep(1)
    assert "2 of 2 cells stored" in report.stdout and (folder / "figure.png").is_file()
    plain = mhalearn(*TINY_RUN, "--out", str(tmp_path / "plain"), "--quiet")
    assert plain.returncode == 0, plain.stderr
    xr.testing.assert_identical(load(folder), load(tmp_path / "plain" / "regimes"))
    bad = mhalearn("status", str(tmp_path))
    assert bad.returncode == 2 and "not a study's run folder" in bad.stderr
