"""What every study shares: the spec, the grid, running cells into one ``xarray.Dataset``.

A study is a frozen dataclass: its **static grid** (values that change shapes or the compiled
program — a learner, a sample count — one compiled *cell* each), its **vmapped grid** (numbers
swept inside a cell's single compilation — β, a step size, an active head count),
``instances`` per grid point and a root ``seed``. Every cell uses the same root key and
instance i of every grid point draws from ``fold_in(key, i)``: the grid points of a cell, and
the cells that share shapes, see the same random problems (common random numbers).

:func:`run_study` runs the cells (resuming from a :class:`~mhalearn.store.Store` when given)
and merges them into one Dataset with dimensions (static axes, vmapped axes, ``instance``,
``step``), a coordinate for every swept value and attributes that make it reproducible.
Flags (success, diverged, ...) are stored as 0/1 integers (``int8``); a variable missing from
some cells is NaN there (see :func:`merge_cells`).
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import numpy as np

from mhalearn._validate import study_fields
from mhalearn.batch import Engine, provenance
from mhalearn.simulate import Results, grid_dataset, to_jsonable
from mhalearn.variables import annotate

if TYPE_CHECKING:
    import xarray as xr


@dataclasses.dataclass(frozen=True)
class Study(abc.ABC):
    """Base of every study spec. Subclasses set ``name``, ``summary``, ``static_axes`` (each
    the name of a tuple field), ``headline`` and ``presets`` (at least ``"tiny"``), declare
    ``instances`` and ``seed`` with their defaults, and implement :meth:`run_cell`. A study
    computes; its figure is drawn apart (:mod:`mhalearn.experiments.figures`)."""

    @property
    @abc.abstractmethod
    def instances(self) -> int:
        """Random instances per grid point (a field of every study)."""

    @property
    @abc.abstractmethod
    def seed(self) -> int:
        """Root seed: instance i of every grid point draws from fold_in(key(seed), i) (a field
        of every study)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    static_axes: ClassVar[tuple[str, ...]]
    headline: ClassVar[str]  # the variable :meth:`summarize` reports
    precision: ClassVar[str] = "float32"  # what the command runs it in unless told otherwise
    positive: ClassVar[tuple[str, ...]] = ()  # number fields that must be > 0, not only >= 0
    counts_from_zero: ClassVar[tuple[str, ...]] = ()  # integer fields that may be 0
    #: named sizes, as field overrides: "tiny" (the tests run every study at it, in seconds,
    #: with two values on every axis that has a curve), "small" and "full" (its notebook's
    #: sizes) and any variants a notebook runs
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Study:
        """The study at its preset ``name`` (see :attr:`presets`), with ``overrides``."""
        if name not in cls.presets:
            raise ValueError(
                f"{cls.name} has no preset {name!r}; expected one of {sorted(cls.presets)}"
            )
        return cls(**{**cls.presets[name], **overrides})

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Study:
        """The study whose :meth:`config` (read back from JSON: lists for tuples) is
        ``config``; keys that are not fields (``study``, ``type``, and fields added since,
        which take their defaults) are left out."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        return cls(**{k: v for k, v in values.items() if k in fields})

    def __post_init__(self):
        """Checks every field before any work (:func:`~mhalearn._validate.study_fields`);
        each study adds its stricter checks."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        study_fields(values, self.positive, self.counts_from_zero)

    def cells(self) -> list[dict[str, Any]]:
        """The static grid: one dict (static axis → value) per compiled cell, every
        combination of the static axes' values, the last axis fastest."""
        values = (getattr(self, axis) for axis in self.static_axes)
        return [dict(zip(self.static_axes, c, strict=True)) for c in itertools.product(*values)]

    @abc.abstractmethod
    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        """One cell's ``xarray.Dataset`` (vmapped axes, ``instance``, ``step``; no static axes)."""

    def summarize(self, ds) -> str:
        """The headline variable per grid point: its mean over instances for a 0/1 flag
        (a rate), its median otherwise."""
        da = ds[self.headline]
        flag = "flag_values" in da.attrs
        stat = da.mean("instance") if flag else da.median("instance")
        what = "rate" if flag else "median"
        table = stat.to_series().to_string()
        return f"{self.headline} ({what} over {ds.sizes['instance']} instances):\n{table}"

    def derive(self, ds):
        """``ds`` (the merged cells) with what is computed across cells and instances added
        (thresholds, fits); nothing by default."""
        return ds

    def config(self) -> dict[str, Any]:
        return {"study": self.name, **to_jsonable(self)}

    def annotations(self) -> dict[str, dict[str, Any]]:
        """Attributes beyond :mod:`mhalearn.variables`' that this study's variables carry
        (e.g. the success tolerance), by variable name."""
        return {}


STUDIES: dict[str, type[Study]] = {}
"""Every registered study, by name (:func:`register_study`): the built-in ones, which the
command runs, and any registered since."""


def register_study(cls: type[Study]) -> type[Study]:
    """Make a study known by its ``name`` to :data:`STUDIES` (a class decorator); the command
    runs the built-in ones (:mod:`mhalearn.options`). Its figure is registered apart
    (:func:`~mhalearn.experiments.figures.register_figure`).

    Raises:
        ValueError: the study has no "tiny" preset (the size the tests run), leaves an
            abstract method unimplemented, or its name is taken.
    """
    if "tiny" not in cls.presets:
        raise ValueError(f"study {cls.name!r} needs a 'tiny' preset (the size tests run)")
    if cls.__abstractmethods__:
        missing = sorted(cls.__abstractmethods__)
        raise ValueError(f"study {cls.name!r} does not implement {missing}")
    if cls.name in STUDIES and STUDIES[cls.name] is not cls:
        raise ValueError(f"a study named {cls.name!r} is registered already")
    STUDIES[cls.name] = cls
    return cls


def cell_id(cell: dict[str, Any]) -> str:
    """A file-name-safe, human-readable name of a cell."""
    return "_".join(f"{k}-{v}" for k, v in cell.items()).replace("/", "-") or "all"


class Grid(NamedTuple):
    """A flattened product grid: each axis's value per grid instance, and the key id (the
    instance index) of each."""

    values: dict[str, np.ndarray]
    key_ids: np.ndarray


def product_grid(axes: dict[str, Sequence[Any]], instances: int) -> Grid:
    """Every combination of the vmapped ``axes`` × ``instances``, flattened in C order with the
    instance last: per-instance values of each axis, and the key ids (the instance index, so
    every grid point sees the same problems)."""
    grids = np.meshgrid(
        *[np.asarray(v) for v in axes.values()], np.arange(instances), indexing="ij"
    )
    values = {name: g.ravel() for name, g in zip(axes, grids[:-1], strict=True)}
    return Grid(values, grids[-1].ravel())


def results_dataset(res: Results, axes: dict[str, Sequence[Any]], instances: int):
    """:func:`~mhalearn.simulate.grid_dataset` of a :func:`~mhalearn.simulate.simulate` or
    :func:`~mhalearn.simulate.measure` run on a :func:`product_grid` (metrics, status and the
    trace as ``trace_*`` over ``step``)."""
    return grid_dataset(res.arrays(), axes, instances, res.trace_steps)


def attributes(study: Study) -> dict[str, Any]:
    """What makes a results file reproducible (nothing that changes from run to run)."""
    about = provenance()
    del about["devices"]  # how many ran it does not change the results
    return {"study": study.name, "config": json.dumps(study.config()), "seed": study.seed, **about}


def merge_cells(study: Study, cells: list[dict[str, Any]], datasets: list) -> Any:
    """One Dataset from the cells' Datasets, static axes in the study's order, every variable
    annotated (:mod:`mhalearn.variables`).

    A variable that some cells lack (a learner's own diagnostic, say) is missing there: NaN in
    memory. An integer or flag variable keeps its dtype where no entry is missing; where some
    are, it is a float with NaN in memory and is written as its integer dtype with an explicit
    ``_FillValue`` (the dtype's minimum), which reads back as NaN."""
    import xarray as xr

    datasets = [ds.drop_encoding() for ds in datasets]  # stale on-disk dtypes must not leak
    placed = [
        ds.expand_dims({axis: [cell[axis]] for axis in study.static_axes})
        for cell, ds in zip(cells, datasets, strict=True)
    ]
    merged = xr.merge(placed, compat="no_conflicts", join="outer", combine_attrs="drop")
    order = {axis: list(dict.fromkeys(c[axis] for c in cells)) for axis in study.static_axes}
    merged = merged.reindex(order)
    for name, var in merged.data_vars.items():
        kinds = {ds[name].dtype for ds in datasets if name in ds}
        kind = np.result_type(*kinds)
        if np.issubdtype(kind, np.bool_) or np.issubdtype(kind, np.integer):
            if not var.isnull().any():
                merged[name] = var.astype(kind)
            else:
                stored = np.dtype(np.int8) if np.issubdtype(kind, np.bool_) else kind
                merged[name].encoding = {"dtype": stored, "_FillValue": np.iinfo(stored).min}
    dims = (*study.static_axes, *[d for d in placed[0].dims if d not in study.static_axes])
    merged = merged.transpose(*[d for d in dims if d in merged.dims], ...)
    merged.attrs = attributes(study)
    return annotate(study.derive(merged), study.annotations())


def _run_through(study: Study, store: Any, engine: Engine, quiet: bool, executor: Any):
    """:func:`run_study` with an executor: the jobs, then the merge under the folder's lock."""
    from mhalearn.experiments.executors import run_on

    if store is None:
        raise ValueError("an executor needs a store: its folder is where the jobs meet")
    if not isinstance(engine.devices, int | None):
        raise ValueError("an executor's jobs take devices as a count, not as Device objects")
    # what a job's engine may be told (progress stays in this process)
    options = {k: v for k, v in engine.kwargs().items() if k != "progress"}
    if not run_on(study, store, executor, options, quiet):
        return None
    return merge_stored(study, store)


def merge_stored(study: Study, store: Any):
    """``study``'s cells read from ``store``, merged and written as its results, under the
    folder's lock (no other writer merges or changes the config meanwhile)."""
    from mhalearn.store import folder_lock

    cells = study.cells()
    with folder_lock(store.folder):
        merged = merge_cells(study, cells, [store.read_cell(cell_id(c)) for c in cells])
        store.write_results(merged)
    return merged


class _CellBar:
    """A terminal progress bar of cells whose text shows the current cell's phase (compiling,
    then instances done) and whose clock moves while XLA compiles. When stderr is not a
    terminal (a run in the background, its output in a log), a plain line instead: how many
    cells are left at the start, then one per finished cell with its time."""

    def __init__(self, study: Study, total: int, done: int):
        from tqdm import tqdm

        # disable=None: silent when stderr is not a terminal (the lines below speak instead)
        self.bar = tqdm(total=total, initial=done, desc=study.name, unit="cell", disable=None)
        self.name, self.total, self.done = study.name, total, done
        self.start = self.tic = time.perf_counter()
        self.stop = threading.Event()
        if not self.bar.disable:
            threading.Thread(target=self._tick, name="mhalearn-progress", daemon=True).start()
        else:
            stored = f" ({done} already stored)" if done else ""
            self._line(f"{total - done} of {total} cells to run{stored}")

    def _line(self, text: str) -> None:
        print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def _tick(self) -> None:
        while not self.stop.wait(1.0):
            self.bar.refresh()

    def engine(self, engine: Engine, name: str) -> Engine:
        """``engine`` reporting the phase of cell ``name`` on the bar."""
        if self.bar.disable:
            return engine

        def report(phase, finished, total):
            what = f"{finished}/{total} instances" if phase == "running" else phase
            self.bar.set_postfix_str(f"{name}: {what}")

        return dataclasses.replace(engine, progress=report)

    def advance(self, name: str) -> None:
        """Cell ``name`` done."""
        self.bar.update(1)
        self.done += 1
        if self.bar.disable:
            now = time.perf_counter()
            self._line(
                f"{name} done in {now - self.tic:.0f}s ({self.done}/{self.total} cells, "
                f"{now - self.start:.0f}s so far)"
            )
            self.tic = now

    def close(self) -> None:
        self.stop.set()
        self.bar.close()


def run_study(
    study: Study,
    store: Any = None,
    engine: Engine | None = None,
    quiet: bool = True,
    executor: Any = None,
) -> xr.Dataset | None:
    """Run every cell of ``study`` and return the merged Dataset.

    Args:
        study: the study spec.
        store: a :class:`~mhalearn.store.Store` to resume from and save to: only the cells it
            lacks are computed, each saved as it finishes, and the merged results are written
            to ``store.results_path``. None: in memory.
        engine: the engine options (default :class:`~mhalearn.batch.Engine`).
        quiet: no progress. Otherwise a progress bar (on a terminal) counts cells and shows
            the current cell's phase; when stderr is not a terminal, a line on it says how
            many cells are left, then one per finished cell, with its time.
        executor: an :class:`~mhalearn.experiments.executors.Executor` (SLURM or local
            processes, through submitit): the missing cells run as jobs that meet in
            ``store``'s folder (required), and this call waits for them and merges (see
            :mod:`mhalearn.experiments.executors`). None: in this process.

    Returns:
        The merged results: dimensions (static axes, vmapped axes, ``instance``,
            ``step``), a coordinate for every swept value, what :meth:`Study.derive` adds,
            and attributes that make it reproducible. None when ``executor.detach`` returned
            before every cell was stored.

    Raises:
        RuntimeError: jobs of ``executor`` ended with cells missing (their logs named).
    """
    engine = engine or Engine()
    if executor is not None:
        return _run_through(study, store, engine, quiet, executor)
    cells = study.cells()
    key = jax.random.key(study.seed)
    todo = [c for c in cells if store is None or not store.has(cell_id(c))]
    done: dict[str, Any] = {}
    bar = _CellBar(study, len(cells), len(cells) - len(todo)) if not quiet and todo else None
    tic = time.perf_counter()
    try:
        for cell in todo:
            name = cell_id(cell)
            ds = study.run_cell(cell, key, engine if bar is None else bar.engine(engine, name))
            if store is None:
                done[name] = ds
            else:
                store.write_cell(name, ds)
            if bar is not None:
                bar.advance(name)
    finally:
        if bar is not None:
            bar.close()
    if store is not None:
        merged = merge_stored(study, store)
    else:
        merged = merge_cells(study, cells, [done[cell_id(c)] for c in cells])
    if not quiet:
        elapsed = time.perf_counter() - tic
        print(f"{study.name}: {len(todo)} of {len(cells)} cells run in {elapsed:.1f}s")
    return merged
