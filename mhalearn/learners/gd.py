"""Gradient-based learners: any optax optimiser inside ``lax`` loops, full batch or minibatch.

``GDConfig(...).fit(key, problem, monitor=None) -> Fit`` fits one instance; each step takes the
loss and gradient from ``problem.loss_and_grad`` (for the Chen–Li layer, the hand-derived
kernel of :mod:`mhalearn.layer`). Batch over instances with ``jax.vmap`` or, better,
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
from typing import Literal, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from mhalearn._validate import choice, in_range, positive_int
from mhalearn.learners.base import Fit, Monitor, Status, Trace
from mhalearn.learners.registry import register_learner
from mhalearn.params import movement
from mhalearn.problems import ClassificationProblem, RegressionProblem, prepared, start_point

OptimizerName = Literal["gd", "momentum", "adam", "normalized_gd"]
OPTIMIZERS = get_args(OptimizerName)


class GDConfig(eqx.Module):
    """Gradient-based fitting.

    ``optimizer``: ``"gd"`` (plain gradient descent), ``"momentum"`` (heavy ball with
    ``momentum``), ``"adam"``, ``"normalized_gd"`` (steps of length exactly ``lr`` along
    −∇/‖∇‖, however small ‖∇‖ is; ``normalize="joint"`` divides by the norm of the whole
    gradient, ``"field"`` each parameter field's gradient by its own norm, so every field
    moves by ``lr``), or any optax factory taking the learning rate first (for example
    ``optax.lion``). ``trainable`` names the parameter fields that train (e.g. ``("W",)``;
    ``None``: all); the others keep their start exactly and take no part in a joint norm.
    ``batch_size=None`` is full batch; otherwise each step draws ``batch_size`` samples without
    replacement. ``snapshots`` log-spaced steps (0 and ``steps`` included) are traced, or
    every ``log_every`` steps when it is set, or the steps ``trace_at`` (with 0 and ``steps``)
    when they are given. ``check_every``: the steps between two tests of whether any instance
    of a batch still runs (the steps themselves run in fixed-length scans, stopped instances
    masked).
    """

    optimizer: OptimizerName | Callable[..., optax.GradientTransformation] = eqx.field(
        static=True, default="adam"
    )
    steps: int = eqx.field(static=True, default=1000)
    batch_size: int | None = eqx.field(static=True, default=None)
    snapshots: int = eqx.field(static=True, default=40)
    log_every: int | None = eqx.field(static=True, default=None)
    trace_at: tuple[int, ...] | None = eqx.field(
        static=True, default=None, converter=lambda v: None if v is None else tuple(map(int, v))
    )
    normalize: Literal["joint", "field"] = eqx.field(static=True, default="joint")
    trainable: tuple[str, ...] | None = eqx.field(static=True, default=None)
    check_every: int = eqx.field(static=True, default=16)
    lr: float | Array = 1e-2
    momentum: float | Array = 0.9
    tol: float | Array = 0.0

    problems = (RegressionProblem, ClassificationProblem)

    def __check_init__(self):
        if not callable(self.optimizer):
            choice("optimizer", self.optimizer, OPTIMIZERS)
        positive_int("steps", self.steps)
        positive_int("snapshots", self.snapshots)
        positive_int("check_every", self.check_every)
        choice("normalize", self.normalize, ("joint", "field"))
        if self.batch_size is not None:
            positive_int("batch_size", self.batch_size)
        if self.log_every is not None:
            positive_int("log_every", self.log_every)
        if self.trace_at is not None:
            for step in self.trace_at:
                in_range("trace_at", step, 0, self.steps)
        in_range("lr", self.lr, 0.0, open_low=True)
        in_range("momentum", self.momentum, 0.0, 1.0)
        in_range("tol", self.tol, 0.0)

    def fit(self, key: PRNGKeyArray, problem, monitor: Monitor | None = None) -> Fit:
        """Fit ``problem``'s student from :meth:`start` with this config's optimiser."""
        return _fit(key, problem, self, monitor)

    def start(self, key: PRNGKeyArray, problem) -> PyTree:
        """The parameters :meth:`fit` with the same key starts from."""
        return start_point(problem, _split(key)[0])

    def snapshot_steps(self) -> np.ndarray:
        """The steps at which the trace records (0 = the start, ``steps`` = the end)."""
        if self.trace_at is not None:
            steps = np.asarray(self.trace_at)
        elif self.log_every is not None:
            steps = np.arange(0, self.steps + 1, self.log_every)
        else:
            steps = np.geomspace(1, self.steps, max(self.snapshots - 1, 1)).round()
        return np.unique(np.concatenate([[0], steps, [self.steps]]).astype(np.int64))


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
    return optax.chain(unit_updates(config.normalize), optax.scale_by_learning_rate(lr))


def unit_updates(normalize: Literal["joint", "field"] = "joint") -> optax.GradientTransformation:
    """Updates divided by their norm — jointly, or each parameter field (leaf) by its own —
    with only the dtype's smallest normal number as a floor against 0/0, so the step length
    stays exact for gradients of any size (``optax.normalize_by_update_norm`` adds 1e-6 to
    the norm, which shortens every step once ‖∇‖ nears 1e-6)."""

    def divide(g, norm):
        return g / jnp.maximum(norm, jnp.finfo(g.dtype).tiny)

    def update(updates, state, params=None):
        del params
        if normalize == "field":
            return jax.tree.map(lambda g: divide(g, jnp.linalg.norm(g.ravel())), updates), state
        norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(updates)))
        return jax.tree.map(lambda g: divide(g, norm), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _split(key: PRNGKeyArray) -> tuple[PRNGKeyArray, PRNGKeyArray]:
    """A fit's keys: the start's (``problem.init``) and the minibatches'."""
    k_init, k_batch = jax.random.split(key)
    return k_init, k_batch


def _select(cond: Bool[Array, ""], new: PyTree, old: PyTree) -> PyTree:
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def _all_finite(tree: PyTree) -> Bool[Array, ""]:
    # one reduction over every leaf, not one per leaf (a kernel each on a GPU, every step)
    return jnp.all(jnp.isfinite(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])))


class _Carry(eqx.Module):
    """The state of a run between steps."""

    params: PyTree
    opt_state: PyTree
    status: Status
    t: Int[Array, ""]  # updates attempted so far
    loss_sum: Float[Array, ""]  # Σ of the loss seen at every applied update


def _field_of(path) -> str | None:
    """The parameter field (the Module attribute) a leaf's tree path starts with."""
    return getattr(path[0], "name", None)


def _frozen_to_zero(tree: PyTree, trainable: tuple[str, ...] | None) -> PyTree:
    """``tree`` (gradients or updates, shaped like the parameters) with the leaves of every
    field not in ``trainable`` set to zero."""
    if trainable is None:
        return tree

    def keep(path, leaf):
        return leaf if _field_of(path) in trainable else jnp.zeros_like(leaf)

    return jax.tree_util.tree_map_with_path(keep, tree)


def _step(problem, config: GDConfig, opt, k_batch, carry: _Carry) -> tuple[_Carry, Array]:
    """One optimiser step, applied only when its loss and new parameters are finite and the
    loss is above ``tol``; returns the new state and the loss the step saw."""
    idx = None
    if config.batch_size is not None:
        k = jax.random.fold_in(k_batch, carry.t)
        idx = jax.random.choice(k, problem.samples, (config.batch_size,), replace=False)
    loss, grads = problem.loss_and_grad(carry.params, idx)
    grads = _frozen_to_zero(grads, config.trainable)
    updates, new_state = opt.update(grads, carry.opt_state, carry.params)
    updates = _frozen_to_zero(updates, config.trainable)
    new_params = optax.apply_updates(carry.params, updates)
    finite = jnp.isfinite(loss) & _all_finite(new_params)
    done = loss <= config.tol
    update = finite & ~done
    status = Status(
        diverged=~finite,
        diverged_at=jnp.where(finite, carry.status.diverged_at, carry.t),
        converged=finite & done,
        steps_taken=carry.status.steps_taken + update.astype(carry.status.steps_taken.dtype),
    )
    new = _Carry(
        params=_select(update, new_params, carry.params),
        opt_state=_select(update, new_state, carry.opt_state),
        status=status,
        t=carry.t + 1,
        loss_sum=carry.loss_sum + jnp.where(update, loss, 0.0),
    )
    return new, loss


def _running(status: Status) -> Bool[Array, ""]:
    return ~status.diverged & ~status.converged


def _snapshot(monitor, params, status: Status, loss: Float[Array, ""]) -> dict:
    """The trace's record at one snapshot: NaN once the instance has diverged."""
    record = {"loss": loss, **(monitor(params) if monitor else {})}
    return jax.tree.map(lambda v: jnp.where(status.diverged, jnp.nan, v), record)


def _interval(problem, config: GDConfig, opt, k_batch, monitor, carry: _Carry, n):
    """``n`` steps, and the snapshot at their start: its full training loss is the one the
    first full-batch step computes, so no separate forward pass is spent on it.

    The steps run in blocks of k = ``config.check_every`` (a ``scan`` of fixed length; a step
    of an instance that has stopped changes nothing), and whether any instance still runs is
    tested between blocks only: an accelerator reports to the host once per block, not once
    per step. The r = ``n mod k`` steps left after the whole blocks run as blocks of the powers
    of two whose sum is r (for k = 16: of 8, 4, 2 and 1 steps), each taken or skipped by a
    branch on a bit of r, which is the same for every instance (``n`` is the snapshots', not an
    instance's): under ``vmap`` such a branch stays a branch, where one that read an instance's
    status would run as a mask, its steps computed for every instance. So exactly ``n`` steps
    are computed, with at most log₂ k more reports to the host."""
    k = config.check_every

    def advance(state):
        taken, carry, first = state
        new, loss = _step(problem, config, opt, k_batch, carry)
        go = _running(carry.status)
        first = jnp.where(go & (taken == 0), loss, first)
        return taken + go, _select(go, new, carry), first

    def steps(state, length):
        return jax.lax.scan(lambda s, _: (advance(s), None), state, None, length)[0]

    def block(state):
        i, *rest = state
        return (i + k, *steps(tuple(rest), k))

    def whole_blocks_left(state):
        i, _, carry, _ = state
        return (i + k <= n) & _running(carry.status)

    first = jnp.full((), jnp.nan, carry.loss_sum.dtype)
    _, *state = jax.lax.while_loop(whole_blocks_left, block, (0, 0, carry, first))
    state = tuple(state)
    for size in (1 << b for b in reversed(range((k - 1).bit_length()))):
        take = ((n % k) & size) != 0
        state = jax.lax.cond(take, lambda s, size=size: steps(s, size), lambda s: s, state)
    taken, after, first = state
    if config.batch_size is None:
        loss = jax.lax.cond(taken > 0, lambda: first, lambda: problem.loss(carry.params))
    else:  # a step saw a minibatch; the trace holds the full training loss
        loss = problem.loss(carry.params)
    return after, _snapshot(monitor, carry.params, carry.status, loss)


def _begin(key: PRNGKeyArray, problem, config: GDConfig, opt) -> tuple[object, _Carry]:
    """The problem as the steps read it (full batch: in the layout for them, prepared once)
    and the state before the first step."""
    start = start_point(problem, _split(key)[0])
    if config.batch_size is None:
        problem = prepared(problem)
    status = Status(
        diverged=jnp.asarray(False),
        diverged_at=jnp.asarray(-1),
        converged=jnp.asarray(False),
        steps_taken=jnp.asarray(0),
    )
    dtype = jax.tree.leaves(start)[0].dtype
    return problem, _Carry(start, opt.init(start), status, jnp.asarray(0), jnp.zeros((), dtype))


def _fit(key: PRNGKeyArray, problem, config: GDConfig, monitor: Monitor | None) -> Fit:
    if config.batch_size is not None and config.batch_size > problem.samples:
        raise ValueError(
            f"batch_size must be <= samples ({problem.samples}), received {config.batch_size}"
        )
    opt = make_optimizer(config)
    problem, carry = _begin(key, problem, config, opt)
    start = carry.params
    if config.trainable is not None:
        fields = {_field_of(path) for path, _ in jax.tree_util.tree_leaves_with_path(start)}
        unknown = sorted(set(config.trainable) - fields)
        if unknown:
            raise ValueError(
                f"trainable must name parameter fields of {sorted(fields)}, received {unknown}"
            )
    snap_steps = config.snapshot_steps()
    lengths = np.diff(snap_steps, prepend=0)
    k_batch = _split(key)[1]
    carry, records = jax.lax.scan(
        lambda c, n: _interval(problem, config, opt, k_batch, monitor, c, n),
        carry,
        jnp.asarray(lengths[1:]),  # lengths[0] = 0: snapshot 0 is the start
    )
    final = _snapshot(monitor, carry.params, carry.status, problem.loss(carry.params))
    records = jax.tree.map(lambda r, f: jnp.concatenate([r, f[None]]), records, final)
    loss = records.pop("loss")
    trace = Trace(steps=jnp.asarray(snap_steps), loss=loss, metrics=records)
    info = {"loss_sum": carry.loss_sum, **movement(carry.params, start)}
    return Fit(params=carry.params, trace=trace, status=carry.status, info=info)


_NAMES = {"gd": "GD", "momentum": "heavy ball", "adam": "Adam", "normalized_gd": "normalised GD"}


def _describe(c: GDConfig) -> str:
    what = _NAMES.get(str(c.optimizer), str(c.optimizer))
    extra = f", momentum {float(c.momentum):g}" if c.optimizer == "momentum" else ""
    return f"{what}, lr {float(c.lr):g}{extra}, {c.steps} steps"


for _name, _lr in (("gd", 0.3), ("momentum", 0.1), ("adam", 1e-2), ("normalized_gd", 1e-2)):
    register_learner(
        _name,
        lambda steps, name=_name, lr=_lr: GDConfig(optimizer=name, steps=steps, lr=lr, snapshots=8),
        _describe,
    )


class StepCost(eqx.Module):
    """What one step costs one instance, from XLA's cost analysis of the compiled program."""

    flops: float
    """Floating-point operations per instance-step."""
    bytes: float
    """Bytes read and written per instance-step (after XLA's fusions)."""

    @property
    def intensity(self) -> float:
        """FLOPs per byte: below the device's ratio of compute to bandwidth, the step is
        memory-bound."""
        return self.flops / self.bytes


def step_cost(config: GDConfig, keys: PRNGKeyArray, problems) -> StepCost:
    """The cost of one of ``config``'s steps (loss, gradient, update) per instance, read from
    the cost analysis of the step's program vmapped over ``problems`` (a batch, one per key)
    and compiled for the default device. ``keys`` are the fits' keys."""
    opt = make_optimizer(config)
    prepared_problems, carries = jax.vmap(lambda k, p: _begin(k, p, config, opt))(keys, problems)
    step = jax.vmap(lambda key, problem, carry: _step(problem, config, opt, key, carry))
    batch_keys = jax.vmap(lambda k: _split(k)[1])(keys)
    compiled = jax.jit(step).lower(batch_keys, prepared_problems, carries).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    size = len(keys)
    return StepCost(flops=cost["flops"] / size, bytes=cost["bytes accessed"] / size)
