"""A study's cells as jobs: on a SLURM cluster, or as processes of this machine, through submitit.

The run folder is the meeting point. The submitting process writes ``config.json`` and a
ledger of its jobs (``jobs.json``: each job's id, its cells and its log), under a lock
(``.lock``, ``fcntl``) that every writer of the folder takes; each job computes its cells that
the folder lacks and writes each one atomically (:class:`~mhalearn.store.Store`), so a job
cancelled, preempted or failed loses at most the cell it was computing, and a job that SLURM
requeues skips what it wrote before. A submitter submits only the cells that are neither stored
nor claimed by a job still alive, so two submitters on one folder compute each cell once; when
every cell is stored, the results are merged under the lock. Waiting, it shows cells as they
arrive; ``detach`` returns once the jobs are queued, and the same call again (or ``mhalearn
status FOLDER``) reports, resubmits what was lost, and merges.

Whether a job is alive is asked of ``squeue`` (SLURM) or of the process (local): neither
needs SLURM's accounting database. A job that is gone with cells missing failed; its log
path is reported, with the last line of the error where the job recorded one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from mhalearn._validate import choice, positive_int
from mhalearn.store import _atomic_write, folder_lock

#: the ledger of a folder's jobs
LEDGER = "jobs.json"


@dataclasses.dataclass(frozen=True)
class Executor:
    """Where a study's cells run: ``"slurm"`` (a job array through submitit) or ``"local"``
    (the same path, jobs as processes of this machine); ``cells_per_job`` cells per job.
    The ``slurm_*`` fields are the jobs' resources (minutes, CPUs and GPUs per task, memory
    as sbatch takes it, e.g. ``"8G"``); ``slurm_options`` passes other sbatch options on, each
    ``KEY=VALUE`` (``"account=me"``, ``"qos=high"``). ``detach``: return once the jobs are
    queued. ``poll``: seconds between looks at the folder and the queue."""

    kind: Literal["slurm", "local"] = "slurm"
    cells_per_job: int = 1
    slurm_partition: str | None = None
    slurm_time: int = 60
    slurm_cpus: int = 1
    slurm_gpus: int = 0
    slurm_mem: str | None = None
    slurm_options: tuple[str, ...] = ()
    detach: bool = False
    poll: float = 2.0

    def __post_init__(self):
        choice("executor", self.kind, ("slurm", "local"))
        positive_int("cells_per_job", self.cells_per_job)
        positive_int("slurm_time", self.slurm_time)
        positive_int("slurm_cpus", self.slurm_cpus)
        if self.slurm_gpus < 0:
            raise ValueError(f"slurm_gpus must be >= 0, received {self.slurm_gpus}")
        for option in self.slurm_options:
            if "=" not in option:
                raise ValueError(f"slurm_options take KEY=VALUE, received {option!r}")

    def submitit(self, folder: Path):
        """The submitit executor writing its logs under ``folder``."""
        import submitit

        logging.getLogger("submitit").setLevel(logging.ERROR)  # sacct-less clusters warn
        if self.kind == "local":
            ex = submitit.LocalExecutor(folder=folder)
            ex.update_parameters(timeout_min=self.slurm_time)
            return ex
        ex = submitit.SlurmExecutor(folder=folder)
        extra = dict(option.split("=", 1) for option in self.slurm_options)
        ex.update_parameters(
            time=self.slurm_time,
            cpus_per_task=self.slurm_cpus,
            **({"partition": self.slurm_partition} if self.slurm_partition else {}),
            **({"gpus_per_node": self.slurm_gpus} if self.slurm_gpus else {}),
            **({"mem": self.slurm_mem} if self.slurm_mem else {}),
            **({"additional_parameters": extra} if extra else {}),
        )
        return ex


def run_cells(study_name: str, config: dict, folder: str, names: list[str], engine: dict) -> int:
    """A job's work: the cells ``names`` of the study ``config`` that ``folder`` lacks, each
    written as it finishes. Returns how many it computed."""
    import jax

    from mhalearn.batch import Engine, set_precision
    from mhalearn.experiments.base import STUDIES, cell_id
    from mhalearn.store import Store

    set_precision(config["precision"])
    study = STUDIES[study_name].from_config(config)
    store = Store(folder, config, grid=study.static_axes)
    key = jax.random.key(study.seed)
    done = 0
    for cell in study.cells():
        name = cell_id(cell)
        if name in names and not store.has(name):
            store.write_cell(name, study.run_cell(cell, key, Engine(**engine)))
            done += 1
    return done


def _read_ledger(folder: Path) -> list[dict]:
    path = folder / LEDGER
    return json.loads(path.read_text()) if path.is_file() else []


def _write_ledger(folder: Path, jobs: list[dict]) -> None:
    text = json.dumps(jobs, indent=1)
    _atomic_write(folder / LEDGER, lambda tmp: tmp.write_text(text))


def _queued() -> set[str]:
    """The ids of SLURM jobs pending or running (array tasks as ``JOB_TASK``)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as err:
        why = getattr(err, "stderr", None) or err
        raise RuntimeError(
            f"squeue does not answer ({str(why).strip()}): the jobs' state is unknown; "
            "run the same command again once the scheduler answers"
        ) from None
    return set(out.stdout.split())


def _alive(job: dict) -> bool:
    if job["kind"] == "local":
        try:
            os.kill(int(job["pid"]), 0)
        except (OSError, ValueError):
            return False
        return not Path(job["result"]).exists()
    return job["id"] in _queued()


def _why(job: dict) -> str:
    """What a finished job left: its error's last line, where it recorded one."""
    result = Path(job["result"])
    if result.exists():
        import pickle  # submitit's own result file (the package's results are never pickled)

        try:
            outcome, value = pickle.loads(result.read_bytes())
        except Exception:  # an unreadable result says nothing more than its absence
            return "ended"
        if outcome == "error":
            lines = [line for line in str(value).strip().splitlines() if line.strip()]
            return lines[-1] if lines else "failed"
        return "ended"
    return "cancelled, preempted or killed"


@dataclasses.dataclass
class Report:
    """Where a run through an executor stands."""

    total: int
    stored: int
    running: list[dict]
    failed: list[dict]
    submitted: list[dict]

    def lines(self) -> list[str]:
        out = [f"{self.stored} of {self.total} cells stored; {len(self.running)} jobs alive"]
        if self.submitted:
            ids = ", ".join(j["id"] for j in self.submitted)
            out.append(f"submitted {len(self.submitted)} jobs: {ids}")
        return out + [failure(job) for job in self.failed]


def failure(job: dict) -> str:
    """One line on a job that ended with cells missing: its cells, why, its log."""
    return f"job {job['id']} ({', '.join(job['missing'])}): {job['why']}; log {job['log']}"


def _look(study, store, executor: Executor | None, engine: dict) -> Report:
    """Under the folder's lock: which cells are stored, which jobs are alive, which ended with
    cells missing; with ``executor``, the cells neither stored nor claimed submitted."""
    from mhalearn.experiments.base import cell_id

    folder = store.folder
    names = [cell_id(c) for c in study.cells()]
    with folder_lock(folder):
        store.open()
        jobs = _read_ledger(folder)
        stored = {n for n in names if store.has(n)}
        running, failed, kept = [], [], []
        for job in jobs:
            missing = [n for n in job["cells"] if n not in stored]
            if not missing:
                continue  # done: forgotten
            if _alive(job):
                running.append(job)
            else:
                failed.append({**job, "missing": missing, "why": _why(job)})
                continue  # its cells are free again
            kept.append(job)
        claimed = {n for job in running for n in job["cells"]}
        pending = [n for n in names if n not in stored and n not in claimed]
        submitted = []
        if executor is not None and pending:
            submitted = _submit(study, store, executor, engine, pending)
            running += submitted
        _write_ledger(folder, kept + submitted)
    return Report(len(names), len(stored), running, failed, submitted)


def _submit(study, store, executor: Executor, engine: dict, pending: list[str]) -> list[dict]:
    import jax

    size = executor.cells_per_job
    if executor.kind == "local":  # every local job is a process at once: one per core at most
        size = max(size, -(-len(pending) // (os.cpu_count() or 1)))
    groups = [pending[i : i + size] for i in range(0, len(pending), size)]
    config = {**study.config(), **store.config}
    config.setdefault("precision", "float64" if jax.config.jax_enable_x64 else "float32")
    ex = executor.submitit(store.folder / "jobs")
    jobs = ex.map_array(
        run_cells,
        [study.name] * len(groups),
        [config] * len(groups),
        [str(store.folder)] * len(groups),
        groups,
        [engine] * len(groups),
    )
    return [
        {
            "id": str(job.job_id),
            "kind": executor.kind,
            "pid": str(job.job_id) if executor.kind == "local" else None,  # a process id
            "cells": group,
            "log": str(job.paths.stderr),
            "result": str(job.paths.result_pickle),
        }
        for job, group in zip(jobs, groups, strict=True)
    ]


def run_on(study, store, executor: Executor, engine: dict, quiet: bool = True) -> bool:
    """Submit ``study``'s missing cells as jobs and, unless ``executor.detach``, wait for them,
    showing cells as they arrive. Returns whether every cell is stored.

    Raises:
        RuntimeError: jobs ended with cells missing (their logs named); a rerun resubmits them.
    """

    def say(text: str) -> None:
        if not quiet:
            print(f"{study.name}: {text}", file=sys.stderr, flush=True)

    report = _look(study, store, executor, engine)
    for line in report.lines():
        say(line)
    # jobs that failed before this call were reported above and their cells submitted anew
    failed: list[dict] = []
    seen = report.stored
    while not executor.detach and report.running:
        time.sleep(executor.poll)
        report = _look(study, store, None, engine)
        failed += report.failed
        for job in report.failed:
            say(failure(job))
        if report.stored != seen:
            seen = report.stored
            say(f"{seen} of {report.total} cells stored")
    if failed or (not executor.detach and report.stored < report.total):
        raise RuntimeError(
            f"{study.name}: {report.total - report.stored} of {report.total} cells missing; "
            + "".join(f"{failure(job)}; " for job in failed)
            + "run the same command again to submit them anew"
        )
    return report.stored == report.total


def status(study, store) -> Report:
    """Where a run through an executor stands (no submission)."""
    return _look(study, store, None, {})
