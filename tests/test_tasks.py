"""The tasks: what they draw and how they score, against the truth and by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.learners.base import Fit, Status, Trace

SPEC = mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=2.0)


def as_fit(params) -> Fit:
    """A Fit that reports ``params`` (the scores read only its parameters and estimates)."""
    status = Status(
        diverged=jnp.asarray(False),
        diverged_at=jnp.asarray(-1),
        converged=jnp.asarray(True),
        steps_taken=jnp.asarray(0),
    )
    trace = Trace(steps=jnp.zeros(1, int), loss=jnp.zeros(1), metrics={})
    return Fit(params=params, trace=trace, status=status)


def test_regression_labels_are_the_teacher_plus_the_stated_noise():
    clean = mh.RegressionTask(teacher=SPEC, samples=400)
    teacher, problem = clean.sample(jax.random.key(0))
    np.testing.assert_allclose(problem.Y, mh.layer_outputs(problem.X, teacher.theta, teacher.W))
    assert set(np.unique(problem.X)) == {-1.0, 1.0} and problem.teacher is teacher
    noisy = mh.RegressionTask(teacher=SPEC, samples=400, label_noise=0.3)
    teacher2, problem2 = noisy.sample(jax.random.key(0))
    np.testing.assert_array_equal(teacher2.theta, teacher.theta)  # the same draw, plus noise
    residual = np.asarray(problem2.Y - problem.Y)
    np.testing.assert_allclose(residual.std(), 0.3, rtol=0.05)
    assert abs(residual.mean()) < 0.02


@pytest.mark.slow
def test_the_truth_scores_perfectly_and_a_swap_of_heads_too():
    task = mh.RegressionTask(teacher=SPEC, samples=50, test_samples=64)
    teacher, problem = task.sample(jax.random.key(1))
    swapped = jax.tree.map(lambda a: a[::-1], teacher)  # the same layer, heads relabelled
    for params in (teacher, swapped):
        scores = task.evaluate(jax.random.key(2), teacher, problem, as_fit(params))
        assert scores["success"] and scores["theta_error_max"] < 1e-12
        assert scores["prediction_error"] < 1e-24 and scores["train_loss"] < 1e-24
    wrong = mh.LayerParams(theta=teacher.theta * 1.01, W=teacher.W)  # 1% off: past 1e-3
    scores = task.evaluate(jax.random.key(2), teacher, problem, as_fit(wrong))
    assert not scores["success"]
    np.testing.assert_allclose(scores["theta_error_max"], 0.01, rtol=1e-9)
    assert bool(task.checks(teacher)["teacher_accepted"])


def test_estimates_are_scored_against_the_truth():
    task = mh.RegressionTask(teacher=SPEC, samples=50, test_samples=8)
    teacher, problem = task.sample(jax.random.key(1))
    sum_w = teacher.W.sum(0)
    span = teacher.theta.reshape(2, -1)
    fit = as_fit(teacher)
    fit = Fit(
        params=fit.params,
        trace=fit.trace,
        status=fit.status,
        estimates={"refined_sum_w": 1.5 * sum_w, "span": span, "min_norm_point": span[0]},
    )
    scores = task.evaluate(jax.random.key(2), teacher, problem, fit)
    np.testing.assert_allclose(scores["refined_sum_w_error"], 0.5, rtol=1e-12)
    np.testing.assert_allclose(scores["span_angle_estimate"], 0.0, atol=1e-7)
    np.testing.assert_allclose(scores["min_norm_in_span"], 1.0, rtol=1e-12)
    assert "crude_sum_w_error" not in scores  # only what the learner estimated


@pytest.mark.slow
def test_classification_scores_are_the_losses_of_the_parameters():
    task = mh.ClassificationTask(
        mixture=mh.MixtureSpec(tokens=4, dim=4), heads=3, samples=20, active_heads=2
    )
    held_out, problem = task.sample(jax.random.key(0))
    params = problem.init(jax.random.key(1))
    scores = task.evaluate(jax.random.key(5), held_out, problem, as_fit(params))
    np.testing.assert_allclose(scores["train_loss"], problem.loss(params), rtol=1e-12)
    test = mh.tokenized_mixture(jax.random.key(5), task.mixture, task.test_samples)
    margins = test.y * problem.scores(params, test.X)
    np.testing.assert_allclose(scores["test_loss"], np.mean(np.log1p(np.exp(-margins))))
    np.testing.assert_allclose(scores["test_error"], np.mean(margins <= 0))
    np.testing.assert_allclose(scores["gap"], scores["test_loss"] - scores["train_loss"])
    assert int(scores["active_heads"]) == 2 and task.checks(held_out) == {}
    assert set(np.unique(problem.y)) <= {-1.0, 1.0} and problem.X.shape == (20, 4, 4)
