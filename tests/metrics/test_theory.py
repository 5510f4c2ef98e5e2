import jax
import numpy as np
import pytest
import scipy.optimize

import mhalearn as mh
from mhalearn.metrics import theory

DEFAULT = mh.ClassifierSpec()


def classifier(rng, heads=3, tokens=4, dim=5, spec=DEFAULT, w_scale=0.5):
    W = w_scale * rng.standard_normal((heads, dim, dim))
    q = spec.queries(tokens)
    U = rng.standard_normal((heads, q, dim) if spec.readout == "matrix" else (heads, dim))
    prompt = rng.standard_normal(dim) if spec.query == "prompt" else None
    return mh.ClassifierParams(W=W, U=U, prompt=prompt)


@pytest.mark.parametrize(
    "spec", [mh.ClassifierSpec(), mh.ClassifierSpec(query="prompt", readout="vector")]
)
def test_ntk_gram_equals_explicit_per_sample_gradients(rng, spec):
    params = classifier(rng, spec=spec)
    X = rng.standard_normal((6, 4, 5))
    mask = np.array([1.0, 0.0, 1.0])
    feats = theory.ntk_features(params, X, spec, mask)
    rows = []
    for x in X:
        g = jax.grad(lambda p, x=x: mh.classifier_score(x, p.W, p.U, spec, p.prompt, mask))(params)
        parts = [np.ravel(g.U), np.ravel(g.W)] + (
            [np.ravel(g.prompt)] if spec.query == "prompt" else []
        )
        rows.append(np.concatenate(parts))
    rows = np.stack(rows)
    np.testing.assert_allclose(feats["all"], rows, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(theory.ntk_gram(feats["all"]), rows @ rows.T, rtol=1e-12)
    n_u = np.size(params.U)
    np.testing.assert_allclose(feats["U"], rows[:, :n_u], rtol=1e-12, atol=1e-14)


def brute_margin(features, y, feasible):
    """max_{‖w‖=1} min_i y_i⟨w, φ_i⟩ via the primal min ‖w‖² s.t. y_i⟨w, φ_i⟩ ≥ 1 (SLSQP),
    started from a feasible point."""
    A = y[:, None] * features
    start = feasible / np.min(A @ feasible)
    res = scipy.optimize.minimize(
        lambda w: w @ w,
        start,
        jac=lambda w: 2 * w,
        constraints=[{"type": "ineq", "fun": lambda w: A @ w - 1, "jac": lambda w: A}],
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert res.success
    return 1 / np.linalg.norm(res.x)


@pytest.mark.parametrize("seed", range(3))
def test_svm_margin_equals_brute_force_on_separable_data(seed):
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(4)
    features = rng.standard_normal((20, 4))
    y = np.sign(features @ w_true)
    features = features + 0.3 * y[:, None] * w_true / np.linalg.norm(w_true)  # widen the margin
    got = theory.svm_margin(features @ features.T, y, iterations=20000)
    assert bool(got.separable)
    np.testing.assert_allclose(got.margin, brute_margin(features, y, w_true), rtol=1e-4)


def test_svm_margin_flags_non_separable_data(rng):
    features = rng.standard_normal((20, 3))
    y = rng.choice([-1.0, 1.0], 20)
    features = np.concatenate([features, features])  # the same points with opposite labels
    y = np.concatenate([y, -y])
    got = theory.svm_margin(features @ features.T, y, iterations=3000)
    assert not bool(got.separable) and got.margin == 0


def test_power_iteration_equals_dense_hessian_norm(rng):
    spec = mh.ClassifierSpec()
    params = classifier(rng, heads=2, tokens=3, dim=3)
    x = rng.standard_normal((3, 3))
    f = lambda p: mh.classifier_score(x, p.W, p.U, spec)  # noqa: E731
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    dense = np.asarray(jax.hessian(lambda v: f(unravel(v)))(flat))
    eig = np.linalg.eigvalsh(dense)
    got = theory.hessian_spectral_norm(f, params, jax.random.key(0), iterations=500)
    np.testing.assert_allclose(got, np.abs(eig).max(), rtol=1e-6)
    low = theory.hessian_min_eigenvalue(f, params, jax.random.key(1), iterations=2000)
    np.testing.assert_allclose(low, eig.min(), rtol=1e-4, atol=1e-6)


def test_hessian_norm_falls_like_one_over_sqrt_heads():
    # at random initialisation with α_H = 1/√H and tokens of unit scale (as in the mixture):
    # √H·‖∇²Φ‖ stays of the same order across H (it grows only through the largest of H
    # per-head blocks, the Hessian being block diagonal over heads)
    spec = mh.ClassifierSpec()
    scaled = {}
    for heads in (1, 4, 16, 64):
        values = []
        for seed in range(16):
            r = np.random.default_rng(seed)
            params = mh.ClassifierParams(
                W=r.standard_normal((heads, 6, 6)) / 6,
                U=r.standard_normal((heads, 4, 6)) / np.sqrt(6),
            )
            x = r.standard_normal((4, 6)) / np.sqrt(6)
            f = lambda p, x=x: mh.classifier_score(x, p.W, p.U, spec)  # noqa: E731
            values.append(float(theory.hessian_spectral_norm(f, params, jax.random.key(seed), 60)))
        scaled[heads] = np.sqrt(heads) * np.median(values)
    ratios = np.array(list(scaled.values())) / scaled[1]
    assert np.all((ratios > 1 / 3) & (ratios < 3.0)), scaled
    assert scaled[64] / 8 < 0.5 * scaled[1]  # while ‖∇²Φ‖ itself falls several-fold


def test_relevant_attention_equals_loop_reference(rng):
    spec = mh.ClassifierSpec(query="first")
    params = classifier(rng, spec=spec, w_scale=1.0)
    X = rng.standard_normal((5, 4, 5))
    relevant = rng.random((5, 4)) < 0.5
    mask = np.array([1.0, 1.0, 0.0])
    total = []
    for n in range(5):
        for h in range(2):
            s = X[n, 0] @ params.W[h] @ X[n].T
            a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            total.append(a[relevant[n]].sum())
    np.testing.assert_allclose(
        theory.relevant_attention(params, X, relevant, spec, mask), np.mean(total), rtol=1e-12
    )


def test_movement_and_stability_proxy(rng):
    start = classifier(rng)
    moved = mh.ClassifierParams(W=start.W + 0.1, U=start.U * 2)
    m = theory.movement(moved, start)
    np.testing.assert_allclose(m["movement_W"], 0.1 * np.sqrt(start.W.size), rtol=1e-12)
    np.testing.assert_allclose(m["movement_U_relative"], 1.0, rtol=1e-12)
    # the proxy of a full-batch GD run: (η/n)·Σ_t L̂(θ_t) over the losses of its steps, which a
    # trace logged at every step holds (the last entry is the loss after the last step)
    task = mh.ClassificationTask(mixture=mh.MixtureSpec(tokens=4, dim=4), heads=2, samples=12)
    _, problem = task.sample(jax.random.key(0))
    config = mh.GDConfig(optimizer="gd", steps=7, lr=0.5, log_every=1)
    fit = config.fit(jax.random.key(1), problem)
    expected = 0.5 / 12 * float(np.sum(fit.trace.loss[:-1]))
    proxy = theory.stability_proxy(0.5, problem.samples, fit.info["loss_sum"])
    np.testing.assert_allclose(proxy, expected, rtol=1e-12)


def test_theory_quantities_vmap(rng):
    grams, ys = [], []
    for _ in range(3):
        f = rng.standard_normal((10, 4))
        y = np.sign(f[:, 0] + 0.5 * np.sign(f[:, 0]))
        grams.append(f @ f.T)
        ys.append(y)
    batched = jax.vmap(lambda g, y: theory.svm_margin(g, y, 3000))(np.stack(grams), np.stack(ys))
    for i in range(3):
        single = theory.svm_margin(grams[i], ys[i], 3000)
        np.testing.assert_allclose(batched.margin[i], single.margin, rtol=1e-10)
