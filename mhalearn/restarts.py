"""Random starts as rounds over instances: a new start only where no start has fitted yet.

Inside one learner, a loop over starts runs under ``vmap`` as many starts as the worst instance
of its group needs, for every instance of the group. Here each start is a round of
:func:`~mhalearn.simulate.simulate` over the instances that are still unfitted, so the cost
follows the failures: where most teachers fit from their first start, the later rounds are
small.

Start 0 of instance ``i`` fits from its learner key ``fit_key_i``, start ``r`` ≥ 1 from
``fold_in(fit_key_i, r)`` (one start of the learner: its own ``restarts``, if it has any, set
to 1), so that one start is the learner's own fit. Of the starts an instance ran, the
one with the lowest final training loss is kept (NaN ranks last; ties keep the earlier start),
and an instance stops once a start *fits* (its status ``converged``: the learner's own test,
e.g. variable projection's reduced cost ``<= tol``·mean(Y²)). The starts are nested: the
result after ``s`` starts is the same whatever larger number of starts is asked for, so one
run gives every rung of a budget ladder (:func:`simulate_starts` with several ``starts``).
Results are per instance, independent of chunk size and device count, as
:func:`~mhalearn.simulate.simulate`'s are.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from mhalearn.batch import Engine
from mhalearn.learners.base import Fit, Learner, Monitor
from mhalearn.simulate import Results, simulate, split_sweep
from mhalearn.tasks import Task


class OneStart(eqx.Module):
    """Start ``index`` of ``learner``: its fit from its key for start 0, from
    ``fold_in(key, index)`` for a later one. The index is an array leaf, so every round runs
    the same compiled program."""

    learner: Any
    index: Int[Array, ""]

    def __check_init__(self):
        if not isinstance(self.learner, Learner):
            raise ValueError(f"OneStart: expected a learner, received {type(self.learner)}")

    @property
    def problems(self) -> tuple[type, ...]:
        """The wrapped learner's problem classes."""
        return self.learner.problems

    def fit(self, key: PRNGKeyArray, problem: Any, monitor: Monitor | None = None) -> Fit:
        """The wrapped learner's fit from its start ``index``: from ``key`` itself for start 0
        (the learner's own fit), from ``fold_in(key, index)`` after."""
        data = jax.random.key_data(key)
        later = jax.random.key_data(jax.random.fold_in(key, self.index))
        start = jax.random.wrap_key_data(
            jnp.where(self.index == 0, data, later), impl=jax.random.key_impl(key)
        )
        return self.learner.fit(start, problem, monitor)


def default_starts(learner: Learner) -> int:
    """The random starts a learner draws by default: its ``restarts``, else one."""
    return int(getattr(learner, "restarts", 1))


def single_start(learner: Learner) -> Learner:
    """``learner`` drawing one start per fit (its ``restarts`` set to 1, where it has them)."""
    if hasattr(learner, "restarts"):
        return dataclasses.replace(learner, restarts=1)
    return learner


def final_loss(res: Results) -> np.ndarray:
    """Each instance's final training loss (the last entry of its trace), NaN as +inf."""
    loss = np.asarray(res.trace["loss"])[:, -1]
    return np.where(np.isnan(loss), np.inf, loss)


def simulate_starts(
    key: PRNGKeyArray,
    task: Task,
    learner: Learner,
    instances: int,
    starts: int | Sequence[int],
    *,
    key_ids: np.ndarray | Sequence[int] | None = None,
    keep_params: bool = False,
    engine: Engine | None = None,
    **options: Any,
) -> list[Results]:
    """:func:`~mhalearn.simulate.simulate` with up to ``max(starts)`` random starts per
    instance, run as rounds over the instances no start has fitted yet.

    Args:
        key: the root key (as for :func:`~mhalearn.simulate.simulate`).
        task: what to draw and how to score it.
        learner: the learner of one start (its own ``restarts`` are set to 1).
        instances: how many instances (≥ 1).
        starts: the budgets, in starts (increasing, each ≥ 1): the results after each.
        key_ids: each instance's key index (default ``0 .. instances−1``).
        keep_params: also return the fitted parameters.
        engine: how the instances run (:class:`~mhalearn.batch.Engine`); later rounds keep
            the first round's vector width.
        **options: fields of the engine, replacing its own.

    Returns:
        One :class:`~mhalearn.simulate.Results` per entry of ``starts``: each instance's kept
        start after that many starts, with ``metrics["info_starts"]``, the starts it ran.

    Raises:
        ValueError: ``starts`` empty, not increasing or below 1.
    """
    ladder = [int(s) for s in np.atleast_1d(starts)]
    if not ladder or ladder[0] < 1 or any(b <= a for a, b in itertools.pairwise(ladder)):
        raise ValueError(f"starts: expected increasing integers ≥ 1, received {starts}")
    engine = Engine.given(engine, **options)
    key_ids = np.arange(instances) if key_ids is None else np.asarray(key_ids)
    # the numbers swept over instances, to hand each round its instances' entries
    swept, fixed = split_sweep({"task": task, "learner": single_start(learner)}, instances)
    best: Results | None = None
    ran = np.zeros(instances, np.int64)
    seconds = {"compile_seconds": 0.0, "run_seconds": 0.0}
    out = []
    for r in range(ladder[-1]):
        pending = np.arange(instances) if best is None else np.flatnonzero(~_fitted(best))
        if pending.size:
            pick = jax.tree.map(lambda a, idx=pending: np.asarray(a)[idx], swept)
            spec = eqx.combine(pick, fixed)
            res = simulate(
                key,
                spec["task"],
                OneStart(spec["learner"], np.asarray(r, np.int32)),
                pending.size,
                key_ids=key_ids[pending],
                keep_params=keep_params,
                engine=engine,
            )
            # later rounds keep the first round's width: the same compiled program, where a
            # width fitted to fewer instances would compile another
            if engine.vector_width is None:
                engine = dataclasses.replace(engine, vector_width=res.attrs.get("vector_width"))
            for name in seconds:
                seconds[name] += float(res.attrs.get(name, 0.0))
            ran[pending] += 1
            best = res if best is None else _keep_better(best, res, pending)
        if r + 1 in ladder:
            out.append(_with_starts(best, ran, seconds))
    return out


def _fitted(res: Results) -> np.ndarray:
    return np.asarray(res.status["converged"], bool)


def _keep_better(best: Results, new: Results, rows: np.ndarray) -> Results:
    """``best`` with the instances at ``rows`` replaced by ``new``'s where its final loss is
    strictly lower (the rows ran their next start; NaN ranks last)."""
    better = final_loss(new) < final_loss(best)[rows]
    take = rows[better]

    def merge(old, fresh):
        if old is None:
            return None
        merged = np.array(old, copy=True)
        merged[take] = np.asarray(fresh)[better]
        return merged

    def merge_dict(old: dict, fresh: dict) -> dict:
        return {k: merge(v, fresh[k]) for k, v in old.items()}

    return Results(
        metrics=merge_dict(best.metrics, new.metrics),
        status=merge_dict(best.status, new.status),
        trace_steps=best.trace_steps,
        trace=merge_dict(best.trace, new.trace),
        sweep=best.sweep,
        key_ids=best.key_ids,
        attrs=best.attrs,
        params=None if best.params is None else jax.tree.map(merge, best.params, new.params),
    )


def _with_starts(res: Results, ran: np.ndarray, seconds: dict[str, float]) -> Results:
    """A copy of ``res`` whose ``info_starts`` counts the starts each instance ran, and whose
    compile and run times are those of every round so far."""
    metrics = {**res.metrics, "info_starts": ran.astype(np.float64)}
    return Results(**{**vars(res), "metrics": metrics, "attrs": {**res.attrs, **seconds}})
