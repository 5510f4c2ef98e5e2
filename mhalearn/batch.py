"""THE place that maps a per-instance function over many instances.

:func:`map_instances` runs ``fn(key_i, per_instance_i, shared)`` for i = 0 .. instances−1,
with ``key_i = fold_in(root_key, key_ids[i])`` (``key_ids``: the global instance indices by
default; give them to make instances share their randomness). Instances are computed
``chunk_size`` at a time (peak memory is set by the chunk), spread over the chosen devices
of this process, or over every process after ``jax.distributed.initialize``, in groups of
``vector_width`` instances per compiled call: a loop of the unbatched program on CPU, a
vmap on an accelerator. Results are bitwise identical for every chunk size and device count
(on CPU at any width; on an accelerator for a given width). Compiled programs are kept and
reused by later calls with the same function, static settings, shapes, width, options and
device (:func:`clear_programs` forgets them). :class:`Engine` carries the options;
:func:`set_precision`, :func:`split_cpu` and :func:`enable_compilation_cache` configure the
process. How and why the engine schedules work as it does: the documentation's performance
page ("How the engine maps instances").
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import io
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import PRNGKeyArray, PyTree

from mhalearn._validate import choice, positive_int
from mhalearn._version import __version__, source_commit

AXIS = "instances"

#: ``progress(phase, done, total)``: phase ``"compiling"`` (done 0), ``"running"`` (``done``
#: of ``total`` instances finished) or ``"done"``. In one process the ``"running"`` calls come
#: from the threads that serve the devices (:func:`_pulled`), one call at a time.
Progress = Callable[[str, int, int], None]


def select_devices(devices: int | Sequence[jax.Device] | None = None) -> list[jax.Device]:
    """``None``: every device (of every process); an int n: the first n; or the devices given."""
    every = jax.devices()
    if devices is None:
        return every
    if isinstance(devices, int):
        if not 1 <= devices <= len(every):
            raise ValueError(f"devices must lie in [1, {len(every)}] here, received {devices}")
        return every[:devices]
    return list(devices)


def split_cpu(count: int | None = None) -> int:
    """Make the CPU appear as ``count`` devices (default: one per core), so that
    :func:`map_instances` runs instance programs on every core side by side instead of one
    program at a time: the steady state takes up to ``count`` times less, and the program is
    compiled once (loaded for the other devices, a few tenths of a second each; compiled for
    each where it cannot be, see :func:`_relocated`). Results are unchanged (every device runs
    the same single-device program). Call it before JAX first uses a device; returns
    ``count``."""
    count = positive_int("cpu_devices", (os.cpu_count() or 1) if count is None else count)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as err:
        raise ValueError(
            f"split_cpu must run before JAX first uses a device (JAX said: {err})"
        ) from None
    return count


def set_precision(precision: str) -> None:
    """Compute in ``"float32"`` or ``"float64"`` from now on (JAX's x64 switch). Library code
    never calls it; entry points (the command, notebooks, benchmarks, tests) do, once, first."""
    choice("precision", precision, ("float32", "float64"))
    jax.config.update("jax_enable_x64", precision == "float64")


def enable_compilation_cache(folder: str) -> None:
    """Keep compiled programs in ``folder`` across processes (JAX's persistent compilation
    cache): a second run of the same shapes skips XLA compilation."""
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def default_vector_width(devices: Sequence[jax.Device], per_device: int = 1) -> int:
    """On CPU, where a group is a loop (:func:`_group_program`) and its width never changes a
    result: the largest power of two up to :data:`CPU_GROUP` of which every device receives
    at least four groups (``per_device`` instances), else 1 — fewer calls for many tiny
    problems (64 GD fits at (2, 8, 4, 256) on two devices: 8 per call, where it used to be
    1, in benchmarks/compare.py), and padding below a quarter of the instances. On
    accelerators the width is fitted to the device's memory and the problem
    (:func:`fitted_width`); this is the probe width it is measured at."""
    if devices[0].platform == "cpu":
        width = 1
        while 2 * width <= CPU_GROUP and 4 * 2 * width <= per_device:
            width *= 2
        return width
    return _PROBE_WIDTH


#: instances one compiled call carries, one after another, on a CPU device with many of them
CPU_GROUP = 16
_PROBE_WIDTH = 32
#: the share of an accelerator's memory one group program may fill
MEMORY_SHARE = 0.5


def fitted_width(bytes_per_instance: float, memory_bytes: float, instances_per_device: int) -> int:
    """The width of the group program on an accelerator: the largest power of two whose
    groups fit in :data:`MEMORY_SHARE` of ``memory_bytes`` at ``bytes_per_instance`` (what
    the compiler reports for a probe group, per instance), and no wider than the instances
    each device receives (rounded up to a power of two), so that thousands of instances
    are in flight per call without padding a small run. At least 1."""
    fit = MEMORY_SHARE * memory_bytes / max(bytes_per_instance, 1.0)
    need = 2 ** math.ceil(math.log2(max(instances_per_device, 1)))
    return int(max(1, min(2 ** math.floor(math.log2(max(fit, 1.0))), need)))


def _program_bytes(compiled: Any) -> float | None:
    """Device memory a compiled program uses (arguments, outputs, temporaries), if known."""
    try:
        m = compiled.memory_analysis()
        return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
    except (AttributeError, NotImplementedError, jax.errors.JaxRuntimeError):
        return None


def _device_memory(device: jax.Device) -> float | None:
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit")


# XLA:CPU hands matrix products to the YNNPACK library when this (experimental) option is
# set, one product at a time: faster at the small shapes the studies run (benchmarks/compare.py
# measures it against XLA's defaults with --xla-defaults).
_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(devices: Sequence[jax.Device]) -> dict[str, str]:
    """The XLA options instance programs are compiled with: on CPU, matrix products through
    YNNPACK; elsewhere XLA's defaults."""
    return dict(_CPU_OPTIONS) if devices[0].platform == "cpu" else {}


#: persistent-cache hits seen by this process (a program read from JAX's persistent cache
#: cannot be serialized again whole on CPU: it is never relocated, see :func:`_relocated`)
_CACHE_HITS = [0]


def _count_cache_hit(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _CACHE_HITS[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


class _Layout(NamedTuple):
    """Where each output of a group lies in its packed bytes (:func:`_packed`): the outputs'
    tree, and per leaf its byte columns, per-instance shape and dtype."""

    treedef: Any
    fields: tuple[tuple[int, int, tuple[int, ...], np.dtype], ...]


class _Program(NamedTuple):
    compiled: Any
    #: compiled in this process (not read from the persistent cache): it can be relocated
    relocatable: bool
    #: how its packed output unpacks (None: not packed)
    layout: _Layout | None = None


#: the matrix-product precision instance programs are traced at, unless
#: ``jax_default_matmul_precision`` is set (see the module's docstring)
MATMUL_PRECISION = "highest"


def _lower(fn: Callable, args: tuple) -> Any:
    """``jit(fn)`` lowered for ``args``, its matrix products at :data:`MATMUL_PRECISION` unless
    the user configured JAX's default precision."""
    precision = jax.config.jax_default_matmul_precision or MATMUL_PRECISION
    with jax.default_matmul_precision(precision):
        return jax.jit(fn).lower(*args)


def _compile(fn: Callable, args: tuple, options: dict) -> _Program:
    hits = _CACHE_HITS[0]
    lowered = _lower(fn, args)
    try:
        compiled = lowered.compile(compiler_options=options or None)
    except jax.errors.JaxRuntimeError as err:
        unknown = [k for k in options if k in str(err)]
        if not unknown:
            raise
        warnings.warn(  # an XLA that no longer knows the option: its defaults, not a failure
            f"XLA rejected the compiler option(s) {unknown} ({err}); compiling without them",
            RuntimeWarning,
            stacklevel=3,
        )
        compiled = lowered.compile()
    return _Program(compiled, _CACHE_HITS[0] == hits)


#: compiled group programs of this process, by everything that determines them (the function,
#: the static part of ``shared``, the argument shapes, the width, the options, the device): a
#: repeated call with the same structure — another seed, other swept numbers, another cell of
#: the same shapes — runs without compiling. The oldest are dropped beyond _KEPT.
_PROGRAMS: collections.OrderedDict[Any, _Program] = collections.OrderedDict()
_KEPT = 32


def clear_programs() -> None:
    """Forget the compiled programs this process keeps (their memory is freed; the next call
    of every structure compiles again)."""
    _PROGRAMS.clear()


def _program_key(fn, shared_static, key_kind, width, args, options, device) -> Any:
    """A hashable description of the program, or None when a static part is not hashable."""
    static_leaves, static_def = jax.tree.flatten(shared_static)
    arg_leaves, arg_def = jax.tree.flatten(args)
    shapes = tuple((np.shape(a), str(a.dtype)) for a in arg_leaves)
    key = (fn, static_def, tuple(static_leaves), key_kind, width, arg_def, shapes)
    key += (tuple(sorted(options.items())), device.platform, device.id)
    key += (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _relocated(program: _Program, device: jax.Device) -> _Program | None:
    """``program``, compiled for one CPU device, loaded to run on ``device`` (a CPU device of
    the same process) without compiling again: its binary does not depend on which CPU device
    runs it, only its device assignment does, so the results are the same bit for bit. None
    where it cannot be (the caller then compiles): read from the persistent cache, already run
    (XLA:CPU then holds parts it cannot serialize, such as a sort's comparator), or a JAX whose
    internals used here changed."""
    if not program.relocatable:
        return None
    try:
        from jax._src.lib import xla_client as xc
        from jax.experimental import serialize_executable as se

        payload, in_tree, out_tree = se.serialize(program.compiled)
        options = xc.CompileOptions()
        options.device_assignment = xc.DeviceAssignment.create(
            np.array([[device.id]], dtype=np.int32)
        )

        class Unpickler(se._JaxPjrtUnpickler):
            def persistent_load(self, pid):
                if pid[0] == "device":
                    return device
                if pid[0] == "exec":
                    return self.backend.deserialize_executable(
                        pid[1], executable_devices=self.execution_devices, compile_options=options
                    )
                return super().persistent_load(pid)

        unloaded, args_info, no_kwargs = Unpickler(
            io.BytesIO(payload), device.client, [device]
        ).load()
        compiled = jax.stages.Compiled(
            unloaded.load(), [], in_tree.unflatten(args_info), out_tree, no_kwargs=no_kwargs
        )
    except Exception:  # any failure of these internals: compile instead
        return None
    return _Program(compiled, False)


def _cached_compile(
    program_key, program: Callable, args: tuple, options: dict, device: jax.Device, like=None
) -> tuple[_Program, str]:
    """The compiled program, kept by ``program_key``, and how it was had: ``"kept"`` (from an
    earlier call), ``"compiled"``, or ``"relocated"`` from ``like``, the same program compiled
    for another CPU device (:func:`_relocated`), which is tried before compiling."""
    if program_key is not None and program_key in _PROGRAMS:
        _PROGRAMS.move_to_end(program_key)
        return _PROGRAMS[program_key], "kept"
    moved = None if like is None else _relocated(like, device)
    if moved is None:
        built, how = _compile(program, args, options), "compiled"
        built = built._replace(layout=program.layout)  # set by the tracing
    else:
        built, how = moved._replace(layout=like.layout), "relocated"
    if program_key is not None:
        _PROGRAMS[program_key] = built
        while len(_PROGRAMS) > _KEPT:
            _PROGRAMS.popitem(last=False)
    return built, how


def _host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


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
    """How instances are run, never what is computed: the options of :func:`map_instances`
    (results do not depend on them). :func:`~mhalearn.simulate.simulate`,
    :func:`~mhalearn.simulate.measure` and the studies take them as ``**engine.kwargs()``."""

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
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def provenance(devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
    """Where and how results were computed: versions, device kind and count, precision."""
    devs = select_devices(devices)
    return {
        "mhalearn_version": __version__,
        "mhalearn_commit": source_commit(),
        "jax_version": jax.__version__,
        "device_kind": devs[0].device_kind,
        "devices": len(devs),
        "precision": "float64" if jax.config.jax_enable_x64 else "float32",
    }


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


def _group_program(
    fn: Callable, shared_static: PyTree, rebuild_key: Callable, width: int, looped: bool
):
    """The compiled unit: ``fn`` on one group of ``width`` instances, on one device — vmapped,
    or, ``looped``, one instance after another in a loop of the unbatched program (the CPU's
    way: its numbers are those of width 1, bit for bit, and no batched LAPACK call is made;
    see :func:`map_instances`)."""

    def instance_group(ids, per, shared_dyn, key_data):
        root = rebuild_key(key_data)
        everything = eqx.combine(shared_dyn, shared_static)

        def one(i, p):
            return fn(jax.random.fold_in(root, i), p, everything)

        if width == 1:  # no batch axis of size 1 through the program: plain kernels
            out = one(ids[0], jax.tree.map(lambda a: a[0], per))
            out = jax.tree.map(lambda a: jnp.expand_dims(a, 0), out)
        elif looped:
            out = jax.lax.map(lambda row: one(*row), (ids, per))
        else:
            out = jax.vmap(one)(ids, per)
        packed, instance_group.layout = _packed(out, width)
        return packed

    instance_group.layout = None  # set when traced
    return instance_group


def _packed(out: PyTree, width: int) -> tuple[PyTree, _Layout | None]:
    """A group's outputs as one ``(width, bytes)`` array of their bytes, and where each lies:
    one transfer to the host per group instead of one per output (a study's scores, status
    and trace are some thirty arrays, and each transfer cost the host several microseconds
    per group)."""
    leaves, treedef = jax.tree.flatten(out)
    if not leaves:
        return out, None
    parts, fields, start = [], [], 0
    for leaf in leaves:
        raw = leaf.astype(jnp.uint8) if leaf.dtype == jnp.bool_ else leaf
        raw = jax.lax.bitcast_convert_type(raw, jnp.uint8).reshape(width, -1)
        parts.append(raw)
        fields.append((start, start + raw.shape[1], leaf.shape[1:], np.dtype(leaf.dtype)))
        start += raw.shape[1]
    return jnp.concatenate(parts, axis=1), _Layout(treedef, tuple(fields))


def _unpacked(out: PyTree, layout: _Layout | None) -> PyTree:
    """A chunk's outputs, on the host, from their packed bytes (:func:`_packed`)."""
    if layout is None:
        return out
    rows = out.shape[0]
    leaves = []
    for start, stop, shape, dtype in layout.fields:
        raw = np.ascontiguousarray(out[:, start:stop])
        if dtype == np.bool_:
            leaves.append(raw.reshape(rows, *shape).astype(bool))
        else:
            leaves.append(raw.view(dtype).reshape(rows, *shape))
    return layout.treedef.unflatten(leaves)


def map_instances(
    fn: Callable[[PRNGKeyArray, PyTree, PyTree], PyTree],
    root_key: PRNGKeyArray,
    instances: int,
    per_instance: PyTree = None,
    shared: PyTree = None,
    *,
    key_ids: np.ndarray | None = None,
    chunk_size: int | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    vector_width: int | None = None,
    options: dict[str, str | bool | int] | None = None,
    progress: bool | Progress = False,
    stats: dict | None = None,
) -> PyTree:
    """Run ``fn(key_i, per_instance_i, shared)`` for every instance; return host (numpy)
    arrays with a leading ``instances`` axis.

    ``per_instance``: a PyTree whose array leaves all have a leading axis of length
    ``instances`` (instance i sees slice i). ``shared``: a PyTree given whole to every
    instance; its array-like leaves are traced arguments (new values do not recompile), other
    leaves are static.

    ``options``: XLA compiler options for the instance program (default
    :func:`compiler_options`; ``{}`` compiles with XLA's defaults).

    ``progress``: ``True`` for a progress bar (on a terminal), or a :data:`Progress` callback
    told when compilation starts and as instances finish.

    ``stats``, when a dict is given, receives ``compile_seconds`` (ahead-of-time compilation,
    all devices), ``run_seconds`` (everything after it, results on the host included),
    ``vector_width`` (the width used) and how many device programs were ``programs_compiled``,
    ``programs_relocated`` (another CPU device's binary, loaded: :func:`_relocated`) and
    ``programs_kept`` (compiled by an earlier call).
    """
    instances = positive_int("instances", instances)
    devs = select_devices(devices)
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

    report = _reporter(progress, instances)
    tic = time.perf_counter()
    if report is not None:
        report("compiling", 0, instances)

    programs = collections.Counter()  # how each device program was had

    def compile_all(width):
        program = _group_program(fn, shared_static, rebuild_key, width, looped)
        first = np.zeros(width, dtype=np.int64)  # rows of the first group, to compile
        compiled = {}
        for d in mine:
            args = group_args(first, d)
            key = _program_key(fn, shared_static, key_kind, (width, looped), args, options, d)
            # on CPU every device runs the first device's binary: compiled once
            like = compiled[mine[0]] if looped and d != mine[0] else None
            compiled[d], how = _cached_compile(key, program, args, options, d, like)
            programs[how] += 1
        return {d: p.compiled for d, p in compiled.items()}, compiled[mine[0]].layout

    options = compiler_options(devs) if options is None else options
    run_group, layout = compile_all(width)
    if vector_width is None and not looped:  # a vmapped group: fit its width to the memory
        used, memory = _program_bytes(run_group[mine[0]]), _device_memory(mine[0])
        if used is not None and memory is not None:
            fitted = fitted_width(used / width, memory, per_device)
            if fitted != width:
                width = fitted
                chunk = _chunk(instances, chunk_size, len(devs) * width)
                run_group, layout = compile_all(width)
    toc = time.perf_counter()

    with _one_blas_thread(devs):
        pieces = [
            _run_chunk(run_group, group_args, devs, mine, start, chunk, width, instances, report)
            for start in range(0, instances, chunk)
        ]
    if report is not None:
        report("done", instances, instances)
    result = jax.tree.map(lambda *parts: np.concatenate(parts), *pieces)
    result = _unpacked(result, layout)
    if stats is not None:
        stats.update(
            compile_seconds=toc - tic,
            run_seconds=time.perf_counter() - toc,
            vector_width=width,
            **{f"programs_{how}": programs[how] for how in ("compiled", "relocated", "kept")},
        )
    return result


#: the process's thread-pool libraries, found anew only once a module has been imported since
#: (finding them reads every loaded library, a sizeable share of a small call when done per
#: call; libraries are loaded by imports — SciPy's BLAS, which JAX's LAPACK calls, when JAX
#: first needs it)
_THREADPOOLS: dict[int, threadpoolctl.ThreadpoolController] = {}


def _one_blas_thread(devices: Sequence[jax.Device]) -> contextlib.AbstractContextManager:
    """On CPU devices: the process's BLAS libraries held to one thread until the context
    exits (their own settings restored then); elsewhere nothing."""
    if devices[0].platform != "cpu":
        return contextlib.nullcontext()
    imported = len(sys.modules)
    if imported not in _THREADPOOLS:
        _THREADPOOLS.clear()
        _THREADPOOLS[imported] = threadpoolctl.ThreadpoolController()
    return _THREADPOOLS[imported].limit(limits=1, user_api="blas")


#: the host threads that dispatch groups, one per device, kept from call to call (started
#: anew for each call, they cost a sizeable share of a small one)
_DISPATCHERS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _dispatchers(count: int) -> concurrent.futures.ThreadPoolExecutor:
    if count not in _DISPATCHERS:
        _DISPATCHERS[count] = concurrent.futures.ThreadPoolExecutor(
            count, thread_name_prefix="mhalearn-dispatch"
        )
    return _DISPATCHERS[count]


def _run_chunk(run_group, group_args, devs, mine, start, chunk, width, instances, report):
    """One chunk of instances, its results on the host: in one process, pulled by the
    devices (:func:`_pulled`); across processes, a block per device (:func:`_blocks`)."""
    rows = np.minimum(np.arange(start, start + chunk), instances - 1)  # pad with the last
    if jax.process_count() == 1:
        out = _pulled(run_group, group_args, mine, rows, width, instances, report)
    else:
        out = _blocks(run_group, group_args, devs, mine, rows, width, instances, report)
    valid = min(chunk, instances - start)
    return jax.tree.map(lambda a: a[:valid], out)


def _pulled(run_group, group_args, devices, rows, width, instances, report):
    """The groups of ``rows`` (``width`` rows each, in order), each device taking the next
    one as soon as it has finished its last: a device whose instances take longer (more
    restarts, more iterations) runs fewer groups, and no device waits for another's share.
    One host thread per device dispatches a group and waits for its results; the next group
    is dispatched before that wait while at least two groups per device are left, so a device
    does not stand idle between groups. A result does not depend on the device that ran it
    (every device runs the same program)."""
    starts = collections.deque(range(0, rows.size, width))
    first_row = int(rows[0])  # the chunk's first instance
    lock = threading.Lock()
    stop = threading.Event()
    results: dict[int, PyTree] = {}
    finished = 0  # instances of this chunk done

    def take() -> int | None:
        with lock:
            return None if stop.is_set() or not starts else starts.popleft()

    def pull(device):
        nonlocal finished
        pending = collections.deque()  # (first row, group output) dispatched, not collected
        while True:
            depth = 2 if len(starts) >= 2 * len(devices) else 1  # plenty left: one ahead
            while len(pending) < depth and (g := take()) is not None:
                pending.append((g, run_group[device](*group_args(rows[g : g + width], device))))
            if not pending:
                return
            first, out = pending.popleft()
            host = jax.tree.map(np.asarray, out)  # waits for the group
            with lock:
                results[first] = host
                finished += max(0, min(width, instances - first_row - first))
                if report is not None:
                    report("running", first_row + finished, instances)

    def serve(device):
        try:
            pull(device)
        except BaseException:
            stop.set()  # the other devices take no new group
            raise

    served = [_dispatchers(len(devices)).submit(serve, d) for d in devices]
    try:
        done, _ = concurrent.futures.wait(served, return_when=concurrent.futures.FIRST_EXCEPTION)
        for f in done:
            f.result()  # the first error, as soon as any device meets it
    finally:  # an error or an interruption: no new groups (those running finish)
        stop.set()
        concurrent.futures.wait(served)
    order = sorted(results)
    return jax.tree.map(lambda *parts: np.concatenate(parts), *(results[g] for g in order))


def _blocks(run_group, group_args, devs, mine, rows, width, instances, report):
    """The rows split into equal blocks, one per device (of every process), each device's
    groups dispatched asynchronously, round robin over the devices so that every device has
    work from the start; the results gathered over the processes."""
    chunk = rows.size
    block = chunk // len(devs)
    mesh = Mesh(np.array(devs), (AXIS,))
    split = NamedSharding(mesh, PartitionSpec(AXIS))
    groups = {d: [] for d in mine}
    dispatched = []  # (group, its first row) in dispatch order
    for g in range(0, block, width):
        for d in mine:
            lo = devs.index(d) * block + g
            groups[d].append(run_group[d](*group_args(rows[lo : lo + width], d)))  # async
            dispatched.append((groups[d][-1], int(rows[0]) + lo))
    if report is not None:  # groups finish roughly in dispatch order: wait for each
        for group, row in dispatched:
            jax.block_until_ready(group)
            report("running", min(row + width, instances), instances)
    outs = [_stack_groups(gs, d) for d, gs in groups.items()]
    out = jax.tree.map(
        lambda *shards: jax.make_array_from_single_device_arrays(
            (chunk, *shards[0].shape[1:]), split, list(shards)
        ),
        *outs,
    )
    return jax.tree.map(_host, out)


def _stack_groups(groups: list[PyTree], device: jax.Device) -> PyTree:
    """One device's groups as one block, through the host: outputs are small, and a compiled
    concatenation would be compiled anew for every number of groups."""
    if len(groups) == 1:
        return groups[0]
    return jax.tree.map(
        lambda *parts: jax.device_put(np.concatenate([np.asarray(p) for p in parts]), device),
        *groups,
    )


def _reporter(progress: bool | Progress, instances: int) -> Progress | None:
    """The progress callback: the one given, a tqdm bar of instances (``True``), or none."""
    if callable(progress):
        return progress
    if not progress:
        return None
    from tqdm import tqdm

    bar = tqdm(total=instances, unit="instance", desc="compiling", disable=None)

    def report(phase: str, done: int, total: int) -> None:
        bar.set_description_str(phase)
        bar.update(done - bar.n)
        if phase == "done":
            bar.close()

    return report
