"""What every learner returns: ``fit(key, problem, config) -> Fit``."""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PyTree


class Trace(eqx.Module):
    steps: Int[Array, " snapshots"]
    loss: Float[Array, " snapshots"]  # full training loss at each snapshot
    metrics: dict[str, Float[Array, " snapshots"]]


class Status(eqx.Module):
    diverged: Bool[Array, ""]
    diverged_at: Int[Array, ""]  # step whose update was not finite; -1 if none
    converged: Bool[Array, ""]  # stopped early at the tolerance
    steps_taken: Int[Array, ""]  # updates (or iterations) done


class Fit(eqx.Module):
    params: PyTree
    trace: Trace
    status: Status
    info: dict[str, Array] = eqx.field(default_factory=dict)  # learner-specific diagnostics


def fit_from_history(
    params: PyTree,
    history: Float[Array, " iterations"],
    converged: Bool[Array, ""],
    iterations: Int[Array, ""],
    monitor: Callable[[PyTree], dict] | None = None,
    info: dict[str, Array] | None = None,
) -> Fit:
    """A Fit for an iterative solver whose loss is known after every iteration (entry 0: the
    start). Monitored metrics are evaluated on the final parameters only: NaN before."""
    n = history.shape[0]
    metrics = {
        k: jnp.full(n, jnp.nan, history.dtype).at[-1].set(v)
        for k, v in (monitor(params) if monitor else {}).items()
    }
    trace = Trace(steps=jnp.asarray(np.arange(n)), loss=history, metrics=metrics)
    status = Status(
        diverged=~jnp.isfinite(history[-1]),
        diverged_at=jnp.asarray(-1),
        converged=converged,
        steps_taken=jnp.asarray(iterations),
    )
    return Fit(params=params, trace=trace, status=status, info=info or {})
