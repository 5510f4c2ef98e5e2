"""The functional entry point: many random instances of a task, fitted by one learner.

>>> task = RegressionTask(teacher=TeacherSpec(heads=2, dim=6, tokens=3), samples=500)
>>> res = simulate(jax.random.key(0), task, GDConfig(steps=2000), instances=1000)
>>> res.metrics["success"].mean(), res.to_xarray()

A per-instance computation that is not a fit (teacher diagnostics, a margin at the start)
goes through :func:`measure`, which :func:`simulate` is built on: one key split for all.

Numbers in ``task`` and ``learner`` (β, noise, init scales, learning rate, ...) are shared by
every instance when they are scalars, and swept when they are arrays of shape
``(instances,)``: the whole sweep is one compilation. Whole arrays that differ per instance
(the user's own data, a start point per instance) are wrapped in :class:`PerInstance`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from mhalearn._validate import positive_int
from mhalearn.batch import Engine, map_instances, provenance, select_devices
from mhalearn.instances import PerInstance, Shared, is_per_instance
from mhalearn.learners.base import Learner
from mhalearn.tasks import Task
from mhalearn.variables import annotate


def _path_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


class Split(NamedTuple):
    """A spec's swept part (one value per instance) and the rest; None where a part has no
    leaf."""

    swept: Any
    fixed: Any


def split_sweep(tree: Any, instances: int) -> Split:
    """Split a spec into its swept part (leaves of shape ``(instances,)``, and every array in
    a :class:`PerInstance`) and the rest (arrays in a :class:`Shared` are never swept).

    Raises ``ValueError`` for an array leaf that is neither a scalar nor per-instance, or a
    :class:`PerInstance` array without the leading instance axis.
    """

    def is_swept(path, leaf) -> bool:
        shape = np.shape(leaf) if eqx.is_array_like(leaf) else ()
        if shape == ():
            return False
        if shape != (instances,):
            raise ValueError(
                f"{_path_name(path)}: expected a scalar or one value per instance, shape "
                f"(instances,) = ({instances},), received shape {shape} (wrap arrays that "
                "differ per instance in PerInstance)"
            )
        return True

    def per_instance(path, leaf) -> bool:
        if not eqx.is_array_like(leaf):
            return False
        if np.shape(leaf)[:1] != (instances,):
            raise ValueError(
                f"{_path_name(path)}: a PerInstance array needs a leading axis of length "
                f"instances = {instances}, received shape {np.shape(leaf)}"
            )
        return True

    def mark(path, node):
        if is_per_instance(node):
            return jax.tree_util.tree_map_with_path(
                lambda p, leaf: per_instance((*path, *p), leaf), node
            )
        if isinstance(node, Shared):
            return jax.tree_util.tree_map_with_path(
                lambda p, n: mark((*path, *p), n) if is_per_instance(n) else False,
                node,
                is_leaf=is_per_instance,
            )
        return is_swept(path, node)

    wrapped = lambda node: isinstance(node, PerInstance | Shared)  # noqa: E731
    mask = jax.tree_util.tree_map_with_path(mark, tree, is_leaf=wrapped)
    return Split(*eqx.partition(tree, mask))


def swept_values(swept: Any) -> dict[str, np.ndarray]:
    """The swept numbers, by path (arrays in :class:`PerInstance` are data, not a sweep)."""
    leaves = jax.tree_util.tree_leaves_with_path(swept, is_leaf=is_per_instance)
    return {
        _path_name(path): np.asarray(leaf)
        for path, leaf in leaves
        if leaf is not None and not is_per_instance(leaf)
    }


def to_jsonable(obj: Any) -> Any:
    """A JSON-ready description of a spec (dataclasses and equinox Modules, recursively)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"type": type(obj).__name__, **fields}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if eqx.is_array(obj) or isinstance(obj, np.ndarray | np.generic):
        return np.asarray(obj).tolist()
    if callable(obj):
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
    return obj


@dataclasses.dataclass
class Results:
    """Per-instance outcomes as host arrays (leading axis: instance)."""

    metrics: dict[str, np.ndarray]
    """Each score, shape (instances,): the task's metrics (for regression ``success``,
    ``theta_error_max``, ``prediction_error``, ...) and the learner's ``info_*``."""
    status: dict[str, np.ndarray]
    """Shape (instances,): ``diverged``, ``diverged_at``, ``converged``, ``steps_taken`` and
    the task's checks (``teacher_accepted``: the teacher passed its non-degeneracy checks)."""
    trace_steps: np.ndarray | None
    """The logged steps, shape (snapshots,); None when nothing was traced."""
    trace: dict[str, np.ndarray]
    """Shape (instances, snapshots): the training loss and the monitored metrics."""
    sweep: dict[str, np.ndarray]
    """Shape (instances,): every swept number, by its path in the spec."""
    key_ids: np.ndarray
    """Shape (instances,): instance i used ``fold_in(root_key, key_ids[i])``."""
    attrs: dict[str, Any]
    """Provenance and settings shared by every instance (e.g. ``success_tol``)."""
    params: Any = None
    """The fitted parameters, instance axis first (``simulate(..., keep_params=True)``)."""

    def arrays(self) -> dict[str, np.ndarray]:
        """Metrics, status and the trace (as ``trace_*``), by name, instance axis first."""
        return {**self.metrics, **self.status, **{f"trace_{k}": v for k, v in self.trace.items()}}

    def to_xarray(self):
        """The results as an ``xarray.Dataset`` (dims ``instance`` and ``step``; flags as 0/1
        ``int8``), every swept number and the key ids as coordinates."""
        ds = grid_dataset(self.arrays(), {}, len(self.key_ids), self.trace_steps)
        ds = ds.assign_coords(
            key_id=("instance", self.key_ids), **{k: ("instance", v) for k, v in self.sweep.items()}
        )
        ds.attrs = dict(self.attrs)
        tolerance = self.attrs.get("success_tol")
        return annotate(ds, {"success": {"tolerance": tolerance}} if tolerance else None)


def grid_dataset(
    arrays: dict[str, np.ndarray],
    axes: dict[str, Sequence[Any]],
    instances: int,
    steps: np.ndarray | None = None,
):
    """A Dataset from flat per-instance arrays, instance last within each grid point (as
    :func:`~mhalearn.experiments.base.product_grid` lays them out): the leading axis reshaped
    to (axes..., instance); a second axis, when present, is ``step``. Flags become 0/1
    ``int8``."""
    import xarray as xr

    shape = (*(len(v) for v in axes.values()), instances)
    dims = (*axes, "instance")
    data = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype == bool:
            a = a.astype(np.int8)
        extra = ("step",) if a.ndim == 2 else ()
        data[name] = ((*dims, *extra), a.reshape(*shape, *a.shape[1:]))
    coords = {name: np.asarray(v) for name, v in axes.items()}
    coords["instance"] = np.arange(instances)
    if steps is not None:
        coords["step"] = np.asarray(steps)
    return xr.Dataset(data, coords=coords)


class InstanceKeys(NamedTuple):
    """One instance's keys, split from its instance key ``fold_in(root, key_id)``."""

    problem: PRNGKeyArray  # the task's draw: the truth and the training set
    fit: PRNGKeyArray  # the learner's: its start, minibatches, restarts
    evaluate: PRNGKeyArray  # the scoring's: fresh test data, random probes


def instance_keys(key: PRNGKeyArray) -> InstanceKeys:
    """The keys of one instance's problem, fit and evaluation, from its instance key."""
    return InstanceKeys(*jax.random.split(key, 3))


#: ``fn(keys, spec) -> outcome`` for :func:`measure`: ``outcome`` holds ``"metrics"`` (a dict
#: of scalars) and optionally ``"status"`` (scalars), ``"trace"`` (per snapshot, with
#: ``"steps"``) and ``"params"``.
Measurement = Callable[[InstanceKeys, Any], dict[str, Any]]


def measure(
    key: PRNGKeyArray,
    fn: Measurement,
    spec: Any,
    instances: int,
    *,
    key_ids: np.ndarray | Sequence[int] | None = None,
    engine: Engine | None = None,
    **options: Any,
) -> Results:
    """``fn(instance_keys(fold_in(key, key_ids[i])), spec_i)`` for every instance i: THE way a
    per-instance computation is batched, whether or not it is a fit (:func:`simulate` is one).

    The keys are split here, once, for every study: the problem key draws the task, the fit
    key the learner, the evaluation key the scoring.

    Args:
        key: the root key.
        fn: ``fn(keys, spec) -> {"metrics": ..., "status": ..., ...}`` for one instance.
        spec: any PyTree of specs (tasks, learners, teacher specs, numbers): a number is
            shared when it is a scalar and swept when it is an array of shape
            ``(instances,)`` (instance i sees entry i; the sweep is one compilation).
        instances: how many instances (≥ 1).
        key_ids: each instance's key index (default ``0 .. instances−1``).
        engine: how the instances run (:class:`~mhalearn.batch.Engine`; see
            :func:`~mhalearn.batch.map_instances`).
        **options: fields of the engine, replacing its own (:meth:`~mhalearn.batch.Engine.given`).

    Returns:
        The per-instance :class:`Results`.

    Raises:
        ValueError: ``instances`` < 1, or an array in ``spec`` that is neither a scalar nor
            of length ``instances``.
    """
    instances = positive_int("instances", instances)
    key_ids = np.arange(instances) if key_ids is None else np.asarray(key_ids)
    swept, fixed = split_sweep(spec, instances)
    engine = Engine.given(engine, **options)
    devs = select_devices(engine.devices)

    timing: dict[str, float] = {}
    out = map_instances(
        _measured,
        key,
        instances,
        swept,
        {"fn": fn, "spec": fixed},
        key_ids=key_ids,
        engine=dataclasses.replace(engine, devices=devs),
        stats=timing,
    )
    attrs = {**_about(key, spec, instances), **provenance(devs), **timing}
    steps = out.get("steps")
    return Results(
        metrics=out["metrics"],
        status=out.get("status", {}),
        trace_steps=None if steps is None else steps[0],
        trace=out.get("trace", {}),
        sweep=swept_values(swept),
        key_ids=key_ids,
        attrs=attrs,
        params=out.get("params"),
    )


def _measured(key: PRNGKeyArray, per: Any, shared: dict[str, Any]) -> dict[str, Any]:
    """One instance of :func:`measure` (module-level, with ``fn`` a static part of ``shared``,
    so that the engine recognises a program it has compiled before)."""
    return shared["fn"](instance_keys(key), eqx.combine(per, shared["spec"]))


def _about(key: PRNGKeyArray, spec: Any, instances: int) -> dict[str, Any]:
    """What was run: the spec, the root key and the instance count."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    key_data = jax.random.key_data(key) if typed else key
    return {
        "config": json.dumps(to_jsonable(spec)),
        "root_key": json.dumps(np.asarray(key_data).tolist()),
        "instances": instances,
    }


def simulate(
    key: PRNGKeyArray,
    task: Task,
    learner: Learner,
    instances: int,
    *,
    key_ids: np.ndarray | Sequence[int] | None = None,
    keep_params: bool = False,
    engine: Engine | None = None,
    **options: Any,
) -> Results:
    """Draw ``instances`` random instances of ``task``, fit each with ``learner``, score them,
    all in one compiled computation.

    Instance i draws its problem, start and evaluation data from
    ``fold_in(key, key_ids[i])``. A number in ``task`` or ``learner`` is shared when it is a
    scalar and swept when it is an array of shape ``(instances,)``; the sweep compiles once.

    Args:
        key: the root key.
        task: what to draw and how to score it (:mod:`mhalearn.tasks`).
        learner: how to fit (:mod:`mhalearn.learners`).
        instances: how many instances (≥ 1).
        key_ids: each instance's key index (default ``0 .. instances−1``); repeat ids to give
            several swept hyperparameters the same problems.
        keep_params: also return the fitted parameters (``Results.params``).
        engine: how the instances run (:class:`~mhalearn.batch.Engine`: ``chunk_size``,
            ``devices``, ``vector_width``, ``options``, ``progress``).
        **options: fields of the engine, replacing its own (:meth:`~mhalearn.batch.Engine.given`).

    Returns:
        The per-instance :class:`Results`; results never depend on ``chunk_size`` or the
        device count.

    Raises:
        ValueError: ``instances`` < 1, a swept array whose length is not ``instances``, or
            an engine option out of range.
    """

    spec = {"task": task, "learner": learner}
    fit_and_score = _fit_score_and_keep if keep_params else _fit_and_score
    res = measure(key, fit_and_score, spec, instances, key_ids=key_ids, engine=engine, **options)
    res.attrs.update(_tolerance(task))
    return res


def _fit_and_score(keys: InstanceKeys, spec: dict[str, Any], keep_params: bool = False):
    """One instance of :func:`simulate`: draw it, fit it, score it."""
    task, learner = spec["task"], spec["learner"]
    truth, problem = task.sample(keys.problem)
    fit = learner.fit(keys.fit, problem, monitor=lambda p: task.monitor(truth, problem, p))
    metrics = task.evaluate(keys.evaluate, truth, problem, fit)
    out = {
        "metrics": {**metrics, **{f"info_{k}": v for k, v in fit.info.items()}},
        "trace": {"loss": fit.trace.loss, **fit.trace.metrics},
        "status": {
            **{f.name: getattr(fit.status, f.name) for f in dataclasses.fields(fit.status)},
            **task.checks(truth),
        },
        "steps": fit.trace.steps,
    }
    if keep_params:
        out["params"] = fit.params
    return out


def _fit_score_and_keep(keys: InstanceKeys, spec: dict[str, Any]):
    """:func:`_fit_and_score`, returning the fitted parameters too."""
    return _fit_and_score(keys, spec, keep_params=True)


def _tolerance(task) -> dict[str, float]:
    """The task's success tolerance when it has one and every instance shares it."""
    tol = getattr(task, "success_tol", None)
    return {"success_tol": float(tol)} if tol is not None and np.ndim(tol) == 0 else {}
