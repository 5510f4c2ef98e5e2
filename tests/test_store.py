"""Results on disk: atomic cells, resume after interruption (SIGKILL included), refusals that
touch nothing, growing grids, and Datasets of every dtype written and read back unchanged."""

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import xarray as xr

from mhalearn.experiments import Regimes, run_study
from mhalearn.experiments.base import merge_cells
from mhalearn.store import Store, load, writable_folder

#: six cells of a few seconds each, so that a run can be killed between cells
STUDY = Regimes(
    beta=(1.0, 4.0), heads=(1, 2, 3), inputs=("boolean", "gaussian"), samples=16, instances=3
)
ARGS = ["run", "regimes", "--beta", "1", "4", "--heads", "1", "2", "3", "--samples", "16",
        "--instances", "3", "--precision", "float64", "--quiet"]  # fmt: skip


def cli(*args):
    return [sys.executable, "-m", "mhalearn", *args]


def snapshot(folder):
    """Every path under ``folder`` with its bytes (None for folders)."""
    return {
        p.relative_to(folder): (None if p.is_dir() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.slow
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


@pytest.mark.slow
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


def fill(store):
    """A finished-looking folder: a cell, results, a figure and a stray file."""
    ds = xr.Dataset({"x": ("instance", np.arange(3.0))})
    store.write_cell("cell", ds)
    store.write_results(ds)
    store.figure_path.write_bytes(b"png")
    (store.folder / "notes.txt").write_text("left by the old run")


def test_other_config_is_refused_naming_the_fields_and_touching_nothing(tmp_path):
    fill(Store(tmp_path, STUDY.config()))
    before = snapshot(tmp_path)
    other = Regimes(beta=(1.0, 4.0), heads=(1, 2, 3), samples=32, instances=3)
    with pytest.raises(ValueError, match=r"different config \(samples is 16 there, 32 here\)"):
        Store(tmp_path, other.config(), grid=other.static_axes)
    assert snapshot(tmp_path) == before


def test_overwrite_checks_first_and_then_removes_everything_of_the_old_run(tmp_path):
    fill(Store(tmp_path, STUDY.config()))
    before = snapshot(tmp_path)
    other = Regimes(beta=(2.0,), heads=(1,), inputs=("boolean",), samples=8, instances=2)
    store = Store(tmp_path, other.config(), overwrite=True)
    assert snapshot(tmp_path) == before  # constructing only checks
    assert not store.has("cell")  # overwriting: nothing old counts as done
    run_study(other, store)
    left = {p.name for p in tmp_path.iterdir()}
    # the stray notes are gone (.lock: where writers of the folder take turns)
    assert left == {".lock", "config.json", "cells", "results.nc"}
    assert [p.name for p in store.cells.iterdir()] == ["inputs-boolean_heads-1_tokens-4.nc"]
    Store(tmp_path, other.config())  # the same config again is welcome


def test_unwritable_or_file_outputs_are_refused_before_anything_is_made(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"out: .*afile is a file, not a folder"):
        Store(afile, STUDY.config())
    with pytest.raises(ValueError, match=r"out: .*lies inside .*afile, which is a file"):
        Store(afile / "sub", STUDY.config())
    with pytest.raises(ValueError, match="compilation-cache: cannot write to /proc/forbidden"):
        writable_folder("compilation-cache", "/proc/forbidden")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    deep = tmp_path / "a" / "b"
    Store(deep, STUDY.config())
    assert not (tmp_path / "a").exists()  # checked, not created


def test_foreign_folder_is_refused_and_missing_file_reported(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not empty and holds no config\.json"):
        Store(tmp_path, STUDY.config())
    with pytest.raises(ValueError, match="no results file"):
        load(tmp_path / "missing.nc")
    with pytest.raises(ValueError, match=r"is a folder without a results\.nc"):
        load(tmp_path)
    (tmp_path / "bad.nc").write_text("not netCDF")
    with pytest.raises(ValueError, match=r"bad\.nc is not a readable netCDF results file"):
        load(tmp_path / "bad.nc")


def test_stale_temporary_files_are_removed_when_the_store_opens(tmp_path):
    import socket

    store = Store(tmp_path, STUDY.config())
    store.open()
    killed = subprocess.Popen(["true"])  # a writer that has ended
    killed.wait()
    stale = store.cells / f".cell.nc.tmp-{socket.gethostname()}-{killed.pid}"
    stale.write_bytes(b"half a file")
    again = Store(tmp_path, STUDY.config())
    assert stale.exists()  # checking touches nothing
    again.open()
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


DTYPES = (np.bool_, np.int8, np.int32, np.int64, np.float32, np.float64)


class _TwoCells(Regimes):
    """A study whose cells are the two learners below (only ``static_axes`` matter here)."""

    static_axes = ("learner",)


def test_every_dtype_survives_merging_writing_and_reading_with_missing_cells(tmp_path):
    rng = np.random.default_rng(0)

    def cell(with_all):
        data = {}
        for dt in DTYPES:
            values = rng.integers(-3, 4, size=3)
            data[f"v_{np.dtype(dt).name}"] = ("instance", values.astype(dt))
            if with_all:  # only this learner has them, as a learner's own diagnostics
                data[f"own_{np.dtype(dt).name}"] = ("instance", values.astype(dt))
        return xr.Dataset(data, coords={"instance": np.arange(3)})

    cells = [{"learner": "a"}, {"learner": "b"}]
    datasets = [cell(True), cell(False)]
    merged = merge_cells(_TwoCells(), cells, datasets)
    store = Store(tmp_path, {"study": "two"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no SerializationWarning, no cast of NaN
        store.write_results(merged)
        back = load(store.results_path)
    for dt in DTYPES:
        name = np.dtype(dt).name
        full = back[f"v_{name}"]
        assert full.dtype == np.dtype(dt)  # complete: the dtype is kept
        for j in range(2):
            np.testing.assert_array_equal(full.values[j], datasets[j][f"v_{name}"].values)
        own = back[f"own_{name}"]
        assert np.all(np.isnan(own.sel(learner="b").values))  # missing reads back as missing
        np.testing.assert_array_equal(
            own.sel(learner="a").values, datasets[0][f"own_{name}"].values.astype(float)
        )


@pytest.mark.slow
def test_growing_a_grid_computes_only_the_new_cells_and_equals_a_fresh_run(tmp_path, monkeypatch):
    small = Regimes(beta=(1.0, 4.0), heads=(1, 2), inputs=("boolean",), samples=8, instances=2)
    large = Regimes(beta=(1.0, 4.0), heads=(1, 2, 3), inputs=("boolean",), samples=8, instances=2)
    run_study(small, Store(tmp_path / "grown", small.config(), grid=small.static_axes))
    ran = []
    original = Regimes.run_cell
    monkeypatch.setattr(Regimes, "run_cell", lambda s, c, *a: ran.append(c) or original(s, c, *a))
    grown = run_study(large, Store(tmp_path / "grown", large.config(), grid=large.static_axes))
    assert ran == [{"inputs": "boolean", "heads": 3, "tokens": 4}]
    fresh = run_study(large, Store(tmp_path / "fresh", large.config()))
    xr.testing.assert_identical(grown, fresh)
    xr.testing.assert_identical(load(tmp_path / "grown" / "results.nc"), fresh)
    # a change off the grid is refused, naming the field
    other = Regimes(beta=(1.0, 4.0), heads=(1, 2, 3), inputs=("boolean",), samples=8, dim=6)
    with pytest.raises(ValueError, match="dim is 8 there, 6 here"):
        Store(tmp_path / "grown", other.config(), grid=other.static_axes)


@pytest.mark.slow
def test_a_run_logged_to_a_file_says_what_is_left_and_each_cell_it_finishes(tmp_path, capsys):
    """stderr not a terminal (as under pytest, or a run in the background): plain lines."""
    small = Regimes(beta=(1.0,), heads=(1,), inputs=("boolean",), samples=8, instances=2)
    large = Regimes(beta=(1.0,), heads=(1, 2, 3), inputs=("boolean",), samples=8, instances=2)
    run_study(small, Store(tmp_path, small.config(), grid=small.static_axes))
    capsys.readouterr()
    run_study(large, Store(tmp_path, large.config(), grid=large.static_axes), quiet=False)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "regimes: 2 of 3 cells to run (1 already stored)"
    names = [line.split()[1] for line in lines[1:]]
    assert names == ["inputs-boolean_heads-2_tokens-4", "inputs-boolean_heads-3_tokens-4"]
    assert lines[-1].endswith("so far)") and "(3/3 cells, " in lines[-1]


def test_opening_removes_only_temporary_files_of_ended_processes(tmp_path):
    # a job writing beside this one keeps its temporary file; one a killed run of this host
    # left is removed; one of another host is left alone (its process may be alive there)
    import socket

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    store = Store(tmp_path / "run", STUDY.config())
    cells = tmp_path / "run" / "cells"
    cells.mkdir(parents=True)
    names = {
        "writing": f".a.nc.tmp-{host}-{os.getpid()}",
        "killed": f".b.nc.tmp-{host}-{dead.pid}",
        "elsewhere": f".c.nc.tmp-another-host-{dead.pid}",
    }
    for name in names.values():
        (cells / name).write_text("partial")
    store.open()
    assert {p.name for p in cells.iterdir()} == {names["writing"], names["elsewhere"]}
