"""The problems every learner fits: starts of the documented law, losses equal to loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from tests import reference as ref


def regression(rng, n=5, heads=2, tokens=3, dim=4, **kw):
    X = rng.choice([-1.0, 1.0], size=(n, tokens, dim))
    Y = rng.normal(size=(n, tokens, dim))
    return mh.RegressionProblem(X=jnp.asarray(X), Y=jnp.asarray(Y), heads=heads, **kw)


@pytest.mark.slow
def test_regression_loss_equals_a_loop_and_minibatches_take_their_rows(rng):
    problem = regression(rng)
    params = mh.LayerParams(
        theta=jnp.asarray(rng.normal(size=(2, 4, 4))), W=jnp.asarray(rng.normal(size=(2, 4, 4)))
    )
    X, Y = np.asarray(problem.X), np.asarray(problem.Y)
    per = [np.sum((ref.mha(x, params.theta, params.W) - y) ** 2) for x, y in zip(X, Y, strict=True)]
    np.testing.assert_allclose(problem.loss(params), np.sum(per) / Y.size, rtol=1e-12)
    idx = jnp.array([4, 1])
    np.testing.assert_allclose(problem.loss(params, idx), (per[4] + per[1]) / (2 * 12), rtol=1e-12)
    loss, grads = problem.loss_and_grad(params, idx)
    auto = jax.grad(problem.loss)(params, idx)
    np.testing.assert_allclose(loss, problem.loss(params, idx), rtol=1e-12)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(auto), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_regression_start_follows_the_teacher_law(rng):
    problem = regression(rng, heads=3, dim=8, start=mh.RegressionStart(theta_init=2.0, w_init=0.5))
    starts = jax.vmap(problem.init)(jax.random.split(jax.random.key(0), 400))
    theta_norm = jnp.linalg.norm(starts.theta, axis=(-2, -1))  # ‖Θ̂_i‖_F ≈ theta_init
    w_entries = starts.W.reshape(-1)  # entries N(0, w_init²/dim)
    np.testing.assert_allclose(jnp.mean(theta_norm**2), 2.0**2, rtol=0.03)
    np.testing.assert_allclose(jnp.std(w_entries), 0.5 / math.sqrt(8), rtol=0.03)
    assert starts.theta.shape == (400, 3, 8, 8) and problem.samples == 5


def classification(rng, **kw):
    X = jnp.asarray(rng.normal(size=(6, 4, 3)))
    y = jnp.asarray(rng.choice([-1.0, 1.0], size=6))
    spec = mh.ClassifierSpec(query="all", readout="matrix", head_scaling="sqrt")
    return mh.ClassificationProblem(X=X, y=y, spec=spec, heads=3, **kw)


@pytest.mark.slow
def test_classification_scores_and_loss_equal_loops_with_masked_heads(rng):
    problem = classification(rng, active_heads=2, start=mh.ClassifierStart(w_init=1.0))
    params = problem.init(jax.random.key(1))
    np.testing.assert_array_equal(problem.head_mask(), [1.0, 1.0, 0.0])
    scores = [
        ref.classifier_score(x, params.W, params.U, "all", "matrix", "sqrt", 1.0, mask=[1, 1, 0])
        for x in np.asarray(problem.X)
    ]
    np.testing.assert_allclose(problem.scores(params, problem.X), scores, rtol=1e-10)
    y = np.asarray(problem.y)
    loss = np.mean([math.log1p(math.exp(-yi * si)) for yi, si in zip(y, scores, strict=True)])
    np.testing.assert_allclose(problem.loss(params), loss, rtol=1e-10)


def test_classification_starts_zero_gaussian_and_one_step(rng):
    zero = classification(rng, start=mh.ClassifierStart(u_init=0.0, w_init=0.0))
    start = zero.init(jax.random.key(2))
    assert not np.any(start.W) and not np.any(start.U)
    plain = classification(rng)
    stepped = mh.ClassificationProblem(
        X=plain.X, y=plain.y, spec=plain.spec, heads=3, start=mh.ClassifierStart(one_step=0.5)
    )
    before = plain.init(jax.random.key(3))  # W = 0, U Gaussian: the default
    assert not np.any(before.W) and np.std(before.U) > 0.3
    grads = jax.grad(plain.loss)(before)
    after = stepped.init(jax.random.key(3))
    np.testing.assert_allclose(after.W, before.W - 0.5 * grads.W, rtol=1e-12)
    np.testing.assert_allclose(after.U, before.U - 0.5 * grads.U, rtol=1e-12)
