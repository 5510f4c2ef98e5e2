"""The user's own data, model, metrics and start through simulate (UserTask, PerInstance,
GivenStart), against the same fits run one instance at a time by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.simulate import instance_keys


def numpy_data(rng, instances, n=12, T=4, d=3):
    X = rng.standard_normal((instances, n, T, d))
    y = np.where(rng.standard_normal((instances, n)) > 0, 1.0, -1.0)
    return {"X": X, "y": y}


SPEC = mh.ClassifierSpec(query="first", readout="vector")


def make_problem(data):
    return mh.ClassificationProblem(X=data["X"], y=data["y"], spec=SPEC, heads=2)


def first_weight(data, problem, params):
    """A user metric: the attention weight of head 0 on token 0, mean over samples."""
    A = jax.vmap(lambda x: mh.classifier_attention(x, params.W, SPEC))(data["X"])
    return {"weight_first": jnp.mean(A[:, 0, 0, 0])}


@pytest.mark.slow
def test_user_data_per_instance_equals_fits_by_hand(rng):
    data = numpy_data(rng, 3)
    task = mh.UserTask(problem=make_problem, data=mh.PerInstance(data), metrics=first_weight)
    learner = mh.GDConfig(optimizer="gd", lr=0.5, steps=30, snapshots=4)
    key = jax.random.key(7)
    res = mh.simulate(key, task, learner, 3, keep_params=True)
    assert isinstance(task, mh.Task)
    assert set(res.metrics) >= {"train_loss", "weight_first"}
    chunked = mh.simulate(key, task, learner, 3, chunk_size=1)  # slices follow the instances
    np.testing.assert_array_equal(chunked.metrics["train_loss"], res.metrics["train_loss"])
    assert res.trace["weight_first"].shape == (3, len(learner.snapshot_steps()))
    for i in range(3):
        mine = {k: v[i] for k, v in data.items()}
        keys = instance_keys(jax.random.fold_in(key, i))
        problem = make_problem(mine)
        fit = learner.fit(keys.fit, problem)
        np.testing.assert_allclose(res.params.W[i], fit.params.W, rtol=1e-12)
        np.testing.assert_allclose(res.metrics["train_loss"][i], problem.loss(fit.params))
        want = first_weight(mine, problem, fit.params)["weight_first"]
        np.testing.assert_allclose(res.metrics["weight_first"][i], want, rtol=1e-12)
    # the instances really saw different data
    assert len(set(np.round(res.metrics["train_loss"], 12))) == 3


def test_user_draw_function_and_shared_data(rng):
    def draw(key):
        k_x, k_y = jax.random.split(key)
        X = jax.random.normal(k_x, (10, 4, 3))
        return {"X": X, "y": jnp.sign(jax.random.normal(k_y, (10,)))}

    learner = mh.GDConfig(optimizer="adam", lr=1e-2, steps=5)
    drawn = mh.simulate(jax.random.key(0), mh.UserTask(problem=make_problem, draw=draw), learner, 2)
    assert np.all(np.isfinite(drawn.metrics["train_loss"]))
    assert drawn.metrics["train_loss"][0] != drawn.metrics["train_loss"][1]
    shared = {k: v[0] for k, v in numpy_data(rng, 1).items()}  # one data set, many seeds
    res = mh.simulate(jax.random.key(0), mh.UserTask(problem=make_problem, data=shared), learner, 2)
    assert res.metrics["train_loss"][0] != res.metrics["train_loss"][1]  # other random starts


def test_bad_custom_inputs_are_refused_clearly(rng):
    data = numpy_data(rng, 3)
    task = mh.UserTask(problem=make_problem, data=mh.PerInstance(data))
    with pytest.raises(ValueError, match="leading axis of length instances = 4"):
        mh.simulate(jax.random.key(0), task, mh.GDConfig(steps=2), 4)
    with pytest.raises(ValueError, match="exactly one of data"):
        mh.UserTask(problem=make_problem)
    # data not wrapped is shared: every instance sees the stack, which the problem refuses
    with pytest.raises(ValueError, match=r"X: expected shape \(samples, tokens, dim\)"):
        learner = mh.GDConfig(steps=2)
        mh.simulate(jax.random.key(0), mh.UserTask(problem=make_problem, data=data), learner, 3)


@pytest.mark.slow
def test_given_start_per_instance_for_gd_and_variable_projection(rng):
    teacher = mh.TeacherSpec(heads=1, dim=3, tokens=2)
    theta = rng.standard_normal((2, 1, 3, 3)) / 3
    W = rng.standard_normal((2, 1, 3, 3)) / 3
    start = mh.GivenStart(mh.PerInstance(jax.vmap(mh.LayerParams)(theta, W)))
    task = mh.RegressionTask(teacher=teacher, samples=20, test_samples=4, start=start)
    # zero steps of GD: the fit is the start, whatever the key
    gd = mh.GDConfig(optimizer="gd", lr=0.1, steps=1, snapshots=2)
    res = mh.simulate(jax.random.key(3), task, gd, 2, keep_params=True)
    for i in range(2):
        problem = task.sample(
            instance_keys(jax.random.fold_in(jax.random.key(3), i)).problem
        ).problem
        problem = mh.RegressionProblem(
            X=problem.X, Y=problem.Y, heads=1, start=mh.GivenStart(mh.LayerParams(theta[i], W[i]))
        )
        loss, grads = problem.loss_and_grad(mh.LayerParams(theta[i], W[i]))
        np.testing.assert_allclose(res.params.theta[i], theta[i] - 0.1 * grads.theta, rtol=1e-12)
        np.testing.assert_allclose(res.trace["loss"][i, 0], loss, rtol=1e-12)
        # variable projection starts there too: its first iterate's Θ is the given one
        vp = mh.VarProConfig(iterations=1, restarts=1)
        start_theta = mh.start_point(problem, jax.random.key(99)).theta
        np.testing.assert_array_equal(start_theta, theta[i])
        assert vp.fit(jax.random.key(5), problem).trace.loss.shape[0] == 2
    with pytest.raises(ValueError, match="GivenStart"):
        mh.simulate(jax.random.key(3), task, mh.ChenLiConfig(), 2)


def test_given_start_of_the_wrong_shape_is_refused(rng):
    problem = mh.RegressionProblem(
        X=rng.standard_normal((5, 2, 3)),
        Y=rng.standard_normal((5, 2, 3)),
        heads=2,
        start=mh.GivenStart(mh.LayerParams(np.zeros((1, 3, 3)), np.zeros((1, 3, 3)))),
    )
    with pytest.raises(ValueError, match="GivenStart: expected parameters shaped"):
        mh.start_point(problem, jax.random.key(0))


def test_trace_at_records_exactly_the_steps_asked_for(rng):
    learner = mh.GDConfig(optimizer="gd", steps=50, trace_at=[10, 3, 30])
    assert learner.snapshot_steps().tolist() == [0, 3, 10, 30, 50]
    with pytest.raises(ValueError, match="trace_at"):
        mh.GDConfig(steps=5, trace_at=(6,))
