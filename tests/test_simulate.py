import json

import jax
import numpy as np
import pytest

import mhalearn as mh

TASK = mh.RegressionTask(
    teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=40, test_samples=8
)


@pytest.mark.slow
def test_results_as_arrays_and_dataset():
    betas = np.array([1.0, 2.0, 4.0, 8.0, 1.0, 2.0])
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=betas), samples=40, test_samples=8
    )
    res = mh.simulate(jax.random.key(9), task, mh.GDConfig(steps=30, snapshots=5), 6)
    assert res.metrics["theta_error_max"].shape == (6,)
    assert res.trace["loss"].shape == (6, len(res.trace_steps))
    np.testing.assert_array_equal(res.sweep["task.teacher.beta"], betas)
    ds = res.to_xarray()
    assert dict(ds.sizes) == {"instance": 6, "step": len(res.trace_steps)}
    assert ds["trace_loss"].dims == ("instance", "step")
    np.testing.assert_array_equal(ds["task.teacher.beta"].values, betas)
    config = json.loads(ds.attrs["config"])
    assert config["task"]["teacher"]["heads"] == 2 and config["learner"]["optimizer"] == "adam"
    assert config["task"]["teacher"]["beta"] == betas.tolist()
    for key in ("root_key", "mhalearn_version", "jax_version", "device_kind"):
        assert key in ds.attrs
    # each instance really saw its own β: rebuild instance i by hand (its key, its β) and
    # recompute the training loss at the student's start
    for i, beta in enumerate(betas):
        own = mh.RegressionTask(
            teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=beta), samples=40, test_samples=8
        )
        k_problem, k_fit, _ = jax.random.split(jax.random.fold_in(jax.random.key(9), i), 3)
        _, problem = own.sample(k_problem)
        start = problem.init(jax.random.split(k_fit)[0])
        np.testing.assert_allclose(res.trace["loss"][i, 0], problem.loss(start), rtol=1e-12)
    kept = mh.simulate(jax.random.key(9), task, mh.GDConfig(steps=1), 6, keep_params=True)
    assert kept.params.theta.shape == (6, 2, 4, 4)


def test_same_key_same_results_and_new_key_new_results():
    a = mh.simulate(jax.random.key(1), TASK, mh.GDConfig(steps=20), 3)
    b = mh.simulate(jax.random.key(1), TASK, mh.GDConfig(steps=20), 3)
    c = mh.simulate(jax.random.key(2), TASK, mh.GDConfig(steps=20), 3)
    np.testing.assert_array_equal(a.trace["loss"], b.trace["loss"])
    assert not np.array_equal(a.trace["loss"], c.trace["loss"])


def test_bad_sweep_shape_is_refused():
    with pytest.raises(
        ValueError,
        match=r"learner\.lr: expected a scalar or one value per instance, "
        r"shape \(instances,\) = \(4,\), received shape \(3,\)",
    ):
        mh.simulate(jax.random.key(0), TASK, mh.GDConfig(lr=np.ones(3)), 4)


def test_task_validation():
    with pytest.raises(ValueError, match="student_heads must be >= teacher heads"):
        mh.RegressionTask(teacher=mh.TeacherSpec(heads=3, dim=4, tokens=3), student_heads=2)
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        mh.RegressionTask(teacher=TASK.teacher, samples=0)
    with pytest.raises(ValueError, match="active_heads must lie in"):
        mh.ClassificationTask(mixture=mh.MixtureSpec(tokens=4, dim=4), heads=2, active_heads=3)


def test_results_name_the_commit_of_the_source():
    """In a git checkout the provenance names the source's commit (and whether its files
    differ from it); only outside one is it unknown."""
    import pathlib
    import re
    import subprocess

    from mhalearn._version import source_commit

    root = pathlib.Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode:
        assert source_commit() == "unknown"
    else:
        assert re.fullmatch(r"[0-9a-f]{40}(\+modified)?", source_commit())
        assert source_commit().startswith(head.stdout.decode().strip())
