"""The ``mhalearn`` command (also ``python -m mhalearn``).

    mhalearn run [STUDY] [--option value ...]   run a study (default: recovery), resumably
    mhalearn list                               the studies, their parameters and defaults
    mhalearn plot RESULTS                       the figure of a saved results file
    mhalearn bench [NAME ...]                   the benchmark scripts (source checkout)

A bad argument or an invalid config ends with a one-line message and exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, Union

import tyro

from mhalearn.experiments import DEFAULT, STUDIES

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _subcommands(named: dict[str, type], defaults: bool = False):
    """A Union of tyro subcommands, one per name (built at runtime)."""
    options = tuple(
        Annotated[cls, tyro.conf.subcommand(name, default=cls() if defaults else None)]
        for name, cls in named.items()
    )
    return Union[options]  # noqa: UP007


StudyChoice = _subcommands(STUDIES, defaults=True)


@dataclasses.dataclass(frozen=True)
class Run:
    """Run a study: every cell of its grid, saved as it finishes; an interrupted run started
    again computes only the missing cells. Writes OUT/STUDY/results.nc and figure.png."""

    study: StudyChoice = STUDIES[DEFAULT]()  # noqa: RUF009 (frozen, immutable)
    out: Path = Path("results")
    """Results go to OUT/STUDY/."""
    precision: Literal["float32", "float64"] | None = None
    """Default: the study's own (float64 for recovery, whose solvers need it; else float32)."""
    chunk_size: int | None = None
    """Instances per compiled call (bounds memory); results do not depend on it."""
    devices: int | None = None
    """How many devices to spread instances over (default: all)."""
    cpu_devices: int | None = None
    """Split the CPU into this many devices (e.g. one per core): one program per device side by
    side; compiles take that many times longer, long runs up to that much less."""
    overwrite: bool = False
    """Replace results of another config in OUT/STUDY/ instead of refusing."""
    quiet: bool = False
    """No progress bar and no summary."""
    compilation_cache: Path | None = None
    """Keep compiled programs in this folder (JAX's persistent cache): reruns skip compiling."""


@dataclasses.dataclass(frozen=True)
class List:
    """List the built-in studies, their parameters and defaults."""


@dataclasses.dataclass(frozen=True)
class Plot:
    """Draw the figure of a saved results file."""

    results: tyro.conf.Positional[Path]
    """A results.nc written by `mhalearn run`."""
    figure: Path | None = None
    """Where to write the PNG (default: beside RESULTS, suffix .png)."""


@dataclasses.dataclass(frozen=True)
class Bench:
    """Run benchmark scripts from benchmarks/ (a source checkout); extra arguments after
    `--` go to every script (e.g. `mhalearn bench recovery -- --small`)."""

    names: tyro.conf.Positional[tuple[str, ...]] = ()
    """Scripts to run (default: all); see benchmarks/README.md."""


_COMMANDS = _subcommands({"run": Run, "list": List, "plot": Plot, "bench": Bench})


def run(cfg: Run) -> Path:
    import jax

    from mhalearn import split_cpu

    if cfg.cpu_devices is not None:
        split_cpu(cfg.cpu_devices)

    study = cfg.study
    precision = cfg.precision or study.precision
    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    from mhalearn import enable_compilation_cache, plots
    from mhalearn.experiments import Engine, run_study
    from mhalearn.store import Store

    if cfg.compilation_cache is not None:
        enable_compilation_cache(cfg.compilation_cache)
    progress = not cfg.quiet and sys.stderr.isatty()
    engine = Engine(chunk_size=cfg.chunk_size, devices=cfg.devices, progress=progress)
    store = Store(cfg.out / study.name, {**study.config(), "precision": precision}, cfg.overwrite)
    tic = time.perf_counter()
    ds = run_study(study, store, engine, quiet=cfg.quiet)
    figure = store.figure_path
    _use_agg()
    plots.save(plots.plot(ds), figure)
    if not cfg.quiet:
        print(study.summarize(ds))
        print(f"{store.results_path} and {figure} ({time.perf_counter() - tic:.1f}s)")
    return store.results_path


def list_studies(_: List) -> None:
    for name, cls in STUDIES.items():
        default = " (default)" if name == DEFAULT else ""
        print(f"{name}{default}: {cls.summary}")
        for f in dataclasses.fields(cls):
            print(f"    --{f.name.replace('_', '-')} {_show(getattr(cls(), f.name))}")


def _show(value) -> str:
    if isinstance(value, tuple):
        return " ".join(_show(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot(cfg: Plot) -> Path:
    from mhalearn import plots
    from mhalearn.store import load

    ds = load(cfg.results)
    figure = cfg.figure or cfg.results.with_suffix(".png")
    _use_agg()
    plots.save(plots.plot(ds), figure)
    print(figure)
    return figure


def bench(cfg: Bench, extra: Sequence[str]) -> int:
    if not BENCHMARKS.is_dir():
        raise ValueError(f"no benchmarks folder at {BENCHMARKS}: run from a source checkout")
    known = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
    for name in cfg.names:
        if name not in known:
            raise ValueError(f"unknown benchmark {name!r}; expected one of {known}")
    for name in cfg.names or known:
        print(f"== benchmarks/{name}.py {' '.join(extra)}", flush=True)
        code = subprocess.call([sys.executable, str(BENCHMARKS / f"{name}.py"), *extra])
        if code:
            return code
    return 0


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg")


def _parse(argv: list[str]):
    """tyro's parse, with its boxed error reduced to one line (exit 2)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(
                _COMMANDS,
                prog="mhalearn",
                description=__doc__.splitlines()[0],
                args=argv,
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
        for line in lines[1:]:
            if not line.strip("─ "):
                break
            body.append(line)
        message = re.sub(r"^Error parsing [^:]*: ", "", " ".join(body)) or "invalid arguments"
        raise ValueError(message) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    try:
        command = _parse(argv)
        if isinstance(command, Run):
            run(command)
        elif isinstance(command, List):
            list_studies(command)
        elif isinstance(command, Plot):
            plot(command)
        else:
            return bench(command, extra)
    except ValueError as err:
        print(f"mhalearn: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "mhalearn: interrupted; finished cells are saved, run again to resume", file=sys.stderr
        )
        return 130
    return 0
