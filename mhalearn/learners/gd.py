"""Gradient-based learners: any optax optimiser inside ``lax`` loops, full batch or minibatch.

``fit(key, problem, config, monitor=None) -> Fit`` fits one instance; each step takes the
loss and gradient from ``problem.loss_and_grad`` (for the Chen–Li layer, the hand-derived
kernel of :mod:`mhalearn.fused`). Batch over instances with ``jax.vmap`` or, better,
:func:`mhalearn.batch.map_instances`.

- Per-instance numbers (``lr``, ``momentum``, ``tol``) are PyTree leaves of :class:`GDConfig`,
  so a sweep over them is one compilation.
- The trace is recorded at a fixed set of snapshot steps (log-spaced by default, or every
  ``log_every`` steps): its size depends on the number of snapshots, not on ``steps``.
  ``monitor(params) -> dict`` adds chosen metrics, evaluated at the snapshots only.
- A step whose loss or new parameters are not finite freezes the instance at its last finite
  parameters and flags it (``diverged``, ``diverged_at``); trace entries after that are NaN.
  Other instances are untouched.
- With ``tol > 0`` an instance stops (``converged``) once the loss its optimiser sees is
  ``<= tol``; a chunk of instances stops computing when all of its instances have stopped.
- ``Fit.info`` holds ``loss_sum`` (Σ_t of the loss seen at every applied update: the stability
  proxy is lr/samples times it) and the movement ‖θ_T − θ₀‖ of every parameter field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from mhalearn._validate import choice, in_range, positive_int
from mhalearn.learners.base import Fit, Status, Trace
from mhalearn.metrics.theory import movement

OptimizerName = Literal["gd", "momentum", "adam", "normalized_gd"]
OPTIMIZERS = ("gd", "momentum", "adam", "normalized_gd")


class GDConfig(eqx.Module):
    """Gradient-based fitting.

    ``optimizer``: ``"gd"`` (plain gradient descent), ``"momentum"`` (heavy ball with
    ``momentum``), ``"adam"``, ``"normalized_gd"`` (steps of length ``lr`` along −∇/‖∇‖), or
    any optax factory taking the learning rate first (for example ``optax.lion``).
    ``batch_size=None`` is full batch; otherwise each step draws ``batch_size`` samples without
    replacement. ``snapshots`` log-spaced steps (0 and ``steps`` included) are traced, or
    every ``log_every`` steps when it is set.
    """

    optimizer: OptimizerName | Callable[..., optax.GradientTransformation] = eqx.field(
        static=True, default="adam"
    )
    steps: int = eqx.field(static=True, default=1000)
    batch_size: int | None = eqx.field(static=True, default=None)
    snapshots: int = eqx.field(static=True, default=40)
    log_every: int | None = eqx.field(static=True, default=None)
    lr: float | Array = 1e-2
    momentum: float | Array = 0.9
    tol: float | Array = 0.0

    def __check_init__(self):
        if not callable(self.optimizer):
            choice("optimizer", self.optimizer, OPTIMIZERS)
        positive_int("steps", self.steps)
        positive_int("snapshots", self.snapshots)
        if self.batch_size is not None:
            positive_int("batch_size", self.batch_size)
        if self.log_every is not None:
            positive_int("log_every", self.log_every)
        in_range("lr", self.lr, 0.0, open_low=True)
        in_range("momentum", self.momentum, 0.0, 1.0)
        in_range("tol", self.tol, 0.0)

    def fit(self, key: PRNGKeyArray, problem, monitor=None) -> Fit:
        return fit(key, problem, self, monitor)

    def snapshot_steps(self) -> np.ndarray:
        """The steps at which the trace records (0 = the start, ``steps`` = the end)."""
        if self.log_every is not None:
            steps = np.arange(0, self.steps + 1, self.log_every)
        else:
            steps = np.geomspace(1, self.steps, max(self.snapshots - 1, 1)).round()
        return np.unique(np.concatenate([[0], steps, [self.steps]]).astype(np.int64))


def gd_keys(key: PRNGKeyArray) -> tuple[PRNGKeyArray, PRNGKeyArray]:
    """The keys of the start (``problem.init``) and of the minibatches, from a fit's key."""
    k_init, k_batch = jax.random.split(key)
    return k_init, k_batch


def make_optimizer(config: GDConfig) -> optax.GradientTransformation:
    lr = config.lr
    if callable(config.optimizer):
        return config.optimizer(lr)
    if config.optimizer == "gd":
        return optax.sgd(lr)
    if config.optimizer == "momentum":
        return optax.sgd(lr, momentum=config.momentum)
    if config.optimizer == "adam":
        return optax.adam(lr)
    return optax.chain(
        optax.normalize_by_update_norm(scale_factor=1.0), optax.scale_by_learning_rate(lr)
    )


def _select(cond: Bool[Array, ""], new: PyTree, old: PyTree) -> PyTree:
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def _all_finite(tree: PyTree) -> Bool[Array, ""]:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


def fit(
    key: PRNGKeyArray,
    problem,
    config: GDConfig,
    monitor: Callable[[Any], dict[str, Float[Array, ""]]] | None = None,
) -> Fit:
    """Fit ``problem``'s student from ``problem.init(key)`` with ``config``'s optimiser."""
    if config.batch_size is not None and config.batch_size > problem.samples:
        raise ValueError(
            f"batch_size must be <= samples ({problem.samples}), received {config.batch_size}"
        )
    k_init, k_batch = gd_keys(key)
    opt = make_optimizer(config)
    params = problem.init(k_init)
    snap_steps = config.snapshot_steps()
    lengths = np.diff(snap_steps, prepend=0)

    def minibatch(t):
        if config.batch_size is None:
            return None
        k = jax.random.fold_in(k_batch, t)
        return jax.random.choice(k, problem.samples, (config.batch_size,), replace=False)

    def step(carry):
        i, params, opt_state, status, t, loss_sum, first = carry
        loss, grads = problem.loss_and_grad(params, minibatch(t))
        updates, new_state = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(loss) & _all_finite(new_params)
        done = loss <= config.tol
        update = finite & ~done
        status = Status(
            diverged=~finite,
            diverged_at=jnp.where(finite, status.diverged_at, t),
            converged=finite & done,
            steps_taken=status.steps_taken + update.astype(status.steps_taken.dtype),
        )
        params = _select(update, new_params, params)
        opt_state = _select(update, new_state, opt_state)
        loss_sum = loss_sum + jnp.where(update, loss, 0.0)
        first = jnp.where(i == 0, loss, first)  # the loss at the interval's start
        return i + 1, params, opt_state, status, t + 1, loss_sum, first

    def running(status: Status) -> Bool[Array, ""]:
        return ~status.diverged & ~status.converged

    def snapshot(params, status: Status, loss: Float[Array, ""]) -> dict:
        record = {"loss": loss, **(monitor(params) if monitor else {})}
        return jax.tree.map(lambda v: jnp.where(status.diverged, jnp.nan, v), record)

    def interval(carry, n):
        """``n`` steps, and the snapshot at their start: its full training loss is the one
        the first full-batch step computes, so no separate forward pass is spent on it."""
        params, opt_state, status, t, loss_sum = carry
        at_start, start_status = params, status
        taken, params, opt_state, status, t, loss_sum, first = jax.lax.while_loop(
            lambda c: (c[0] < n) & running(c[3]),
            step,
            (
                jnp.asarray(0),
                params,
                opt_state,
                status,
                t,
                loss_sum,
                jnp.full((), jnp.nan, zero.dtype),
            ),
        )
        if config.batch_size is None:
            loss = jax.lax.cond(taken > 0, lambda: first, lambda: problem.loss(at_start))
        else:  # a step saw a minibatch; the trace holds the full training loss
            loss = problem.loss(at_start)
        return (params, opt_state, status, t, loss_sum), snapshot(at_start, start_status, loss)

    status = Status(
        diverged=jnp.asarray(False),
        diverged_at=jnp.asarray(-1),
        converged=jnp.asarray(False),
        steps_taken=jnp.asarray(0),
    )
    start = params
    zero = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
    (params, _, status, _, loss_sum), records = jax.lax.scan(
        interval,
        (params, opt.init(params), status, jnp.asarray(0), zero),
        jnp.asarray(lengths[1:]),  # lengths[0] = 0: snapshot 0 is the start
    )
    final = snapshot(params, status, problem.loss(params))
    records = jax.tree.map(lambda r, f: jnp.concatenate([r, f[None]]), records, final)
    loss = records.pop("loss")
    trace = Trace(steps=jnp.asarray(snap_steps), loss=loss, metrics=records)
    info = {"loss_sum": loss_sum, **movement(params, start)}
    return Fit(params=params, trace=trace, status=status, info=info)
