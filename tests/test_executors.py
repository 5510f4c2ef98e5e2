"""A study's cells as jobs: through submitit's local executor, and through a real SLURM on this
machine (``bash ci/slurm.sh up``; CI starts it and sets MHALEARN_REQUIRE_SLURM=1, so that
there these tests run rather than skip)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xarray as xr

from mhalearn.batch import set_precision
from mhalearn.experiments import Executor, MaxMargin, run_study
from mhalearn.experiments.executors import status
from mhalearn.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _slurm_answers() -> str | None:
    """None when a SLURM controller answers with a usable node, else why not."""
    if shutil.which("sinfo") is None:
        return "no SLURM client (bash ci/slurm.sh up installs and starts one)"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()} (bash ci/slurm.sh up starts SLURM)"
    if not any(s in out.stdout for s in ("idle", "mixed", "allocated")):
        return f"no usable SLURM node (sinfo: {out.stdout.strip()!r})"
    return None


@pytest.fixture(scope="module")
def slurm():
    why = _slurm_answers()
    if why is not None:
        if os.environ.get("MHALEARN_REQUIRE_SLURM"):
            pytest.fail(f"SLURM is required here: {why}")
        pytest.skip(why)


def _study():
    """Four cells of a few seconds each."""
    return MaxMargin.preset("tiny")


@pytest.fixture(scope="module")
def in_process():
    """The four cells run in this process: what every executor must reproduce, bit for bit."""
    study = _study()
    set_precision(study.precision)
    return run_study(study)


def _store(folder: Path, study, overwrite=False) -> Store:
    config = {**study.config(), "precision": study.precision}
    return Store(folder, config, overwrite, grid=study.static_axes)


def test_executor_options_are_checked():
    with pytest.raises(ValueError, match="executor"):
        Executor(kind="pbs")
    with pytest.raises(ValueError, match="cells_per_job"):
        Executor(cells_per_job=0)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        Executor(slurm_options=("account",))
    with pytest.raises(ValueError, match="needs a store"):
        run_study(_study(), None, executor=Executor(kind="local"))


@pytest.mark.slow
def test_local_jobs_equal_the_in_process_run_and_failures_name_their_log(tmp_path, in_process):
    study = _study()
    ds = run_study(study, _store(tmp_path / "ok", study), executor=Executor(kind="local", poll=0.5))
    xr.testing.assert_identical(ds, in_process)
    # a job that fails (its engine asks for more devices than there are) is reported with its
    # log and the error's last line, and nothing is merged
    from mhalearn.batch import Engine

    bad = tmp_path / "bad"
    with pytest.raises(RuntimeError, match=r"4 of 4 cells missing.*ValueError.*log .*_log\.err"):
        run_study(
            study, _store(bad, study), Engine(devices=64), executor=Executor("local", poll=0.5)
        )
    assert not (bad / "results.nc").exists()


@pytest.mark.slow
def test_slurm_jobs_equal_the_in_process_run(slurm, tmp_path, in_process):
    study = _study()
    store = _store(tmp_path / "run", study)
    executor = Executor(kind="slurm", cells_per_job=2, slurm_time=10, poll=1)
    ds = run_study(study, store, executor=executor)
    xr.testing.assert_identical(ds, in_process)
    assert len(list((tmp_path / "run" / "jobs").glob("*_submitted.pkl"))) == 2  # 2 array tasks
    assert status(study, _store(tmp_path / "run", study)).stored == 4


def _queued(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True)
    states = dict(line.split() for line in out.stdout.splitlines())
    return states.get(job, "")


@pytest.mark.slow
def test_a_job_cancelled_mid_cell_is_completed_by_a_rerun(slurm, tmp_path, in_process):
    study = _study()
    folder = tmp_path / "run"
    detached = Executor(kind="slurm", cells_per_job=4, slurm_time=10, detach=True, poll=1)
    assert not run_study(study, _store(folder, study), executor=detached)
    (job,) = json.loads((folder / "jobs.json").read_text())
    log = Path(job["log"]).with_suffix(".out")
    deadline = time.monotonic() + 300
    while not (log.exists() and "Loading pickle" in log.read_text()):  # its first cell began
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.5)
    subprocess.run(["scancel", job["id"]], check=True)
    while _queued(job["id"]):
        assert time.monotonic() < deadline, "the job was not cancelled"
        time.sleep(0.5)
    report = status(study, _store(folder, study))
    assert report.stored < 4 and not report.running
    (lost,) = report.failed
    assert lost["why"] == "cancelled, preempted or killed" and lost["log"] == job["log"]
    # the same call again submits only the missing cells and completes the run
    again = Executor(kind="slurm", cells_per_job=4, slurm_time=10, poll=1)
    ds = run_study(study, _store(folder, study), executor=again)
    xr.testing.assert_identical(ds, in_process)


@pytest.mark.slow
def test_two_concurrent_submitters_leave_one_consistent_dataset(slurm, tmp_path, in_process):
    folder = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        from mhalearn.batch import set_precision
        from mhalearn.experiments import Executor, MaxMargin, run_study
        from mhalearn.store import Store
        study = MaxMargin.preset("tiny")
        set_precision(study.precision)
        config = {{**study.config(), "precision": study.precision}}
        store = Store({str(folder)!r}, config, grid=study.static_axes)
        run_study(study, store, executor=Executor(kind="slurm", slurm_time=10, poll=1))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    # each cell computed once: the second submitter found the first one's jobs alive
    assert len(list((folder / "jobs").glob("*_submitted.pkl"))) == 4
    xr.testing.assert_identical(xr.load_dataset(folder / "results.nc"), in_process)


@pytest.mark.slow
def test_the_multi_gpu_example_is_a_valid_batch_script(slurm):
    # the example asks for GPUs, two hosts and 8 CPUs each; here SLURM is asked whether it
    # would schedule the same script on this machine's one node, without GPUs, on one CPU
    # (options given on the command line override the script's)
    example = ROOT / "examples" / "slurm_distributed.sbatch"
    here = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1"]
    out = subprocess.run(
        ["sbatch", "--test-only", *here, str(example)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "to start at" in out.stderr


@pytest.mark.slow
def test_a_requeued_job_skips_the_cells_it_wrote(slurm, tmp_path, in_process):
    # preemption as SLURM does it: the job is stopped (SIGTERM) and queued again; started
    # anew, it computes only the cells it had not written, and the waiting command merges
    study = _study()
    folder = tmp_path / "run"
    detached = Executor(kind="slurm", cells_per_job=4, slurm_time=10, detach=True, poll=1)
    assert not run_study(study, _store(folder, study), executor=detached)
    (job,) = json.loads((folder / "jobs.json").read_text())
    deadline = time.monotonic() + 300
    while not list((folder / "cells").glob("*.nc")):  # a first cell written
        assert time.monotonic() < deadline, "no cell was written"
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", job["id"]], check=True)
    # SLURM holds a requeued job back a while (its begin time): let it start at once
    while _queued(job["id"]) != "PENDING":
        assert time.monotonic() < deadline, "the job was not requeued"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"jobid={job['id']}", "starttime=now"], check=True)
    first = {p.name: p.stat().st_mtime_ns for p in (folder / "cells").glob("*.nc")}
    again = Executor(kind="slurm", cells_per_job=4, slurm_time=10, poll=1)
    ds = run_study(study, _store(folder, study), executor=again)
    xr.testing.assert_identical(ds, in_process)
    # the same job finished the run: nothing was submitted anew
    assert len(list((folder / "jobs").glob("*_submitted.pkl"))) == 1
    after = {p.name: p.stat().st_mtime_ns for p in (folder / "cells").glob("*.nc")}
    assert all(after[name] == t for name, t in first.items())  # not written twice
    assert Path(job["log"]).with_suffix(".out").read_text().count("Loading pickle") == 2
