"""The engine's compiled programs: the group program (one device's unit of work, a loop or a
vmap of the instance function), its outputs packed into one array of bytes, and the cache of
compiled programs this process keeps (:func:`clear_programs`), with a CPU device's binary
relocated to the others instead of compiled again."""

from __future__ import annotations

import collections
import io
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from mhalearn import fused, teachers
from mhalearn.learners import reduced
from mhalearn.platforms import tracing_for

#: the matrix-product precision instance programs are traced at, unless
#: ``jax_default_matmul_precision`` is set
MATMUL_PRECISION = "highest"


def program_bytes(compiled: Any) -> float | None:
    """Device memory a compiled program uses (arguments, outputs, temporaries), if known."""
    try:
        m = compiled.memory_analysis()
        return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
    except (AttributeError, NotImplementedError, jax.errors.JaxRuntimeError):
        return None


#: persistent-cache hits seen by this process (a program read from JAX's persistent cache
#: cannot be serialized again whole on CPU: it is never relocated, see :func:`relocated`)
_CACHE_HITS = [0]


def _count_cache_hit(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _CACHE_HITS[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


class Layout(NamedTuple):
    """Where each output of a group lies in its packed bytes (:func:`packed`): the outputs'
    tree, and per leaf its byte columns, per-instance shape and dtype."""

    treedef: Any
    fields: tuple[tuple[int, int, tuple[int, ...], np.dtype], ...]


class Program(NamedTuple):
    compiled: Any
    #: compiled in this process (not read from the persistent cache): it can be relocated
    relocatable: bool
    #: how its packed output unpacks (None: not packed)
    layout: Layout | None = None


def lower(fn: Callable, args: tuple, platform: str | None = None) -> Any:
    """``jit(fn)`` lowered for ``args``, its matrix products at :data:`MATMUL_PRECISION` unless
    the user configured JAX's default precision, traced for ``platform`` (the device's that
    will run it: the forms chosen by platform, :mod:`mhalearn.platforms`; ``None``: JAX's
    default backend)."""
    precision = jax.config.jax_default_matmul_precision or MATMUL_PRECISION
    with jax.default_matmul_precision(precision), tracing_for(platform):
        return jax.jit(fn).lower(*args)


def compile_program(fn: Callable, args: tuple, options: dict, platform: str) -> Program:
    hits = _CACHE_HITS[0]
    lowered = lower(fn, args, platform)
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
    return Program(compiled, _CACHE_HITS[0] == hits)


#: compiled group programs of this process, by everything that determines them (the function,
#: the static part of ``shared``, the argument shapes, the width, the options, the device): a
#: repeated call with the same structure — another seed, other swept numbers, another cell of
#: the same shapes — runs without compiling. The oldest are dropped beyond _KEPT.
_PROGRAMS: collections.OrderedDict[Any, Program] = collections.OrderedDict()
_KEPT = 32


def clear_programs() -> None:
    """Forget the compiled programs this process keeps (their memory is freed; the next call
    of every structure compiles again)."""
    _PROGRAMS.clear()


def program_key(fn, shared_static, key_kind, width, args, options, device) -> Any:
    """A hashable description of the program, or None when a static part is not hashable."""
    static_leaves, static_def = jax.tree.flatten(shared_static)
    arg_leaves, arg_def = jax.tree.flatten(args)
    shapes = tuple((np.shape(a), str(a.dtype)) for a in arg_leaves)
    key = (fn, static_def, tuple(static_leaves), key_kind, width, arg_def, shapes)
    key += (tuple(sorted(options.items())), device.platform, device.id)
    key += (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
    # read when a program is traced: the fused kernel's settings and the forms per platform
    key += fused.settings()
    key += (tuple(sorted(teachers.CANDIDATES.items())), tuple(sorted(reduced.CHUNK_ROWS.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def relocated(program: Program, device: jax.Device) -> Program | None:
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
    return Program(compiled, False)


class Cached(NamedTuple):
    """A compiled program and how it was had (``"kept"``, ``"compiled"``, ``"relocated"``)."""

    program: Program
    how: str


def cached_compile(
    program_key, program: Callable, args: tuple, options: dict, device: jax.Device, like=None
) -> Cached:
    """The compiled program, kept by ``program_key``, and how it was had: ``"kept"`` (from an
    earlier call), ``"compiled"``, or ``"relocated"`` from ``like``, the same program compiled
    for another CPU device (:func:`relocated`), which is tried before compiling."""
    if program_key is not None and program_key in _PROGRAMS:
        _PROGRAMS.move_to_end(program_key)
        return Cached(_PROGRAMS[program_key], "kept")
    moved = None if like is None else relocated(like, device)
    if moved is None:
        built, how = compile_program(program, args, options, device.platform), "compiled"
        built = built._replace(layout=program.layout)  # set by the tracing
    else:
        built, how = moved._replace(layout=like.layout), "relocated"
    if program_key is not None:
        _PROGRAMS[program_key] = built
        while len(_PROGRAMS) > _KEPT:
            _PROGRAMS.popitem(last=False)
    return Cached(built, how)


def group_program(
    fn: Callable, shared_static: PyTree, rebuild_key: Callable, width: int, looped: bool
):
    """The compiled unit: ``fn`` on one group of ``width`` instances, on one device — vmapped,
    or, ``looped``, one instance after another in a loop of the unbatched program (the CPU's
    way: its numbers are those of width 1, bit for bit, and no batched LAPACK call is made;
    see :func:`~mhalearn.batch.mapping.map_instances`)."""

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
        flat, instance_group.layout = packed(out, width)
        return flat

    instance_group.layout = None  # set when traced
    return instance_group


def packed(out: PyTree, width: int) -> tuple[PyTree, Layout | None]:
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
    return jnp.concatenate(parts, axis=1), Layout(treedef, tuple(fields))


def unpacked(out: PyTree, layout: Layout | None) -> PyTree:
    """A chunk's outputs, on the host, from their packed bytes (:func:`packed`)."""
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
