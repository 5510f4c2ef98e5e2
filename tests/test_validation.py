"""Bad input to the Python API: a ValueError with one line naming the argument, or, for
array-likes, the same answer as for arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh


@pytest.mark.slow
def test_public_functions_accept_lists(rng):
    X = rng.choice([-1.0, 1.0], size=(3, 4))
    theta, W = rng.normal(size=(2, 2, 4, 4))
    expected = mh.mha(jnp.asarray(X), jnp.asarray(theta), jnp.asarray(W))
    np.testing.assert_allclose(mh.mha(X.tolist(), theta.tolist(), W.tolist()), expected)
    np.testing.assert_allclose(
        mh.attention_weights(X.tolist(), theta), mh.attention_weights(X, theta)
    )
    np.testing.assert_allclose(mh.layer_outputs([X.tolist()], theta, W), expected[None])
    loss, _ = mh.squared_loss_and_grad([X.tolist()], [X.tolist()], theta.tolist(), W)
    assert np.isfinite(loss)
    spec = mh.ClassifierSpec()
    U = rng.normal(size=(2, 3, 4))
    score = mh.classifier_score(X.tolist(), theta.tolist(), U.tolist(), spec, head_mask=[1, 0])
    np.testing.assert_allclose(score, mh.classifier_score(X, theta, U, spec, head_mask=[1.0, 0.0]))
    assert mh.parameter_diagnostics(theta.tolist(), W.tolist()).w_norm > 0


X4 = np.ones((3, 4))
T4 = np.zeros((2, 4, 4))


@pytest.mark.parametrize(
    "call,fragment",
    [
        (lambda: mh.mha("abc", T4, T4), "X: expected an array of numbers"),
        (lambda: mh.mha([[1.0, 2.0], [3.0]], T4, T4), "X: expected an array of numbers"),
        (lambda: mh.mha(None, T4, T4), "X: expected an array of numbers"),
        (lambda: mh.mha(X4, T4, [["a"]]), "W: expected an array of numbers"),
        (lambda: mh.mha(X4, T4[:, :3], T4), "theta: expected shape"),
        (lambda: mh.attention_weights(X4[0], T4), "X: expected shape"),
        (lambda: mh.layer_outputs(X4, T4, T4), "X: expected shape"),
        (lambda: mh.classifier_score(X4, T4, np.zeros((2, 5)), mh.ClassifierSpec()), "U:"),
        (lambda: mh.parameter_diagnostics(T4[0], T4), "theta: expected shape"),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=float("inf")),
            "beta must lie in",
        ),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=float("nan")),
            "beta must lie in",
        ),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, min_w_norm=1.5),
            "min_w_norm must lie in [0.0, 1]",
        ),
        (lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, min_theta_sv=2.0), "min_theta_sv"),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, min_separation=3.0),
            "min_separation must lie in [0.0, 2]",
        ),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, min_sigma_ratio=5.0),
            "min_sigma_ratio must lie in [0.0, 4]",
        ),
        (
            lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, max_attempts=10**6),
            "max_attempts must lie in [1, 100000]",
        ),
        (lambda: mh.TeacherSpec(heads=2, dim=4, tokens=3, stress_eps=float("inf")), "stress_eps"),
        (
            lambda: mh.RegressionTask(
                teacher=mh.TeacherSpec(heads=1, dim=2, tokens=2), success_tol=0.0
            ),
            "success_tol",
        ),
        (lambda: mh.GDConfig(lr=float("inf")), "lr"),
        (
            lambda: mh.boolean_tokens(jax.random.key(0), (0, 3)),
            "every size must be an integer >= 1",
        ),
        (
            lambda: mh.simulate(jax.random.key(0), None, None, 0),
            "instances must be an integer >= 1",
        ),
    ],
)
def test_bad_api_input_raises_one_line_naming_the_argument(call, fragment):
    with pytest.raises(ValueError) as err:
        call()
    message = str(err.value)
    assert fragment in message and "\n" not in message, message


@pytest.mark.slow
def test_impossible_teacher_checks_end_flagged_not_looping():
    spec = mh.TeacherSpec(heads=2, dim=3, tokens=2, min_sigma_ratio=3.0, max_attempts=5)
    task = mh.RegressionTask(teacher=spec, samples=10, test_samples=4)
    res = mh.simulate(jax.random.key(0), task, mh.UniformConfig(), 3)
    np.testing.assert_array_equal(res.status["teacher_accepted"], [False] * 3)
    fine = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=3, tokens=2), samples=10)
    ok = mh.simulate(jax.random.key(0), fine, mh.UniformConfig(), 3)
    assert ok.status["teacher_accepted"].all()
    _, info = mh.sample_teacher_with_info(jax.random.key(0), spec)
    assert int(info.attempts) == 5 and not bool(info.accepted)
