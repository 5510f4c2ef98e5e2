"""THE place that maps a per-instance function over many instances: :func:`map_instances`
and its options, :class:`Engine`."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray, PyTree

from mhalearn._validate import positive_int
from mhalearn.batch.devices import (
    compiler_options,
    default_vector_width,
    device_memory,
    fitted_width,
    select_devices,
)
from mhalearn.batch.programs import (
    cached_compile,
    group_program,
    program_bytes,
    program_key,
    unpacked,
)
from mhalearn.batch.scheduler import Progress, one_blas_thread, reporter, run_chunk


def _typed(key: PRNGKeyArray) -> bool:
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def _split_key(root_key: PRNGKeyArray) -> tuple[np.ndarray, Callable[[jax.Array], PRNGKeyArray]]:
    """Key data that can travel as an array, and the function that rebuilds the key."""
    if jnp.issubdtype(root_key.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(root_key)
        return np.asarray(jax.random.key_data(root_key)), lambda d: jax.random.wrap_key_data(
            d, impl=impl
        )
    return np.asarray(root_key), lambda d: d


@dataclasses.dataclass(frozen=True)
class Engine:
    """How instances are run, never what is computed (results do not depend on it): the
    instances per chunk, the devices, the instances per compiled call, the XLA options and
    the progress shown. :func:`map_instances`, :func:`~mhalearn.simulate.measure`,
    :func:`~mhalearn.simulate.simulate` and the studies take it as ``engine=`` (or its fields
    as keywords, :meth:`given`)."""

    chunk_size: int | None = None
    devices: int | Sequence[jax.Device] | None = None
    vector_width: int | None = None
    options: dict[str, str | bool | int] | None = None
    progress: bool | Progress = False

    def __post_init__(self):
        for name in ("chunk_size", "vector_width"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if isinstance(self.devices, int):
            positive_int("devices", self.devices)

    def kwargs(self) -> dict[str, Any]:
        """Its fields by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def given(cls, engine: Engine | None = None, **options: Any) -> Engine:
        """``engine`` (``None``: the default) with the fields named in ``options`` replaced:
        how the functions that take ``engine=`` also take its fields as keywords."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(
                f"unexpected engine option(s) {unknown}; an Engine has "
                f"{[f.name for f in dataclasses.fields(cls)]}"
            )
        return dataclasses.replace(cls() if engine is None else engine, **options)


def _checked_key_ids(key_ids: np.ndarray | None, instances: int) -> np.ndarray:
    key_ids = np.arange(instances) if key_ids is None else np.asarray(key_ids)
    if key_ids.shape != (instances,) or not np.issubdtype(key_ids.dtype, np.integer):
        raise ValueError(
            f"key_ids: expected integers of shape (instances,) = ({instances},), "
            f"received {key_ids.dtype} of shape {key_ids.shape}"
        )
    if key_ids.min() < 0 or key_ids.max() >= 2**32:
        raise ValueError(
            f"key_ids must lie in [0, 2**32), received {key_ids.min()} .. {key_ids.max()}"
        )
    return key_ids.astype(np.uint32)  # what fold_in takes, with or without x64


def _checked_per_instance(per_instance: PyTree, instances: int) -> PyTree:
    per_instance = jax.tree.map(np.asarray, per_instance)
    for path, leaf in jax.tree_util.tree_leaves_with_path(per_instance):
        if leaf.shape[:1] != (instances,):
            raise ValueError(
                f"per_instance{jax.tree_util.keystr(path)}: expected a leading axis of length "
                f"instances = {instances}, received shape {leaf.shape}"
            )
    return per_instance


def _chunk(instances: int, chunk_size: int | None, unit: int) -> int:
    """Instances per chunk: ``chunk_size`` (at most all of them) rounded up to whole groups on
    every device (``unit`` = devices × vector width)."""
    chunk = (
        instances if chunk_size is None else min(positive_int("chunk_size", chunk_size), instances)
    )
    return math.ceil(chunk / unit) * unit


def _looped(devices: Sequence[jax.Device]) -> bool:
    """Whether a group is a loop (CPU) rather than a vmap (accelerators)."""
    return devices[0].platform == "cpu"


def map_instances(
    fn: Callable[[PRNGKeyArray, PyTree, PyTree], PyTree],
    root_key: PRNGKeyArray,
    instances: int,
    per_instance: PyTree = None,
    shared: PyTree = None,
    *,
    key_ids: np.ndarray | None = None,
    engine: Engine | None = None,
    stats: dict | None = None,
    **engine_options: Any,
) -> PyTree:
    """Run ``fn(key_i, per_instance_i, shared)`` for every instance; return host (numpy)
    arrays with a leading ``instances`` axis.

    ``per_instance``: a PyTree whose array leaves all have a leading axis of length
    ``instances`` (instance i sees slice i). ``shared``: a PyTree given whole to every
    instance; its array-like leaves are traced arguments (new values do not recompile), other
    leaves are static.

    ``engine`` (:class:`Engine`, or its fields as keywords): ``chunk_size`` instances at a
    time (all: ``None``), on ``devices``, ``vector_width`` instances per compiled call
    (``None``: :func:`~mhalearn.batch.devices.default_vector_width`, fitted to the memory
    on an accelerator); ``options``: XLA compiler options for the instance program (default
    :func:`~mhalearn.batch.devices.compiler_options`; ``{}`` compiles with XLA's defaults);
    ``progress``: ``True`` for a progress bar (on a terminal), or a
    :data:`~mhalearn.batch.scheduler.Progress` callback told when compilation starts and as
    instances finish.

    ``stats``, when a dict is given, receives ``compile_seconds`` (ahead-of-time compilation,
    all devices), ``run_seconds`` (everything after it, results on the host included),
    ``vector_width`` (the width used) and how many device programs were ``programs_compiled``,
    ``programs_relocated`` (another CPU device's binary, loaded:
    :func:`~mhalearn.batch.programs.relocated`) and ``programs_kept`` (compiled by an earlier
    call).
    """
    engine = Engine.given(engine, **engine_options)
    chunk_size, vector_width, options = engine.chunk_size, engine.vector_width, engine.options
    instances = positive_int("instances", instances)
    devs = select_devices(engine.devices)
    per_device = math.ceil(min(instances, chunk_size or instances) / len(devs))
    width = positive_int("vector_width", vector_width or default_vector_width(devs, per_device))
    looped = _looped(devs)
    chunk = _chunk(instances, chunk_size, len(devs) * width)
    key_ids = _checked_key_ids(key_ids, instances)
    per_instance = _checked_per_instance(per_instance, instances)
    shared_dynamic, shared_static = eqx.partition(shared, eqx.is_array_like)
    shared_dynamic = jax.tree.map(jnp.asarray, shared_dynamic)
    key_data, rebuild_key = _split_key(root_key)
    key_kind = str(jax.random.key_impl(root_key)) if _typed(root_key) else "raw"
    mine = [d for d in devs if d.process_index == jax.process_index()]

    # Every device runs the same single-device program on its groups: an SPMD-partitioned
    # program would be compiled differently from a single-device one, and its last bits would
    # change with the number of devices.
    on_device = {d: jax.device_put((shared_dynamic, key_data), d) for d in mine}

    def group_args(rows: np.ndarray, device: jax.Device):
        per = jax.tree.map(lambda a: a[rows], per_instance)
        return (*jax.device_put((key_ids[rows], per), device), *on_device[device])

    report = reporter(engine.progress, instances)
    tic = time.perf_counter()
    if report is not None:
        report("compiling", 0, instances)

    programs = collections.Counter()  # how each device program was had

    def compile_all(width):
        program = group_program(fn, shared_static, rebuild_key, width, looped)
        first = np.zeros(width, dtype=np.int64)  # rows of the first group, to compile
        compiled = {}
        for d in mine:
            args = group_args(first, d)
            key = program_key(fn, shared_static, key_kind, (width, looped), args, options, d)
            # on CPU every device runs the first device's binary: compiled once
            like = compiled[mine[0]] if looped and d != mine[0] else None
            compiled[d], how = cached_compile(key, program, args, options, d, like)
            programs[how] += 1
        return {d: p.compiled for d, p in compiled.items()}, compiled[mine[0]].layout

    options = compiler_options(devs) if options is None else options
    run_group, layout = compile_all(width)
    if vector_width is None and not looped:  # a vmapped group: fit its width to the memory
        used, memory = program_bytes(run_group[mine[0]]), device_memory(mine[0])
        if used is not None and memory is not None:
            fitted = fitted_width(used / width, memory, per_device)
            if fitted != width:
                width = fitted
                chunk = _chunk(instances, chunk_size, len(devs) * width)
                run_group, layout = compile_all(width)
    toc = time.perf_counter()

    with one_blas_thread(devs):
        pieces = [
            run_chunk(run_group, group_args, devs, mine, start, chunk, width, instances, report)
            for start in range(0, instances, chunk)
        ]
    if report is not None:
        report("done", instances, instances)
    result = jax.tree.map(lambda *parts: np.concatenate(parts), *pieces)
    result = unpacked(result, layout)
    if stats is not None:
        stats.update(
            compile_seconds=toc - tic,
            run_seconds=time.perf_counter() - toc,
            vector_width=width,
            **{f"programs_{how}": programs[how] for how in ("compiled", "relocated", "kept")},
        )
    return result
