"""The engine's devices and process settings: which devices run instances, how wide a group
is on each, the compiler options and matrix-product precision programs are built with, and
the process-wide switches (:func:`set_precision`, :func:`split_cpu`,
:func:`enable_compilation_cache`); :func:`provenance` records them with every result."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import jax

from mhalearn._validate import choice, positive_int
from mhalearn._version import __version__, source_commit

#: the name of the instances' axis over the devices
AXIS = "instances"


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
    each where it cannot be, see :func:`~mhalearn.batch.programs.relocated`). Results are
    unchanged (every device runs the same single-device program). Call it before JAX first
    uses a device; returns ``count``."""
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


def enable_compilation_cache(folder: str, min_compile_seconds: float = 0.0) -> None:
    """Keep compiled programs in ``folder`` across processes (JAX's persistent compilation
    cache): a second run of the same shapes skips XLA compilation. Programs that compile in
    under ``min_compile_seconds`` are not kept."""
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def default_vector_width(devices: Sequence[jax.Device], per_device: int = 1) -> int:
    """On CPU, where a group is a loop (:func:`~mhalearn.batch.programs.group_program`) and
    its width never changes a result: the largest power of two up to :data:`CPU_GROUP` of
    which every device receives at least four groups (``per_device`` instances), else 1 —
    fewer calls for many tiny problems (64 GD fits at (2, 8, 4, 256) on two devices: 8 per
    call, where it used to be 1, in benchmarks/compare.py), and padding below a quarter of
    the instances. On accelerators the width is fitted to the device's memory and the problem
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


def device_memory(device: jax.Device) -> float | None:
    """The memory a device reports it may use, if it does."""
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
