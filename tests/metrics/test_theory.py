import jax
import numpy as np
import pytest
import scipy.optimize

import mhalearn as mh
from mhalearn.metrics import theory
from mhalearn.params import movement

DEFAULT = mh.ClassifierSpec()


def classifier(rng, heads=3, tokens=4, dim=5, spec=DEFAULT, w_scale=0.5):
    W = w_scale * rng.standard_normal((heads, dim, dim))
    q = spec.queries(tokens)
    U = rng.standard_normal((heads, q, dim) if spec.readout == "matrix" else (heads, dim))
    prompt = rng.standard_normal(dim) if spec.query == "prompt" else None
    return mh.ClassifierParams(W=W, U=U, prompt=prompt)


@pytest.mark.slow
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


@pytest.mark.slow
def test_lanczos_extremes_equal_a_dense_hessian_score(rng):
    spec = mh.ClassifierSpec()
    params = classifier(rng, heads=2, tokens=3, dim=3)
    x = rng.standard_normal((3, 3))
    f = lambda p: mh.classifier_score(x, p.W, p.U, spec)  # noqa: E731
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    eig = np.linalg.eigvalsh(np.asarray(jax.hessian(lambda v: f(unravel(v)))(flat)))
    got = theory.hessian_extremes(f, params, jax.random.key(0))  # depth clipped to 36 here
    np.testing.assert_allclose([got.low, got.high], [eig.min(), eig.max()], rtol=1e-9)
    np.testing.assert_allclose(
        theory.hessian_spectral_norm(f, params, jax.random.key(0)), np.abs(eig).max(), rtol=1e-9
    )


@pytest.mark.slow
@pytest.mark.parametrize("depth", [10, 30])
def test_lanczos_survives_an_invariant_krylov_space(rng, depth):
    # a rank-3 operator in 30 dimensions: the Krylov space is invariant after 3 steps, and the
    # remaining steps must neither invent eigenvalues nor lose the true ones
    V = np.linalg.qr(rng.standard_normal((30, 3)))[0]
    A = V @ np.diag([-0.5, 0.2, 2.0]) @ V.T
    T, last = theory.lanczos_tridiagonal(lambda v: A @ v, jax.random.key(2), 30, depth, np.float64)
    ritz = np.linalg.eigvalsh(np.asarray(T))
    np.testing.assert_allclose([ritz.min(), ritz.max()], [-0.5, 2.0], rtol=1e-12)
    assert np.all((ritz >= -0.5 - 1e-12) & (ritz <= 2.0 + 1e-12))
    assert abs(float(last)) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("heads", [1, 4, 16])
def test_lanczos_weak_convexity_within_1e_3_of_a_dense_hessian_at_the_defaults(heads):
    # the step-size study's loss at its start (W = 0, Gaussian U), 96–1536 parameters: more
    # than the 64 Lanczos steps of the default at 4 and 16 heads
    mixture = mh.MixtureSpec(tokens=4, dim=8)
    data = mh.tokenized_mixture(jax.random.key(heads), mixture, 128)
    problem = mh.ClassificationProblem(X=data.X, y=data.y, spec=mh.ClassifierSpec(), heads=heads)
    params = mh.GDConfig().start(jax.random.key(7), problem)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    eig = np.linalg.eigvalsh(np.asarray(jax.hessian(lambda v: problem.loss(unravel(v)))(flat)))
    got = theory.hessian_extremes(problem.loss, params, jax.random.key(1))
    assert flat.size > theory.LANCZOS_MATVECS or heads == 1
    # Ritz residuals bound the distance to the nearest eigenvalue, which is the extreme one
    assert abs(float(got.low) - eig.min()) <= float(got.low_residual) + 1e-12
    assert abs(float(got.high) - eig.max()) <= float(got.high_residual) + 1e-12
    dense_ratio = -eig.min() / float(problem.loss(params))
    np.testing.assert_allclose(
        theory.weak_convexity_ratio(problem.loss, params, jax.random.key(1)),
        dense_ratio,
        rtol=1e-3,
    )
    # float32, as the studies run: still within 1e-3 of the float64 dense value
    params32 = jax.tree.map(lambda a: a.astype(np.float32), params)
    problem32 = mh.ClassificationProblem(
        X=data.X.astype(np.float32),
        y=data.y.astype(np.float32),
        spec=mh.ClassifierSpec(),
        heads=heads,
    )
    got32 = theory.weak_convexity_ratio(problem32.loss, params32, jax.random.key(1))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, dense_ratio, rtol=1e-3)


@pytest.mark.slow
def test_hessian_norm_falls_like_one_over_sqrt_heads():
    # at random initialisation with α_H = 1/√H and tokens of unit scale (as in the mixture):
    # √H·‖∇²Φ‖ stays of the same order across H (it grows only through the largest of H
    # per-head blocks, the Hessian being block diagonal over heads)
    spec = mh.ClassifierSpec()

    @jax.jit  # one compilation per head count
    def norm(params, x, key):
        score = lambda p: mh.classifier_score(x, p.W, p.U, spec)  # noqa: E731
        return theory.hessian_spectral_norm(score, params, key)

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
            values.append(float(norm(params, x, jax.random.key(seed))))
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


@pytest.mark.slow
def test_movement_and_stability_proxy(rng):
    start = classifier(rng)
    moved = mh.ClassifierParams(W=start.W + 0.1, U=start.U * 2)
    m = movement(moved, start)
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


@pytest.mark.slow
@pytest.mark.parametrize("decoys", [0, 1])
def test_decoys_make_the_mean_pooled_features_inseparable_but_not_the_attention_model(decoys):
    # W = 0: uniform attention, the U-part features are the token average (mean pooling)
    mixture = mh.MixtureSpec(tokens=4, dim=8, decoys=decoys, positions="fixed", noise=0.5)
    data = mh.tokenized_mixture(jax.random.key(0), mixture, 64)
    spec = mh.ClassifierSpec()
    U = np.random.default_rng(0).standard_normal((2, 4, 8))
    pooled = mh.ClassifierParams(W=np.zeros((2, 8, 8)), U=U)
    feats = theory.ntk_features(pooled, data.X, spec)["U"]
    separable = bool(theory.svm_margin(feats @ feats.T, data.y, 20000).separable)
    # without decoys the average carries the label's mean: mean pooling separates
    assert separable == (decoys == 0)
    # self-attention (W ∝ I) reads each position's own token: separable with decoys too
    attend = mh.ClassifierParams(W=np.broadcast_to(8.0 * np.eye(8), (2, 8, 8)), U=U)
    feats = theory.ntk_features(attend, data.X, spec)["U"]
    assert bool(theory.svm_margin(feats @ feats.T, data.y, 20000).separable)
