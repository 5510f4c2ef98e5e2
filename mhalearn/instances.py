"""How the arrays of a spec are shared across instances: :class:`PerInstance` (instance i
sees slice i of a leading instance axis) and :class:`Shared` (every instance sees them whole).
:func:`~mhalearn.simulate.split_sweep` reads these wrappers; inside one instance's computation
:func:`unwrap` removes them."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree


class PerInstance(eqx.Module):
    """Arrays that differ per instance: every array leaf of ``value`` has a leading axis of
    length ``instances``, and instance i sees slice i (``value`` is a PyTree: the user's own
    data, a stack of start points, ...). Inside the instance's computation the wrapper holds
    that instance's slice."""

    value: Any


class Shared(eqx.Module):
    """Arrays every instance sees whole (of any shape), except the parts of ``value`` wrapped
    in :class:`PerInstance`."""

    value: Any


def is_per_instance(node: Any) -> bool:
    """Whether ``node`` is a :class:`PerInstance` (an ``is_leaf`` for tree maps)."""
    return isinstance(node, PerInstance)


def _wrapper(node: Any) -> bool:
    return isinstance(node, PerInstance | Shared)


def unwrap(tree: PyTree) -> PyTree:
    """``tree`` with every :class:`PerInstance` and :class:`Shared` replaced by the value it
    holds."""
    return jax.tree.map(lambda v: unwrap(v.value) if _wrapper(v) else v, tree, is_leaf=_wrapper)
