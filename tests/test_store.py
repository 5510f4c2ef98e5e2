"""Results on disk: atomic cells, resume after interruption (SIGKILL included), refusals."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from mhalearn.experiments import Regimes, run_study
from mhalearn.store import Store, load

#: six cells of a few seconds each, so that a run can be killed between cells
STUDY = Regimes(
    beta=(1.0, 4.0), heads=(1, 2, 3), inputs=("boolean", "gaussian"), samples=16, instances=3
)
ARGS = ["run", "regimes", "--beta", "1", "4", "--heads", "1", "2", "3", "--samples", "16",
        "--instances", "3", "--precision", "float64", "--quiet"]  # fmt: skip


def cli(*args):
    return [sys.executable, "-m", "mhalearn", *args]


def test_resume_computes_only_missing_cells_and_ends_identical(tmp_path, monkeypatch):
    store = Store(tmp_path, STUDY.config())
    run_study(STUDY, store)
    whole = load(store.results_path)
    missing = sorted(store.cells.glob("*.nc"))[2]
    missing.unlink()
    store.results_path.unlink()
    ran = []
    original = Regimes.run_cell
    monkeypatch.setattr(Regimes, "run_cell", lambda s, c, *a: ran.append(c) or original(s, c, *a))
    again = run_study(STUDY, Store(tmp_path, STUDY.config()))
    assert len(ran) == 1 and missing.exists()
    xr.testing.assert_identical(again, whole)
    xr.testing.assert_identical(load(store.results_path), whole)


def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_dataset(tmp_path):
    whole = tmp_path / "whole"
    subprocess.run(cli(*ARGS, "--out", str(whole)), check=True, timeout=600)
    reference = load(whole / "regimes" / "results.nc")

    killed = tmp_path / "killed"
    proc = subprocess.Popen(cli(*ARGS, "--out", str(killed)))
    cells = killed / "regimes" / "cells"
    deadline = time.monotonic() + 300
    while not (cells.exists() and any(cells.glob("*.nc"))) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(cells.glob("*.nc")))
    assert 1 <= done < 6, "the kill must land mid-run"
    assert not (killed / "regimes" / "results.nc").exists()

    subprocess.run(cli(*ARGS, "--out", str(killed)), check=True, timeout=600)
    xr.testing.assert_identical(load(killed / "regimes" / "results.nc"), reference)
    assert not list((killed / "regimes").glob("**/.*.tmp*"))


def test_other_config_is_refused_and_overwrite_replaces(tmp_path):
    first = Store(tmp_path, STUDY.config())
    ds = xr.Dataset({"x": ("instance", np.arange(3.0))})
    first.write_cell("cell", ds)
    first.write_results(ds)
    first.figure_path.write_bytes(b"png")
    other = Regimes(instances=4)
    with pytest.raises(ValueError, match="different config; pass --overwrite"):
        Store(tmp_path, other.config())
    assert first.has("cell")  # a refusal touches nothing
    store = Store(tmp_path, other.config(), overwrite=True)
    assert not list(store.cells.iterdir())
    assert not store.results_path.exists() and not store.figure_path.exists()
    Store(tmp_path, other.config())  # the same config again is welcome


def test_foreign_folder_is_refused_and_missing_file_reported(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not empty and holds no config\.json"):
        Store(tmp_path, STUDY.config())
    with pytest.raises(ValueError, match="no results file"):
        load(tmp_path / "missing.nc")


def test_stale_temporary_files_are_removed(tmp_path):
    store = Store(tmp_path, STUDY.config())
    stale = store.cells / ".cell.nc.tmp123"
    stale.write_bytes(b"half a file")
    Store(tmp_path, STUDY.config())
    assert not stale.exists()


def test_no_pickle_in_results(tmp_path):
    store = Store(tmp_path, STUDY.config())
    ds = run_study(
        Regimes(beta=(2.0,), heads=(1,), inputs=("boolean",), samples=8, instances=2), None
    )
    store.write_cell("x", ds)
    back = store.read_cell("x")
    for name in ds.data_vars:  # what was written comes back
        np.testing.assert_array_equal(back[name].values, ds[name].values)
    assert back.attrs == ds.attrs
    with open(store.cells / "x.nc", "rb") as f:
        assert f.read(8) == b"\x89HDF\r\n\x1a\n"  # netCDF-4 (HDF5), not a pickle
