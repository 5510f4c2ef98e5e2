"""What each ``mhalearn`` subcommand does: run (resumably, the signals handled), status,
list, plot and bench."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mhalearn._validate import study_fields
from mhalearn.cli.commands import BENCHMARKS, DEFAULT, Bench, List, Plot, Run, Status, _benchmarks
from mhalearn.options import options


def _exit_on_signals(message: str) -> None:
    """End the process at once on SIGINT or SIGTERM: ``message`` on stderr, exit code
    128 + signal. No exception unwinds through JAX's threads (which has crashed the
    interpreter), and it works in any phase: a watcher thread wakes on a byte the C-level
    handler writes, even while the main thread waits in XLA. Every file is written under a
    temporary name and renamed, so stopping anywhere loses at most the cell in progress."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    once = threading.Lock()  # the handler and the watcher may both wake: one speaks and exits

    def leave(signum: int) -> None:
        once.acquire()
        line = f"mhalearn: {signal.Signals(signum).name}: interrupted; {message}\n"
        os.write(2, (("\n" if sys.stderr.isatty() else "") + line).encode())
        os._exit(128 + signum)

    def watch() -> None:
        leave(os.read(read, 1)[0])

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: leave(signum))
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=watch, name="mhalearn-signals", daemon=True).start()


# ---- the commands ----------------------------------------------------------------------------


def build_study(spec: Any):
    """The study of the parsed options ``spec``: the options every study shares are checked
    first, without importing JAX; then the study class checks the rest."""
    entry = options()["studies"][spec.study]
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    study_fields(values, entry["positive"], entry["counts_from_zero"])
    from mhalearn.experiments import STUDIES

    return STUDIES[spec.study](**values)


def run(cfg: Run) -> Path:
    """Validate every option, then run: nothing is written before all of them pass."""
    study = build_study(cfg.study)
    from mhalearn import split_cpu

    if cfg.cpu_devices is not None:
        split_cpu(cfg.cpu_devices)
    from mhalearn import enable_compilation_cache
    from mhalearn.batch import Engine, select_devices, set_precision
    from mhalearn.experiments import run_study
    from mhalearn.experiments.figures import plot
    from mhalearn.store import Store, writable_folder

    progress = not cfg.quiet and sys.stderr.isatty()
    engine = Engine(chunk_size=cfg.chunk_size, devices=cfg.devices, progress=progress)
    select_devices(cfg.devices)
    if cfg.compilation_cache is not None:
        writable_folder("compilation-cache", cfg.compilation_cache)
    precision = study.precision if cfg.precision == "study" else cfg.precision
    config = {**study.config(), "precision": precision}
    store = Store(cfg.out / study.name, config, cfg.overwrite, grid=study.static_axes)

    executor = None
    if cfg.executor != "none":
        from mhalearn.experiments import Executor

        executor = Executor(
            kind=cfg.executor,
            cells_per_job=cfg.cells_per_job,
            slurm_partition=cfg.slurm_partition,
            slurm_time=cfg.slurm_time,
            slurm_cpus=cfg.slurm_cpus,
            slurm_gpus=cfg.slurm_gpus,
            slurm_mem=cfg.slurm_mem,
            slurm_options=cfg.slurm_option,
            detach=cfg.detach,
        )
    set_precision(precision)
    if cfg.compilation_cache is not None:
        enable_compilation_cache(str(cfg.compilation_cache))
    tic = time.perf_counter()
    try:
        ds = run_study(study, store, engine, quiet=cfg.quiet, executor=executor)
    except RuntimeError as err:  # jobs lost cells: said in one line, like a bad option
        raise ValueError(str(err)) from None
    if ds is None:
        print(f"jobs queued; `mhalearn status {store.folder}` or this command again to collect")
        return store.folder
    _use_agg()
    figure = store.write_figure(plot(ds))
    if not cfg.quiet:
        print(study.summarize(ds))
        for line in _teacher_report(ds):
            print(line, file=sys.stderr)
        print(f"{store.results_path} and {figure} ({time.perf_counter() - tic:.1f}s)")
    return store.results_path


def status(cfg: Status) -> None:
    """Report on a run folder; merge it (and draw its figure) once every cell is stored."""
    from mhalearn.batch import set_precision
    from mhalearn.experiments import STUDIES
    from mhalearn.experiments.executors import status as look
    from mhalearn.experiments.figures import plot
    from mhalearn.store import Store

    saved = cfg.folder / "config.json"
    if not saved.is_file():
        raise ValueError(f"{cfg.folder} holds no config.json: not a study's run folder")
    config = json.loads(saved.read_text())
    if config.get("study") not in STUDIES:
        raise ValueError(f"{saved} names no known study ({config.get('study')!r})")
    study = STUDIES[config["study"]].from_config(config)
    store = Store(cfg.folder, config, grid=study.static_axes)
    try:
        report = look(study, store)
    except RuntimeError as err:  # the scheduler does not answer: one line, like a bad option
        raise ValueError(str(err)) from None
    for line in report.lines():
        print(line)
    if report.stored == report.total and not store.results_path.is_file():
        from mhalearn.experiments.base import merge_stored

        set_precision(config.get("precision", study.precision))
        ds = merge_stored(study, store)
        _use_agg()
        print(f"merged: {store.results_path} and {store.write_figure(plot(ds))}")


def _teacher_report(ds) -> list[str]:
    """A warning when some teachers failed their non-degeneracy checks."""
    if "teacher_accepted" not in ds:
        return []
    flags = ds["teacher_accepted"].values
    known = flags[flags == flags]  # not NaN
    failed = int((known == 0).sum())
    if not failed:
        return []
    return [
        f"mhalearn: warning: {failed} of {known.size} instances used a teacher that failed its "
        "non-degeneracy checks in max_attempts draws (the last draw was used; see "
        "teacher_accepted)"
    ]


def list_studies(_: List) -> None:
    for name, entry in options()["studies"].items():
        default = " (default)" if name == DEFAULT else ""
        print(f"{name}{default}: {entry['summary']}")
        for f in entry["fields"]:
            value = f["default"]
            value = tuple(value) if f["many"] and value is not None else value
            shown = "(unset)" if value is None else _show(value)
            print(f"    --{f['name'].replace('_', '-')} {shown}")
            print(f"        {f['help']}")
    from mhalearn.learners import LEARNERS, learner_label

    fields = options()["studies"][DEFAULT]["fields"]
    steps = next(f["default"] for f in fields if f["name"] == "steps")
    print("Learners (--learner NAME ..., at the study's --steps where they take steps):")
    for name in LEARNERS:
        print(f"    {learner_label(name, steps)}")


def _show(value) -> str:
    if isinstance(value, tuple):
        return " ".join(_show(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot(cfg: Plot) -> Path:
    from mhalearn import plots
    from mhalearn.experiments.figures import plot as figure_of
    from mhalearn.store import load

    ds = load(cfg.results)
    if cfg.figure is not None:
        figure = cfg.figure
    elif cfg.results.is_dir():
        figure = cfg.results / "figure.png"
    else:
        figure = cfg.results.with_suffix(".png")
    _use_agg()
    fig = figure_of(ds)
    try:
        plots.save(fig, figure)
    except OSError as err:
        raise ValueError(f"--figure: cannot write {figure} ({err.strerror or err})") from None
    print(figure)
    return figure


def bench(cfg: Bench, extra: Sequence[str]) -> int:
    known = _benchmarks()
    if not known:
        raise ValueError(f"no benchmarks folder at {BENCHMARKS}: run from a source checkout")
    if not cfg.names:
        raise ValueError(
            f"name the benchmarks to run, one or more of {', '.join(known)} (e.g. "
            "`mhalearn bench throughput -- --small`; each takes minutes, recovery about 40)"
        )
    for name in cfg.names:
        if name not in known:
            raise ValueError(f"unknown benchmark {name!r}; expected one of {', '.join(known)}")
    for name in cfg.names:
        print(f"== benchmarks/{name}.py {' '.join(extra)}", flush=True)
        code = subprocess.call([sys.executable, str(BENCHMARKS / f"{name}.py"), *extra])
        if code:
            return code
    return 0


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg")
