"""What the ``mhalearn`` command takes: its subcommands and their options (each study's
from ``studies.json``), and the parse of its arguments, a bad one reported in one line."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import itertools
import re
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import tyro

from mhalearn.options import options, plain

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
