"""The learner contract: ``learner.fit(key, problem, monitor=None) -> Fit``.

A learner is a config (an equinox Module: structure static, numbers leaves that can be swept)
with one method, :meth:`Learner.fit`. It fits one instance's problem from its own key and
reports only what it knows without the truth: its parameters, its training trace, its status,
its own diagnostics (``info``) and its estimates of the truth's quantities (``estimates``, e.g.
a ΣW estimate), which the task scores against the truth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree


class Trace(eqx.Module):
    """A fit's training curve at its logged steps (log-spaced or every k steps, bounded)."""

    steps: Int[Array, " snapshots"]
    """The step (or iteration) of each snapshot; 0 is the start."""
    loss: Float[Array, " snapshots"]
    """The full training loss at each snapshot."""
    metrics: dict[str, Float[Array, " snapshots"]]
    """The monitor's metrics at each snapshot (NaN where not evaluated)."""


class Status(eqx.Module):
    """How a fit ended."""

    diverged: Bool[Array, ""]
    """The loss or an update turned non-finite; the instance was frozen there."""
    diverged_at: Int[Array, ""]
    """The step whose update was not finite; -1 if none."""
    converged: Bool[Array, ""]
    """Stopped early at the learner's tolerance."""
    steps_taken: Int[Array, ""]
    """Updates (or iterations) done."""


class Fit(eqx.Module):
    """What a learner returns for one instance: only what it knows without the truth."""

    params: PyTree
    """The fitted parameters (a :class:`~mhalearn.params.LayerParams` or
    :class:`~mhalearn.params.ClassifierParams`)."""
    trace: Trace
    """The training curve at the logged steps."""
    status: Status
    """How the fit ended."""
    info: dict[str, Array] = eqx.field(default_factory=dict)
    """The learner's own diagnostics (reported as ``info_*`` variables)."""
    estimates: dict[str, Array] = eqx.field(default_factory=dict)
    """The learner's estimates of quantities of the truth (a ΣW estimate, a span), which the
    task scores against the truth (:mod:`mhalearn.metrics`)."""


def nan_last(cost: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
    """A cost to rank candidates by: NaN ranks after every number (``jnp.argmin`` alone
    picks a NaN)."""
    return jnp.where(jnp.isnan(cost), jnp.inf, cost)


Monitor = Callable[[PyTree], dict[str, Array]]
"""``monitor(params) -> {name: scalar}``: metrics a learner records at its trace's
snapshots."""


@runtime_checkable
class Learner(Protocol):
    """What every learner is: a config with ``fit``, and the problem types it can fit."""

    #: the problem classes (:mod:`mhalearn.problems`) this learner fits
    problems: ClassVar[tuple[type, ...]]

    def fit(self, key: PRNGKeyArray, problem: Any, monitor: Monitor | None = None) -> Fit:
        """Fit ``problem``'s student from randomness ``key``; ``monitor`` adds metrics to the
        trace (evaluated at the snapshots only)."""
        ...


def fit_from_history(
    params: PyTree,
    history: Float[Array, " iterations"],
    converged: Bool[Array, ""],
    iterations: Int[Array, ""],
    monitor: Monitor | None = None,
    info: dict[str, Array] | None = None,
    estimates: dict[str, Array] | None = None,
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
    return Fit(
        params=params, trace=trace, status=status, info=info or {}, estimates=estimates or {}
    )
