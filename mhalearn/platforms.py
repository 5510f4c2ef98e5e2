"""The platform a program is traced for, which a few choices of form are made by.

Some computations take a form that suits a platform: the teachers' first draws made side by
side on an accelerator (:func:`~mhalearn.teachers.default_candidates`), the fused Pallas
kernel for a GPU's full-batch gradients (:func:`~mhalearn.fused.fused_form`), the chunks of
variable projection's Gauss–Newton sums (``mhalearn.learners.reduced.CHUNK_ROWS``). They are
chosen when the program is traced, by :func:`platform`: ``jax.default_backend()``, unless the
program is being traced for a device of another platform, as the engine says while it lowers
a group program for a device (:func:`tracing_for`). So a program the engine places on the host
CPU of a GPU machine takes the CPU's forms (without this it took the GPU's: four draws side
by side where one would do, and, once the fused kernel is on, that kernel in Pallas'
interpret mode).

A program may also be lowered for a GPU the machine lacks (``jax.export`` for ``"cuda"``, or a
compile-only device of JAX's CUDA plugin). Pallas' Triton lowering, which the fused kernel
takes, reads the GPU's compute capability from a device: from JAX 0.11 on it refuses to lower
without one, unless an abstract GPU is named (:func:`lowering_for_gpu`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

#: the GPU named by :func:`lowering_for_gpu` unless told otherwise, as JAX reports its kind
H100 = "NVIDIA H100 80GB HBM3"

_TRACING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mhalearn_tracing_for", default=None
)


def platform() -> str:
    """The platform (``"cpu"``, ``"gpu"``, ``"tpu"``) of the program being traced: the one
    :func:`tracing_for` names, else ``jax.default_backend()``."""
    return _TRACING_FOR.get() or jax.default_backend()


@contextlib.contextmanager
def tracing_for(name: str | None) -> Iterator[None]:
    """Within the block, :func:`platform` is ``name`` (a device's ``platform``; ``None``: JAX's
    default backend)."""
    token = _TRACING_FOR.set(name)
    try:
        yield
    finally:
        _TRACING_FOR.reset(token)


@contextlib.contextmanager
def lowering_for_gpu(kind: str = H100) -> Iterator[None]:
    """Within the block, Pallas' Triton lowering targets a GPU of ``kind`` (a device kind as
    JAX reports it, e.g. a compile-only device's ``device_kind``) on a machine without a GPU.

    JAX from 0.11 takes the kind from the abstract mesh in use; an empty one carries it, so
    that no sharding changes. Earlier JAX lowered without it, and a machine with a GPU reads
    its own."""
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        yield
