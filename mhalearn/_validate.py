"""Checks at the public boundary: shapes, sizes and choices, raised as ``ValueError``.

Every check runs on static information (shapes, Python values), so it works the same
eagerly, under ``jit`` and inside ``vmap`` (where the instance axis is already stripped).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np


def _describe(axes: list[str], sizes: dict[str, int]) -> str:
    names = ", ".join(axes)
    values = ", ".join(str(sizes.get(a, a if a.isdigit() else "?")) for a in axes)
    return f"({names}) = ({values})"


def check_shapes(*items: tuple[str, object, str], **known: int) -> dict[str, int]:
    """Check arrays against named axes and bind the axis sizes.

    Each item is ``(name, array, "axis axis ...")``; an axis written as digits must
    have exactly that size, a named axis must have the same size wherever it appears.
    ``known`` pre-binds sizes (for example ``dim=spec.dim``). Every size must be >= 1.

    Returns the bound sizes. Raises ``ValueError`` naming the array, the expected and
    the received shape.
    """
    sizes = dict(known)
    for name, array, spec in items:
        axes = spec.split()
        shape = tuple(np.shape(array))
        if len(shape) != len(axes):
            raise ValueError(
                f"{name}: expected shape {_describe(axes, sizes)} (rank {len(axes)}), "
                f"received shape {shape} (rank {len(shape)})"
            )
        for axis, n in zip(axes, shape, strict=True):
            expected = int(axis) if axis.isdigit() else sizes.get(axis)
            if n < 1 or (expected is not None and expected != n):
                described = _describe(axes, sizes)
                why = "every axis must have size >= 1; " if n < 1 else ""
                raise ValueError(f"{name}: {why}expected shape {described}, received {shape}")
            if not axis.isdigit():
                sizes[axis] = n
    return sizes


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int, or raise if it is not an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, received {value!r}")
    return int(value)


def positive_shape(name: str, shape: Iterable[int]) -> tuple[int, ...]:
    """A shape argument: a tuple of integers >= 1."""
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"{name}: every size must be an integer >= 1, received {shape}")
    return tuple(int(n) for n in shape)


def choice(name: str, value: object, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, received {value!r}")


def in_range(
    name: str, value: object, low: float, high: float = float("inf"), *, open_low: bool = False
) -> None:
    """Check a number lies in ``[low, high]`` (``(low, high]`` with ``open_low``).

    Arrays and tracers are let through: a swept value is checked by the caller that
    knows its concrete values, not at trace time.
    """
    if not isinstance(value, numbers.Real):
        return
    bad = value <= low if open_low else value < low
    if bad or value > high or not math.isfinite(value):
        left = "(" if open_low else "["
        right = ")" if high == float("inf") else "]"
        raise ValueError(
            f"{name} must lie in {left}{low}, {high}{right} (a finite number), received {value!r}"
        )


def arrays(**named: object) -> tuple:
    """Each argument as a JAX array (lists and other array-likes accepted; arrays and tracers
    pass through), in the order given; ``ValueError`` naming the argument when one is not an
    array of numbers (strings, ragged lists, None, ...)."""
    import jax
    import jax.numpy as jnp

    out = []
    for name, value in named.items():
        if isinstance(value, jax.Array):
            out.append(value)
            continue
        try:
            host = np.asarray(value)
        except (TypeError, ValueError) as err:  # ragged nested lists
            raise ValueError(f"{name}: expected an array of numbers, received {err}") from None
        if not (np.issubdtype(host.dtype, np.number) or host.dtype == bool):
            raise ValueError(
                f"{name}: expected an array of numbers, received {type(value).__name__} "
                f"of dtype {host.dtype}"
            )
        out.append(jnp.asarray(host))
    return tuple(out)


def study_fields(
    values: dict[str, object],
    positive: Iterable[str] = (),
    counts_from_zero: Iterable[str] = (),
) -> None:
    """A study's fields, checked before any work: grids (tuples) non-empty and distinct,
    integers (sizes, counts) >= 1 except ``seed`` and the fields in ``counts_from_zero``
    (>= 0), numbers finite and >= 0 (> 0 for the fields in ``positive``).

    Raises ``ValueError`` naming the field and the value.
    """
    for name, value in values.items():
        if isinstance(value, tuple) and not value:
            raise ValueError(f"{name}: expected at least one value, received none")
        if isinstance(value, tuple) and len(set(value)) != len(value):
            raise ValueError(f"{name}: values must be distinct, received {value}")
        for v in value if isinstance(value, tuple) else (value,):
            if name in ("seed", *counts_from_zero) and isinstance(v, int):
                in_range(name, v, 0)
            elif isinstance(v, int) and not isinstance(v, bool):
                positive_int(name, v)
            elif isinstance(v, float):
                in_range(name, v, 0.0, open_low=name in positive)
