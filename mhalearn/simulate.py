"""The functional entry point: many random instances of a task, fitted by one learner.

>>> task = RegressionTask(teacher=TeacherSpec(heads=2, dim=6, tokens=3), samples=500)
>>> res = simulate(jax.random.key(0), task, GDConfig(steps=2000), instances=1000)
>>> res.metrics["success"].mean(), res.to_xarray()

Numbers in ``task`` and ``learner`` (β, noise, init scales, learning rate, ...) are shared by
every instance when they are scalars, and swept when they are arrays of shape
``(instances,)``: the whole sweep is one compilation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from mhalearn._validate import positive_int
from mhalearn.batch import Progress, map_instances, select_devices
from mhalearn.variables import annotate


def _path_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


def split_sweep(tree: Any, instances: int) -> tuple[Any, Any]:
    """Split a spec into its swept part (leaves of shape ``(instances,)``) and the rest.

    Raises ``ValueError`` for an array leaf that is neither a scalar nor per-instance.
    """

    def is_swept(path, leaf) -> bool:
        shape = np.shape(leaf) if eqx.is_array_like(leaf) else ()
        if shape == ():
            return False
        if shape != (instances,):
            raise ValueError(
                f"{_path_name(path)}: expected a scalar or one value per instance, shape "
                f"(instances,) = ({instances},), received shape {shape}"
            )
        return True

    mask = jax.tree_util.tree_map_with_path(is_swept, tree)
    return eqx.partition(tree, mask)


def swept_values(swept: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(swept)
    return {_path_name(path): np.asarray(leaf) for path, leaf in leaves}


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

    metrics: dict[str, np.ndarray]  # (instances,)
    # (instances,): diverged, diverged_at, converged, steps_taken and the task's checks
    # (teacher_accepted: the teacher passed its non-degeneracy checks)
    status: dict[str, np.ndarray]
    trace_steps: np.ndarray  # (snapshots,)
    trace: dict[str, np.ndarray]  # (instances, snapshots): loss and monitored metrics
    sweep: dict[str, np.ndarray]  # (instances,): every swept number, by its path in the spec
    key_ids: np.ndarray  # (instances,): instance i used fold_in(root_key, key_ids[i])
    attrs: dict[str, Any]
    params: Any = None  # fitted parameters, when asked for

    def arrays(self) -> dict[str, np.ndarray]:
        """Metrics, status and the trace (as ``trace_*``), by name, instance axis first."""
        return {**self.metrics, **self.status, **{f"trace_{k}": v for k, v in self.trace.items()}}

    def to_xarray(self):
        """The results as an ``xarray.Dataset`` (dims ``instance`` and ``step``)."""
        import xarray as xr

        dims = {1: ("instance",), 2: ("instance", "step")}
        data = {k: (dims[np.ndim(v)], v) for k, v in self.arrays().items()}
        coords = {
            "instance": np.arange(len(self.key_ids)),
            "step": self.trace_steps,
            "key_id": ("instance", self.key_ids),
            **{k: ("instance", v) for k, v in self.sweep.items()},
        }
        ds = xr.Dataset(data, coords=coords, attrs=self.attrs)
        tolerance = self.attrs.get("success_tol")
        return annotate(ds, {"success": {"tolerance": tolerance}} if tolerance else None)


def instance_keys(key: PRNGKeyArray) -> tuple[PRNGKeyArray, PRNGKeyArray, PRNGKeyArray]:
    """The keys of one instance's problem, fit and evaluation, from its instance key."""
    k_problem, k_fit, k_eval = jax.random.split(key, 3)
    return k_problem, k_fit, k_eval


def simulate(
    key: PRNGKeyArray,
    task,
    learner,
    instances: int,
    *,
    key_ids: np.ndarray | Sequence[int] | None = None,
    chunk_size: int | None = None,
    devices: int | Sequence[jax.Device] | None = None,
    vector_width: int | None = None,
    options: dict | None = None,
    keep_params: bool = False,
    progress: bool | Progress = False,
) -> Results:
    """Draw ``instances`` random instances of ``task``, fit each with ``learner``, score them.

    Instance i draws its problem, start and evaluation data from
    ``fold_in(key, key_ids[i])`` (``key_ids`` defaults to ``0 .. instances−1``; repeat ids to
    give several swept hyperparameters the same problems). See :func:`map_instances` for
    ``chunk_size``, ``devices``, ``vector_width`` and ``options`` (XLA compiler options).
    """
    instances = positive_int("instances", instances)
    key_ids = np.arange(instances) if key_ids is None else np.asarray(key_ids)
    swept, fixed = split_sweep({"task": task, "learner": learner}, instances)
    devs = select_devices(devices)

    def run(key, per, shared):
        spec = eqx.combine(per, shared)
        task, learner = spec["task"], spec["learner"]
        k_problem, k_fit, k_eval = instance_keys(key)
        truth, problem = task.sample(k_problem)
        fit = learner.fit(k_fit, problem, monitor=lambda p: task.monitor(truth, problem, p))
        metrics = task.evaluate(k_eval, truth, problem, fit.params)
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

    timing: dict[str, float] = {}
    out = map_instances(
        run,
        key,
        instances,
        swept,
        fixed,
        key_ids=key_ids,
        chunk_size=chunk_size,
        devices=devs,
        vector_width=vector_width,
        options=options,
        progress=progress,
        stats=timing,
    )
    key_data = (
        jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    )
    attrs = {
        "config": json.dumps({"task": to_jsonable(task), "learner": to_jsonable(learner)}),
        "root_key": json.dumps(np.asarray(key_data).tolist()),
        "instances": instances,
        "mhalearn_version": _version(),
        "jax_version": jax.__version__,
        "device_kind": devs[0].device_kind,
        "devices": len(devs),
        "x64": int(jax.config.jax_enable_x64),
        **timing,
        **_tolerance(task),
    }
    return Results(
        metrics=out["metrics"],
        status=out["status"],
        trace_steps=out["steps"][0],
        trace=out["trace"],
        sweep=swept_values(swept),
        key_ids=key_ids,
        attrs=attrs,
        params=out.get("params"),
    )


def _tolerance(task) -> dict[str, float]:
    """The task's success tolerance when it has one and every instance shares it."""
    tol = getattr(task, "success_tol", None)
    return {"success_tol": float(tol)} if tol is not None and np.ndim(tol) == 0 else {}


def _version() -> str:
    from mhalearn import __version__

    return __version__
