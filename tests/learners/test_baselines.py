import jax
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.learners import baselines, linear

TASK = mh.RegressionTask(
    teacher=mh.TeacherSpec(heads=2, dim=6, tokens=3, beta=4.0), samples=300, test_samples=64
)


@pytest.mark.slow
def test_uniform_attention_is_the_least_squares_floor():
    teacher, problem = TASK.sample(jax.random.key(0))
    out = baselines.UniformConfig().fit(jax.random.key(1), problem)
    assert np.all(out.params.theta == 0)
    np.testing.assert_allclose(out.params.W[0], out.params.W[1])
    # the floor, computed independently: every output row of a uniform-attention layer is
    # mean(X_n)ᵀ S, so the best S is ordinary least squares on the pooled tokens
    X, Y = np.asarray(problem.X), np.asarray(problem.Y)
    pooled = np.repeat(X.mean(axis=1, keepdims=True), 3, axis=1).reshape(-1, 6)
    sum_w = np.linalg.lstsq(pooled, Y.reshape(-1, 6), rcond=None)[0]
    np.testing.assert_allclose(out.params.W.sum(0), sum_w, rtol=1e-6, atol=1e-8)
    floor = np.sum((pooled @ sum_w - Y.reshape(-1, 6)) ** 2) / np.sum(Y**2)  # Y = F(X) here
    np.testing.assert_allclose(
        mh.prediction_error(out.params, teacher, problem.X), floor, rtol=1e-8
    )


def test_alternating_minimisation_lowers_the_loss():
    _, problem = TASK.sample(jax.random.key(0))
    out = baselines.AlternatingConfig(rounds=20, inner_steps=10).fit(jax.random.key(1), problem)
    assert out.trace.loss[-1] < 0.2 * out.trace.loss[0]
    # its W is exactly the least-squares W for its Θ
    W = linear.solve_values(problem.X, problem.Y, out.params.theta, 1e-12)
    np.testing.assert_allclose(out.params.W, W, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_oracle_refinement_is_a_ceiling():
    res = mh.simulate(jax.random.key(0), TASK, baselines.OracleConfig(), 3)
    assert np.all(res.metrics["success"])
    _, problem = TASK.sample(jax.random.key(0))
    blind = mh.RegressionProblem(X=problem.X, Y=problem.Y, heads=2)
    with pytest.raises(ValueError, match=r"needs problem\.teacher"):
        baselines.OracleConfig().fit(jax.random.key(0), blind)
