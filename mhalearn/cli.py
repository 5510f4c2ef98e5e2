"""The ``mhalearn`` command (also ``python -m mhalearn``).

    mhalearn run [STUDY] [--option value ...]   run a study (default: recovery), resumably
    mhalearn list                               the studies, their options and what they mean
    mhalearn plot RESULTS                       the figure of a saved results file
    mhalearn bench NAME [NAME ...] [-- ARGS]    benchmark scripts (source checkout)

A bad argument or an invalid config ends with a one-line message and exit code 2, before
anything is written; SIGINT or SIGTERM ends a run at once with a one-line message and exit code
130 or 143, finished cells kept.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import tyro

from mhalearn._validate import study_fields
from mhalearn.options import options, plain

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmarks() -> dict[str, str]:
    """The benchmark scripts of a source checkout, with the first paragraph of their
    docstrings."""
    if not BENCHMARKS.is_dir():
        return {}
    out = {}
    for path in sorted(BENCHMARKS.glob("*.py")):
        if not path.stem.startswith("_"):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            out[path.stem] = " ".join(doc.split("\n\n")[0].split()).rstrip(".")
    return out


STUDY_NAMES: tuple[str, ...] = tuple(options()["studies"])
DEFAULT: str = options()["default"]
_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _spec(name: str) -> type:
    """Study ``name``'s options as a frozen dataclass for the parser (its fields, types,
    choices, defaults and help, from :data:`OPTIONS`); the study itself is built after."""
    entry = options()["studies"][name]
    fields = []
    for f in entry["fields"]:
        kind = Literal[tuple(f["choices"])] if f["choices"] else _TYPES[f["type"]]
        kind = tuple[kind, ...] if f["many"] else kind
        kind = Optional[kind] if f["optional"] else kind  # noqa: UP045 (built at runtime)
        default = tuple(f["default"]) if f["many"] and f["default"] is not None else f["default"]
        meaning = tyro.conf.arg(help=f["help"])
        if f["optional"]:  # unset by default: its help says what that means
            hint = "(default: unset)"
            meaning = tyro.conf.arg(
                help=f["help"], metavar=f["type"].upper(), help_behavior_hint=hint
            )
        fields.append((f["name"], Annotated[kind, meaning], dataclasses.field(default=default)))
    spec = dataclasses.make_dataclass(f"{name}_options", fields, frozen=True)
    spec.__doc__, spec.study = entry["description"], name
    return spec


SPECS = {name: _spec(name) for name in STUDY_NAMES}


def _description() -> str:
    studies = "; ".join(f"{name}: {e['summary']}" for name, e in options()["studies"].items())
    return (
        "Simulate how multi-head attention layers are learned: many random problems (a "
        "teacher or a data set, its samples, a learner's start) are fitted side by side in one "
        "compiled JAX computation, and what comes out is how well and how fast each learner "
        "recovered its teacher or fitted its data. `mhalearn run STUDY` runs a built-in study "
        "into OUT/STUDY/results.nc (netCDF) and figure.png, resumably; `list` describes the "
        f"studies and their options; `plot` draws a saved file; `bench` runs benchmarks. "
        f"Studies (default {DEFAULT}): {studies}."
    )


def _precision_help() -> str:
    by = {}
    for name, entry in options()["studies"].items():
        by.setdefault(entry["precision"], []).append(name)
    own = "; ".join(f"{p} for {', '.join(names)}" for p, names in sorted(by.items()))
    return f"Floating-point precision; study: the study's own ({own})."


Study = Union[  # noqa: UP007 (built at runtime)
    tuple(
        Annotated[spec, tyro.conf.subcommand(name, default=spec(), description=spec.__doc__)]
        for name, spec in SPECS.items()
    )
]


def _unset(what: str, metavar: str = "INT"):
    """An optional option: its metavar, and ``what`` happens when it is not given."""
    return tyro.conf.arg(metavar=metavar, help_behavior_hint=f"(default: {what})")


@dataclasses.dataclass(frozen=True)
class Run:
    """Run a study: every cell of its grid, saved as it finishes; an interrupted run started
    again computes only the missing cells, and a run with more values on a grid axis (and
    every other option the same) computes only the new cells. Writes OUT/STUDY/results.nc
    and figure.png."""

    study: Study = SPECS[DEFAULT]()  # noqa: RUF009 (frozen, immutable)
    out: Path = Path("results")
    """Results go to OUT/STUDY/."""
    precision: Annotated[
        Literal["study", "float32", "float64"], tyro.conf.arg(help=_precision_help())
    ] = "study"
    chunk_size: Annotated[int | None, _unset("all instances at once")] = None
    """Instances per compiled call (bounds memory); results do not depend on it."""
    devices: Annotated[int | None, _unset("every device")] = None
    """How many devices to spread instances over."""
    cpu_devices: Annotated[int | None, _unset("one device")] = None
    """Split the CPU into this many devices (e.g. one per core), each program compiled once;
    faster for GD runs and for variable projection at N ≥ 1000, slower for variable projection
    at tiny N (docs: Performance)."""
    overwrite: bool = False
    """Replace everything in OUT/STUDY/ (results of another config included)."""
    quiet: bool = False
    """No progress bar and no summary."""
    compilation_cache: Annotated[Path | None, _unset("none", "PATH")] = None
    """Keep compiled programs in this folder (JAX's persistent cache): reruns skip compiling."""
    executor: Literal["none", "local", "slurm"] = "none"
    """Run the missing cells as jobs (docs: Running on a cluster): slurm, a job array
    through submitit; local, the same path with jobs as processes of this machine; none,
    in this process. The jobs meet in OUT/STUDY/; this command waits, showing cells as they
    arrive, and merges (a rerun resubmits lost cells)."""
    cells_per_job: int = 1
    """Cells per job (an executor's)."""
    slurm_partition: Annotated[str | None, _unset("the cluster's default", "NAME")] = None
    """The jobs' partition."""
    slurm_time: int = 60
    """The jobs' time limit, in minutes."""
    slurm_cpus: int = 1
    """CPUs per job."""
    slurm_gpus: int = 0
    """GPUs per job."""
    slurm_mem: Annotated[str | None, _unset("the cluster's default", "SIZE")] = None
    """Memory per job, as sbatch takes it (e.g. 8G)."""
    slurm_option: Annotated[
        tuple[str, ...], tyro.conf.arg(metavar="KEY=VALUE", help_behavior_hint="")
    ] = ()
    """Other sbatch options, passed on (e.g. account=me qos=high)."""
    detach: bool = False
    """Return once the jobs are queued; the same command again (or `mhalearn status OUT/STUDY`)
    reports, resubmits lost cells and merges."""


@dataclasses.dataclass(frozen=True)
class Status:
    """Where a study run through an executor stands: cells stored, jobs alive, jobs that ended
    with cells missing (with their logs); merges the results when every cell is stored."""

    folder: tyro.conf.Positional[Path]
    """A study's run folder (OUT/STUDY)."""


@dataclasses.dataclass(frozen=True)
class List:
    """List the built-in studies, their options, defaults and what each option means."""


@dataclasses.dataclass(frozen=True)
class Plot:
    """Draw the figure of a saved results file."""

    results: tyro.conf.Positional[Path]
    """A results.nc written by `mhalearn run`, or the folder holding it."""
    figure: Annotated[Path | None, _unset("RESULTS with suffix .png", "PATH")] = None
    """Where to write the PNG (figure.png when RESULTS is a folder)."""


@dataclasses.dataclass(frozen=True)
class Bench:
    """Run benchmark scripts from benchmarks/ (a source checkout); arguments after `--` go to
    every script (e.g. `mhalearn bench recovery -- --small`)."""

    names: tyro.conf.Positional[
        Annotated[tuple[str, ...], tyro.conf.arg(metavar="NAME", help_behavior_hint="")]
    ] = ()
    """Scripts to run (one or more of those listed above)."""


def _bench_description() -> str:
    found = _benchmarks()
    listed = "; ".join(f"{k}: {v}" for k, v in found.items()) or "none (not a source checkout)"
    return f"{plain(Bench.__doc__)} Benchmarks: {listed}."


def _commands():
    """The subcommands, built when the command parses (the benchmark list reads files)."""
    return Union[  # noqa: UP007
        Annotated[Run, tyro.conf.subcommand("run", description=plain(Run.__doc__))],
        Annotated[List, tyro.conf.subcommand("list", description=plain(List.__doc__))],
        Annotated[Plot, tyro.conf.subcommand("plot", description=plain(Plot.__doc__))],
        Annotated[Status, tyro.conf.subcommand("status", description=plain(Status.__doc__))],
        Annotated[Bench, tyro.conf.subcommand("bench", description=_bench_description())],
    ]


# ---- interrupts ------------------------------------------------------------------------------


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
    from mhalearn.experiments import plot, run_study
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
    from mhalearn.experiments import STUDIES, plot
    from mhalearn.experiments.executors import status as look
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
    from mhalearn.experiments import plot as figure_of
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


# ---- parsing ---------------------------------------------------------------------------------


def _place_study(argv: list[str]) -> list[str]:
    """``run`` with the study name anywhere: moved right after ``run`` (so that options may
    come before it); an unknown name where the study belongs is refused, naming the
    studies."""
    if not argv or argv[0] != "run":
        return argv
    rest = argv[1:]
    for i, arg in enumerate(rest):
        if arg in STUDY_NAMES:
            return ["run", arg, *rest[:i], *rest[i + 1 :]]
    if rest and not rest[0].startswith("-"):
        raise ValueError(
            f"unknown study {rest[0]!r}; expected one of {', '.join(sorted(STUDY_NAMES))} "
            "(`mhalearn list` describes them)"
        )
    return argv


def _parse(argv: list[str]):
    """tyro's parse, with its boxed error reduced to one line (exit 2)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(
                _commands(),
                prog="mhalearn",
                description=_description(),
                args=_place_study(argv),
                config=(tyro.conf.CascadeSubcommandArgs, tyro.conf.OmitSubcommandPrefixes),
            )
    except SystemExit as exit:
        if exit.code in (0, None):
            sys.stderr.write(captured.getvalue())
            raise
        lines = [
            re.sub(r"^[\s│╭╰╮╯]+|[\s│╭╰╮╯]+$", "", s) for s in captured.getvalue().splitlines()
        ]
        body = []  # the first section of tyro's box (a message may wrap over lines)
        for line in itertools.dropwhile(lambda s: not s.strip("─- "), lines[1:]):
            if not line.strip("─- "):  # the end of the section (a rule, boxed or plain)
                break
            body.append(line)
        message = " ".join(body) or "invalid arguments"
        message = re.sub(r"^Error parsing [^:]*__tyro[^:]*: ", "", message)  # a spec's own
        message = re.sub(r"^Error parsing ([^:]*): ", r"\1: ", message)
        if "Argument helptext:" in lines:  # say what the option takes
            usage = lines[lines.index("Argument helptext:") + 1].strip()
            message = re.sub(
                r"Could not find valid parse for arguments: \[(.*)\]$",
                rf"cannot read \1 (expected {usage})",
                message,
            )
        message = re.sub(
            r"invalid literal for int\(\) with base 10: ('[^']*')",
            r"expected an integer, received \1",
            message,
        )
        message = re.sub(
            r"could not convert string to float: ", "expected a number, received ", message
        )
        raise ValueError(message) from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command; ``argv`` (default: the process's) without the program name. Only the
    process's own command (``argv`` None) takes over SIGINT and SIGTERM."""
    own = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    try:
        command = _parse(argv)
        if isinstance(command, Run):
            if own:
                _exit_on_signals("finished cells are kept; run the same command to resume")
            run(command)
            if own:  # done and saved: a signal now would only race the interpreter's exit
                for sig in (signal.SIGINT, signal.SIGTERM):  # (which restores the default
                    signal.signal(sig, signal.SIG_IGN)  # handlers, killing it silently)
        elif isinstance(command, List):
            list_studies(command)
        elif isinstance(command, Plot):
            plot(command)
        elif isinstance(command, Status):
            status(command)
        else:
            return bench(command, extra)
        sys.stdout.flush()
    except ValueError as err:
        print(f"mhalearn: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `mhalearn list | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("mhalearn: interrupted", file=sys.stderr)
        return 130
    return 0
