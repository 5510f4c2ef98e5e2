"""The solvable models of the literature against slow references of their authors' formulas
(Python loops in float64, written from the papers' definitions rather than the code's array
form), and under simulate."""

import itertools
import math

import jax
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.solvable import (
    AIMParams,
    AIMTask,
    PositionalSemanticTask,
    QueryParams,
    aim_mse,
    linear_baseline,
    overlaps,
)


def softmax(v):
    e = np.exp(v - np.max(v))
    return e / e.sum()


# ---- the attention-indexed model ---------------------------------------------------------


def aim_reference(W, X):
    """y_n[a, b] = softmax_b((x_aᵀSx_b − δ_ab·Tr S)/√D), S = WᵀW/√(R·D), by loops."""
    R, D = W.shape
    S = W.T @ W / math.sqrt(R * D)
    n, T, _ = X.shape
    Y = np.zeros((n, T, T))
    for i, a in itertools.product(range(n), range(T)):
        logits = [(X[i, a] @ S @ X[i, b] - (a == b) * np.trace(S)) / math.sqrt(D) for b in range(T)]
        Y[i, a] = softmax(np.array(logits))
    return Y


def test_aim_target_loss_and_error_equal_their_definitions(rng):
    task = AIMTask(dim=6, tokens=3, alpha=0.5, rho=0.5)
    assert task.samples == 18 and task.rank == 3  # ⌊0.5·36⌋, ⌊0.5·6⌋
    teacher, problem = task.sample(jax.random.key(0))
    X, W_star = np.asarray(problem.X), np.asarray(teacher.W)
    np.testing.assert_allclose(problem.Y, aim_reference(W_star, X), rtol=1e-12, atol=1e-14)
    W = rng.standard_normal(W_star.shape)
    want = np.sum((aim_reference(W, X) - np.asarray(problem.Y)) ** 2) / 6  # a sum over D
    assert float(problem.loss(AIMParams(W=W))) == pytest.approx(want, rel=1e-12)
    assert float(problem.loss(teacher)) == 0.0
    S, S_star = (w.T @ w / math.sqrt(3 * 6) for w in (W, W_star))
    mse = sum((S[p, q] - S_star[p, q]) ** 2 for p in range(6) for q in range(6)) / 6
    assert float(aim_mse(AIMParams(W=W), teacher)) == pytest.approx(mse, rel=1e-12)
    # the authors' sizes round down in floating point, n = int(α·D²): 0.0012·200² is
    # 47.99999999999999 there, so 47 sequences, as their script draws
    assert AIMTask(dim=200, alpha=0.0012, rho=0.5).samples == 47


def test_aim_gradient_equals_finite_differences_of_the_reference(rng):
    task = AIMTask(dim=4, tokens=2, alpha=0.5, rho=0.5)
    _, problem = task.sample(jax.random.key(1))
    W = rng.standard_normal((2, 4))
    _, grad = problem.loss_and_grad(AIMParams(W=W))
    X, Y = np.asarray(problem.X), np.asarray(problem.Y)

    def loss(w):
        return np.sum((aim_reference(w, X) - Y) ** 2) / 4

    h = 1e-6
    for p, q in itertools.product(range(2), range(4)):
        e = np.zeros_like(W)
        e[p, q] = h
        fd = (loss(W + e) - loss(W - e)) / (2 * h)
        assert float(grad.W[p, q]) == pytest.approx(fd, rel=1e-6, abs=1e-9)


# ---- the positional–semantic model -------------------------------------------------------

A_STANDARD = np.array([[0.6, 0.4], [0.4, 0.6]])


def attention_reference(q, tokens):
    """Σ_s softmax_s(⟨x_t, q⟩⟨x_s, q⟩/d) x_s for each token t, by loops (q: one column)."""
    d = tokens.shape[-1]
    out = np.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        scores = np.array([(tokens[t] @ q) * (tokens[s] @ q) / d for s in range(tokens.shape[0])])
        w = softmax(scores)
        out[t] = sum(w[s] * tokens[s] for s in range(tokens.shape[0]))
    return out


def test_positional_semantic_data_loss_and_overlaps_equal_their_definitions(rng):
    d, omega, sigma, lmbda = 6, 0.3, 0.5, 0.01
    task = PositionalSemanticTask(
        dim=d, alpha=1.5, omega=omega, sigma=sigma, lmbda=lmbda, start="semantic", test_samples=7
    )
    assert task.samples == 9  # round(1.5·6)
    Q_star, problem = task.sample(jax.random.key(0))
    X, Y, q_star = np.asarray(problem.X), np.asarray(problem.Y), np.asarray(Q_star)
    p = np.stack([np.ones(d), -np.ones(d)]) / math.sqrt(d)
    Z = X - p  # the semantic parts: the teacher sees only them
    for n in range(task.samples):
        want = (1 - omega) * attention_reference(q_star, Z[n]) + omega * A_STANDARD @ Z[n]
        np.testing.assert_allclose(Y[n], want, rtol=1e-12, atol=1e-14)
    Q = rng.standard_normal((d, 1))
    fit = sum(np.sum((attention_reference(Q[:, 0], X[n]) - Y[n]) ** 2) for n in range(9))
    want = fit / (2 * d) + lmbda / 2 * np.sum(Q**2)  # a sum over sequences, and weight decay
    assert float(problem.loss(QueryParams(Q=Q))) == pytest.approx(want, rel=1e-12)
    # the informed (semantic) start is the teacher's direction, the positional one 1/√d
    np.testing.assert_array_equal(problem.init(jax.random.key(1)).Q[:, 0], q_star)
    positional = PositionalSemanticTask(dim=d, alpha=1.5).sample(jax.random.key(0)).problem
    np.testing.assert_allclose(positional.init(jax.random.key(1)).Q, np.ones((d, 1)) / math.sqrt(d))
    m = overlaps(QueryParams(Q=Q), Q_star)
    assert float(m["m"]) == pytest.approx(abs(Q[:, 0].sum()) / d, rel=1e-12)
    assert float(m["theta"]) == pytest.approx(abs(q_star @ Q[:, 0]) / d, rel=1e-12)


def test_positional_semantic_gradient_equals_finite_differences(rng):
    task = PositionalSemanticTask(dim=4, alpha=2.0, omega=0.2, start="random")
    _, problem = task.sample(jax.random.key(2))
    Q = rng.standard_normal((4, 1))
    _, grad = problem.loss_and_grad(QueryParams(Q=Q))
    h = 1e-6
    for p in range(4):
        e = np.zeros_like(Q)
        e[p, 0] = h
        up, down = (float(problem.loss(QueryParams(Q=Q + s * e))) for s in (1, -1))
        assert float(grad.Q[p, 0]) == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-10)


def test_linear_baseline_minimises_its_loss(rng):
    """The closed form is where the loop-written objective's gradient vanishes, and no
    perturbation of it lowers that objective."""
    n, d, lmbda = 9, 5, 0.3
    Z, Y = rng.standard_normal((n, 2, d)), rng.standard_normal((n, 2, d))
    B = np.asarray(linear_baseline(Z, Y, lmbda))

    def objective(B):
        total = 0.0
        for i, f, j in itertools.product(range(n), range(2), range(d)):
            total += (sum(B[f, k] * Z[i, k, j] for k in range(2)) - Y[i, f, j]) ** 2
        return total / (2 * d) + lmbda / 2 * np.sum(B**2)

    h = 1e-6
    for f, k in itertools.product(range(2), range(2)):
        e = np.zeros((2, 2))
        e[f, k] = h
        assert (objective(B + e) - objective(B - e)) / (2 * h) == pytest.approx(0, abs=1e-7)
        assert objective(B + 1e3 * e) > objective(B)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="start"):
        PositionalSemanticTask(dim=4, start="nowhere")
    with pytest.raises(ValueError, match="rank 1"):
        PositionalSemanticTask(dim=4, start="semantic", rank=2)
    with pytest.raises(ValueError, match="omega"):
        PositionalSemanticTask(dim=4, omega=1.5)
    with pytest.raises(ValueError, match="samples"):
        AIMTask(dim=4, alpha=0.01)  # ⌊0.01·16⌋ = 0 sequences


@pytest.mark.parametrize(
    "task,learner",
    [
        (AIMTask(dim=6, tokens=2, alpha=0.5), mh.GDConfig(optimizer="adam", lr=0.1, steps=60)),
        (
            PositionalSemanticTask(dim=8, alpha=2.0, start="positional", test_samples=50),
            mh.GDConfig(optimizer="gd", lr=0.15, steps=60),
        ),
    ],
    ids=["aim-adam", "positional-gd"],
)
def test_batched_fits_are_finite_repeatable_and_lower_the_loss(task, learner):
    a = mh.simulate(jax.random.key(3), task, learner, 3)
    b = mh.simulate(jax.random.key(3), task, learner, 3, chunk_size=1)
    for name, value in a.metrics.items():
        assert np.all(np.isfinite(value)), name
        np.testing.assert_array_equal(value, b.metrics[name], err_msg=name)
    loss = a.trace["loss"]
    assert np.all(loss[:, -1] < loss[:, 0])
    ds = a.to_xarray()
    for name in ("mse", "test_error", "m", "theta"):
        if name in ds:
            assert ds[name].attrs["description"] != "Not documented.", name
