"""The attention SVM and token selection (mhalearn.metrics.selection) against independent
solvers: cvxpy (Clarabel) for both norms, and Lawson–Hanson NNLS on the least-distance
problem for the Frobenius norm (an exact active-set method)."""

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import nnls

from mhalearn.metrics.selection import (
    attention_svm,
    direction_correlation,
    selected_tokens,
    selected_weight,
    token_scores,
)


def unit(rng, shape):
    g = rng.standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def problem(rng, n, T, d):
    X, Z = unit(rng, (n, T, d)), unit(rng, (n, d))
    selected = np.asarray(selected_tokens(jnp.asarray(rng.standard_normal((d, d))), X, Z))
    return X, Z, selected


def constraint_rows(X, Z, selected):
    """Rows vec(z_i (x_opt − x_j)ᵀ), one per constraint, in a Python loop."""
    rows = []
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            if j != selected[i]:
                rows.append(np.outer(Z[i], X[i, selected[i]] - X[i, j]).ravel())
    return np.array(rows)


def least_distance(G):
    """min ‖w‖ s.t. G w ≥ 1 by NNLS (Lawson & Hanson, ch. 23): u ≥ 0 minimising
    ‖[Gᵀ; 1ᵀ] u − e‖, then w = −r[:p] / r[p] with r the residual."""
    E = np.vstack([G.T, np.ones(G.shape[0])])
    f = np.zeros(E.shape[0])
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * E.shape[1])
    r = E @ u - f
    return -r[:-1] / r[-1]


def cvxpy_svm(X, Z, selected, norm):
    d = X.shape[-1]
    W = cp.Variable((d, d))
    G = constraint_rows(X, Z, selected)
    objective = cp.norm(W, "fro") if norm == "fro" else cp.normNuc(W)
    cp.Problem(cp.Minimize(objective), [G @ cp.vec(W, order="C") >= 1]).solve(solver=cp.CLARABEL)
    return W.value


@pytest.mark.slow
@pytest.mark.parametrize("n,T,d", [(6, 8, 10), (20, 8, 4), (12, 16, 3)])
def test_frobenius_svm_equals_least_distance_and_cvxpy(rng, n, T, d):
    X, Z, selected = problem(rng, n, T, d)
    svm = jax.jit(attention_svm, static_argnames="norm")(X, Z, selected, norm="fro")
    exact = least_distance(constraint_rows(X, Z, selected)).reshape(d, d)
    assert bool(svm.polished)
    np.testing.assert_allclose(svm.W, exact, rtol=0, atol=1e-9 * np.abs(exact).max())
    reference = cvxpy_svm(X, Z, selected, "fro")
    np.testing.assert_allclose(svm.W, reference, atol=1e-5 * np.abs(exact).max())
    assert float(svm.worst_margin) == pytest.approx(1.0, abs=1e-10)
    assert abs(float(svm.gap)) < 1e-10
    assert float(svm.objective) == pytest.approx(np.linalg.norm(exact), rel=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("n,T,d", [(6, 8, 10), (20, 8, 4)])
def test_nuclear_svm_equals_cvxpy_and_certifies_itself(rng, n, T, d):
    X, Z, selected = problem(rng, n, T, d)
    svm = attention_svm(X, Z, selected, "nuclear")
    reference = cvxpy_svm(X, Z, selected, "nuclear")
    nuclear = lambda W: np.linalg.svd(W, compute_uv=False).sum()  # noqa: E731
    assert float(svm.objective) == pytest.approx(nuclear(reference), rel=1e-6)
    assert float(direction_correlation(svm.W, jnp.asarray(reference))) > 1 - 1e-9
    assert float(svm.worst_margin) > 1 - 1e-8
    assert 0 <= float(svm.gap) < 1e-6  # weak duality: a valid lower bound, nearly tight
    # the two norms give different solutions here: the test can tell them apart
    fro = attention_svm(X, Z, selected, "fro")
    assert float(direction_correlation(fro.W, svm.W)) < 0.999


def test_selection_scores_weights_and_correlation_in_loops(rng):
    n, T, d = 5, 4, 3
    X, Z = unit(rng, (n, T, d)), unit(rng, (n, d))
    W = rng.standard_normal((d, d))
    scores = np.array([[Z[i] @ W @ X[i, j] for j in range(T)] for i in range(n)])
    np.testing.assert_allclose(token_scores(W, X, Z), scores, rtol=1e-12)
    best = scores.argmax(1)
    np.testing.assert_array_equal(selected_tokens(W, X, Z), best)
    weights = np.exp(scores - scores.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    np.testing.assert_allclose(
        selected_weight(W, X, Z, best), weights[np.arange(n), best], rtol=1e-12
    )
    V = rng.standard_normal((d, d))
    cos = np.sum(W * V) / (np.linalg.norm(W) * np.linalg.norm(V))
    assert float(direction_correlation(W, V)) == pytest.approx(cos, rel=1e-12)
    assert float(direction_correlation(W, 3.0 * W)) == pytest.approx(1.0, rel=1e-12)
    assert float(direction_correlation(W, -W)) == pytest.approx(-1.0, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["fro", "nuclear"])
def test_a_solve_cut_short_is_feasible_and_its_gap_brackets_the_optimum(rng, norm):
    X, Z, selected = problem(rng, 20, 8, 4)
    rough = attention_svm(X, Z, selected, norm, iterations=30)
    D = constraint_rows(X, Z, selected)
    assert np.min(D @ np.asarray(rough.W).ravel()) == pytest.approx(1.0, abs=1e-12)
    assert not bool(rough.polished) and float(rough.gap) > 1e-6  # really cut short
    if norm == "fro":
        optimum = 0.5 * np.sum(least_distance(D) ** 2)
        primal = 0.5 * float(rough.objective) ** 2
    else:
        optimum = np.linalg.svd(cvxpy_svm(X, Z, selected, norm), compute_uv=False).sum()
        primal = float(rough.objective)
    assert primal * (1 - float(rough.gap)) <= optimum * (1 + 1e-7)
    assert optimum <= primal * (1 + 1e-7)
