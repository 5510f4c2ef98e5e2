"""The command runs in a subprocess: this also exercises the default precision (x64 off)."""

import json
import os
import subprocess
import sys

import pytest

from mhalearn.experiments import STUDIES
from mhalearn.store import load

TINY_RUN = ["run", "regimes", "--beta", "1", "4", "--heads", "1", "2", "--inputs", "boolean",
            "--samples", "16", "--instances", "2"]  # fmt: skip


def mhalearn(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    return subprocess.run(
        [sys.executable, "-m", "mhalearn", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )


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


def test_quiet_float64_and_plot(tmp_path):
    out = mhalearn(*TINY_RUN, "--out", str(tmp_path), "--precision", "float64", "--quiet")
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    results = tmp_path / "regimes" / "results.nc"
    assert load(results).attrs["precision"] == "float64"
    drawn = mhalearn("plot", str(results), "--figure", str(tmp_path / "again.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"


def test_a_different_config_in_the_same_folder_is_refused(tmp_path):
    assert mhalearn(*TINY_RUN, "--out", str(tmp_path), "--quiet").returncode == 0
    out = mhalearn(*TINY_RUN, "--instances", "3", "--out", str(tmp_path), "--quiet")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "different config; pass --overwrite" in out.stderr
    replaced = mhalearn(*TINY_RUN, "--instances", "3", "--out", str(tmp_path), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert load(tmp_path / "regimes" / "results.nc").sizes["instance"] == 3


def test_list_names_every_study_with_its_parameters():
    out = mhalearn("list")
    assert out.returncode == 0
    for name, cls in STUDIES.items():
        assert f"{name}" in out.stdout and cls.summary in out.stdout
    assert "recovery (default)" in out.stdout and "--instances 8" in out.stdout


def test_bench_refuses_unknown_names():
    out = mhalearn("bench", "nonsense")
    assert out.returncode == 2 and "unknown benchmark 'nonsense'" in out.stderr


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["run", "regimes", "--heads", "0"], "heads must be an integer >= 1, received 0"),
        (["run", "recovery", "--instances", "0"], "instances must be an integer >= 1"),
        (["run", "regimes", "--delta", "0.9"], "delta must lie in"),
        (["run", "recovery", "--family", "two_tokens"], "needs tokens == 2"),
        (["run", "recovery", "--learner", "magic"], "invalid choice 'magic'"),
        (["run", "nonsense"], "Unrecognized options: nonsense"),
        (["run", "regimes", "--heads", "many"], "'many'"),
        (["run", "--bogus"], "Unrecognized options: --bogus"),
        (["plot", "nowhere.nc"], "no results file at nowhere.nc"),
        (["run", "regimes", "--cpu-devices", "0"], "cpu_devices must be an integer >= 1"),
        (["run", "regimes", "--chunk-size", "0"], "chunk_size must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, fragment):
    out = mhalearn(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhalearn: error: "), out.stderr
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_each_study_brings_its_precision_unless_told(tmp_path):
    tiny = ["run", "recovery", "--learner", "uniform", "--samples", "20", "--heads", "1",
            "--dim", "3", "--tokens", "2", "--instances", "2", "--quiet"]  # fmt: skip
    out = mhalearn(*tiny, "--out", str(tmp_path / "a"))
    assert out.returncode == 0, out.stderr
    assert load(tmp_path / "a" / "recovery" / "results.nc").attrs["precision"] == "float64"
    out = mhalearn(*tiny, "--precision", "float32", "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    assert load(tmp_path / "b" / "recovery" / "results.nc").attrs["precision"] == "float32"
