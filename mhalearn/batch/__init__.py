"""THE place that maps a per-instance function over many instances, by concern:
:mod:`~mhalearn.batch.devices` (which devices, how wide a group, compiler options, process
settings, provenance), :mod:`~mhalearn.batch.programs` (the group program and the cache of
compiled programs), :mod:`~mhalearn.batch.scheduler` (groups onto devices, progress) and
:mod:`~mhalearn.batch.mapping` (:func:`map_instances` and its options, :class:`Engine`).

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

from mhalearn.batch.devices import (
    AXIS,
    CPU_GROUP,
    MEMORY_SHARE,
    compiler_options,
    default_vector_width,
    enable_compilation_cache,
    fitted_width,
    provenance,
    select_devices,
    set_precision,
    split_cpu,
)
from mhalearn.batch.mapping import Engine, map_instances
from mhalearn.batch.programs import MATMUL_PRECISION, clear_programs
from mhalearn.batch.scheduler import Progress

__all__ = [
    "AXIS",
    "CPU_GROUP",
    "MATMUL_PRECISION",
    "MEMORY_SHARE",
    "Engine",
    "Progress",
    "clear_programs",
    "compiler_options",
    "default_vector_width",
    "enable_compilation_cache",
    "fitted_width",
    "map_instances",
    "provenance",
    "select_devices",
    "set_precision",
    "split_cpu",
]
