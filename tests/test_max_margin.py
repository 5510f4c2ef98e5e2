"""The experiment of Tarzanagh et al. ("Transformers as Support Vector Machines") through the
package, against an independent float64 loop written here in the paper's own convention
(f(X) = vᵀXᵀ softmax(X W z), W trained alone from 0 by normalised GD, η = 0.1, 2000 steps,
n = 6, T = 8, d = 10), with W_mm from Lawson–Hanson least distance."""

import jax
import numpy as np
import pytest
from scipy.optimize import nnls

import mhalearn as mh
from mhalearn.experiments import STUDIES, run_study
from mhalearn.experiments.max_margin import (
    selection_path,
    selection_problem,
    token_selection_learner,
)

SEEDS, N, T, D, STEPS, LR = 20, 6, 8, 10, 2000, 0.1
CHECKS = (10, 100, 1000, 2000)


def unit(rng, shape):
    g = rng.standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def peer_data(seed):
    rng = np.random.default_rng(seed)
    return {
        "X": unit(rng, (N, T, D)),
        "y": np.where(rng.random(N) < 0.5, -1.0, 1.0),
        "Z": unit(rng, (N, D)),
        "V": unit(rng, (1, D)),
    }


def peer_loop(data):
    """Normalised GD on W in the paper's convention, a_ij = x_ijᵀ W z_i; the softmax's
    derivative in its pairwise form s_k Σ_j s_j (g_k − g_j). Returns W at the checkpoints."""
    X, y, Z, v = data["X"], data["y"], data["Z"], data["V"][0]
    W = np.zeros((D, D))
    kept = {}
    for step in range(1, STEPS + 1):
        grad = np.zeros((D, D))
        for i in range(N):
            a = X[i] @ W @ Z[i]
            s = np.exp(a - a.max())
            s /= s.sum()
            g = X[i] @ v
            f = s @ g
            dloss = -y[i] / (1 + np.exp(y[i] * f)) / N
            da = s * (s @ (dloss * (g[:, None] - g[None, :])).T)
            grad += np.outer(X[i].T @ da, Z[i])
        W = W - LR * grad / np.linalg.norm(grad)
        if step in CHECKS:
            kept[step] = W.copy()
    return kept


def peer_svm(data, selected):
    """min ‖W‖_F s.t. (x_opt − x_j)ᵀ W z_i ≥ 1, by NNLS on the least-distance problem."""
    X, Z = data["X"], data["Z"]
    G = np.array(
        [
            np.outer(X[i, selected[i]] - X[i, j], Z[i]).ravel()
            for i in range(N)
            for j in range(T)
            if j != selected[i]
        ]
    )
    E = np.vstack([G.T, np.ones(len(G))])
    f = np.zeros(len(E))
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * E.shape[1])
    r = E @ u - f
    return (-r[:-1] / r[-1]).reshape(D, D)


def correlation(A, B):
    return np.sum(A * B) / (np.linalg.norm(A) * np.linalg.norm(B))


@pytest.mark.slow
def test_peer_recipe_through_the_package_equals_an_independent_loop():
    datas = [peer_data(seed) for seed in range(SEEDS)]
    stacked = {k: np.stack([d[k] for d in datas]) for k in datas[0]}
    task = mh.UserTask(problem=selection_problem, data=mh.PerInstance(stacked))
    learner = token_selection_learner(STEPS, LR, CHECKS)

    def run(keys, spec):
        _, problem = spec["task"].sample(keys.problem)
        return selection_path(keys.fit, problem, spec["learner"])

    res = mh.measure(jax.random.key(0), run, {"task": task, "learner": learner}, SEEDS)
    steps = res.trace_steps.tolist()
    assert steps == [0, *CHECKS]
    ours = res.trace["correlation"]  # (seeds, snapshots)

    theirs = np.zeros((SEEDS, len(CHECKS)))
    for seed, data in enumerate(datas):
        path = peer_loop(data)
        a = np.einsum("ntd,de,ne->nt", data["X"], path[STEPS], data["Z"])
        W_mm = peer_svm(data, a.argmax(1))
        theirs[seed] = [correlation(path[s], W_mm) for s in CHECKS]

    for column, step in enumerate(CHECKS[:3]):
        np.testing.assert_allclose(
            ours[:, 1 + column], theirs[:, column], rtol=0, atol=1e-6, err_msg=f"step {step}"
        )
    assert np.sum(theirs[:, -1] > 0.99) >= 18
    assert np.sum(ours[:, -1] > 0.99) >= 18
    # the correlation grows along the path: the test could have failed at any checkpoint
    assert np.all(np.diff(np.mean(ours[:, 1:], axis=0)) > 0)
    assert np.mean(ours[:, 1]) < 0.7


@pytest.mark.slow
def test_max_margin_study_at_ci_size():
    study = STUDIES["max_margin"].preset("tiny")
    ds = run_study(study)
    assert set(ds["heads"].values) == {1, 2}
    assert ds["trace_correlation"].dims[-2:] == ("instance", "step")
    assert np.all(ds["svm_worst_margin"].values > 1 - 1e-5)
    assert np.all(np.abs(ds["trace_correlation"].values) <= 1 + 1e-12)
    with pytest.raises(ValueError, match="NxTxD"):
        STUDIES["max_margin"](shape=("6x8",))
