import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import mhalearn as mh
from mhalearn.learners import chen_li as cl

CONFIG = cl.ChenLiConfig()


def teacher_problem(heads, beta=4.0, samples=1000, key=0, dim=8, tokens=4):
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=heads, dim=dim, tokens=tokens, beta=beta), samples=samples
    )
    return task.sample(jax.random.key(key))


def test_crude_estimate_is_exact_in_expectation_for_uniform_attention(rng):
    X = rng.choice([-1.0, 1.0], size=(20000, 4, 6))
    sum_w = rng.standard_normal((6, 6))
    Y = np.repeat(X.mean(axis=1, keepdims=True), 4, axis=1) @ sum_w  # Θ = 0
    M0 = cl.crude_sum_w(X, Y)
    assert np.linalg.norm(M0 - sum_w) / np.linalg.norm(sum_w) < 0.05


def test_row_matches_equal_loop_reference(rng):
    X = rng.choice([-1.0, 1.0], size=(5, 4, 2))  # dim 2: repeated tokens are common
    S = rng.standard_normal((2, 2))
    Y = rng.standard_normal((5, 4, 2))
    best, res, gap = cl.row_matches(X, Y, S)
    for n, a in itertools.product(range(5), range(4)):
        dist = [np.linalg.norm(Y[n, a] - X[n, b] @ S) for b in range(4)]
        b = int(np.argmin(dist))
        others = [dist[c] for c in range(4) if not np.array_equal(X[n, c], X[n, b])]
        assert best[n, a] == b and res[n, a] == pytest.approx(dist[b])
        assert gap[n, a] == pytest.approx(min(others) - dist[b] if others else np.inf)


def test_certification_is_sound():
    # with the true ΣW, every certified row really has every head on the certified token
    for heads, beta in [(1, 4.0), (2, 8.0), (3, 8.0)]:
        teacher, problem = teacher_problem(heads, beta)
        cert = cl.certify(problem.X, problem.Y, teacher.W.sum(0), CONFIG)
        assert int(cert.certified.sum()) > 10
        A = jax.vmap(mh.attention_weights, in_axes=(0, None))(problem.X, teacher.theta)
        n, a = np.nonzero(np.asarray(cert.certified))
        for i, j in zip(n, a, strict=True):
            same = np.all(problem.X[i] == problem.X[i, cert.token[i, j]], axis=-1)
            assert np.all(A[i, :, j][:, same].sum(-1) >= 1 - CONFIG.delta)


def test_sum_w_refinement_converges_on_documented_case():
    # (dim, tokens, heads, β, samples) = (8, 4, 2, 4, 1000), key 0: 1.43 → 4e-4 in 30 rounds
    teacher, problem = teacher_problem(2)
    truth = teacher.W.sum(0)
    S0 = cl.crude_sum_w(problem.X, problem.Y)
    S, history = cl.refine_sum_w(problem.X, problem.Y, S0, CONFIG)
    err = lambda s: float(jnp.linalg.norm(s - truth) / jnp.linalg.norm(truth))  # noqa: E731
    assert err(S0) > 1.0 and err(S) < 0.01
    assert history.shape == (CONFIG.refit_rounds, 8, 8)


def brute_min_norm(G, b):
    cons = {"type": "ineq", "fun": lambda t: G @ t - b, "jac": lambda t: G}
    res = scipy.optimize.minimize(
        lambda t: 0.5 * t @ t,
        np.zeros(G.shape[1]),
        jac=lambda t: t,
        constraints=[cons],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    return res.x


@pytest.mark.parametrize("seed", range(4))
def test_min_norm_point_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((12, 5))
    G[:, 0] = np.abs(G[:, 0]) + 0.5  # feasible: a large multiple of e_0 satisfies all
    valid = rng.random(12) < 0.8
    got = cl.min_norm_point(G, valid, jnp.asarray(1.3), iterations=20000)
    want = brute_min_norm(G[valid], 1.3)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.all(G[valid] @ np.asarray(got) >= 1.3 - 1e-6)


def test_constraints_are_deduplicated_and_valid():
    teacher, problem = teacher_problem(1, dim=4, tokens=3, samples=400)
    cert = cl.certify(problem.X, problem.Y, teacher.W.sum(0), CONFIG)
    K = cl.constraints(jax.random.key(0), problem.X, cert, CONFIG)
    kept = np.asarray(K.G)[np.asarray(K.valid)]
    assert len(kept) == len(np.unique(kept, axis=0)) > 0
    assert np.all(np.any(kept != 0, axis=1))
    # every true head lies in K (soundness of certification carries over to the constraints)
    margins = kept @ np.asarray(teacher.theta).reshape(1, -1).T
    assert np.all(margins >= float(K.bound) - 1e-9)


def test_pipeline_recovers_one_head_and_reports_honestly():
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=1, dim=8, tokens=4), samples=1000, test_samples=64
    )
    res = mh.simulate(jax.random.key(0), task, cl.ChenLiConfig(candidates=2), 3)
    assert np.all(res.metrics["success"]) and np.all(res.metrics["info_accepted"])
    assert np.all(res.metrics["certified_sound"] >= 0.99)  # scored by the task, with the truth
    for heads in (2, 3):
        task = mh.RegressionTask(
            teacher=mh.TeacherSpec(heads=heads, dim=6, tokens=3), samples=300, test_samples=32
        )
        res = mh.simulate(jax.random.key(1), task, cl.ChenLiConfig(candidates=2, span_subsets=3), 2)
        assert res.metrics["info_accepted"].dtype == bool  # failures are data, not exceptions
        for name in ("info_rows_certified", "info_constraints_kept"):  # its own diagnostics
            assert np.all(np.isfinite(res.metrics[name].astype(float))), name
        for name in ("span_angle_estimate", "refined_sum_w_error", "min_norm_in_span"):
            assert np.all(np.isfinite(res.metrics[name])), name  # its estimates, scored
        # accepted ⇒ the certificate holds: training cost within accept_tol·mean(Y²), so the
        # normalised prediction error is small too
        acc = res.metrics["info_accepted"]
        np.testing.assert_allclose(
            res.metrics["info_candidate_cost"], res.metrics["train_loss"], rtol=1e-9, atol=1e-18
        )
        assert np.all(res.metrics["prediction_error"][acc] < 1e-4)


def test_refinement_restarts_keep_the_lowest_trimmed_residual():
    # (8, 4, 2), β = 4, key 3: the single start stalls (error 0.53); a perturbed start does not
    teacher, problem = teacher_problem(2, key=3)
    truth = teacher.W.sum(0)
    S0 = cl.crude_sum_w(problem.X, problem.Y)
    single, _ = cl.refine_sum_w(problem.X, problem.Y, S0, CONFIG)
    best, scores = cl.refine_sum_w_restarts(jax.random.key(9), problem.X, problem.Y, S0, CONFIG)
    score = lambda s: float(cl.trimmed_residual(problem.X, problem.Y, s, CONFIG.quantile_end))  # noqa: E731
    assert score(best) == pytest.approx(float(np.min(scores))) and score(best) <= score(single)
    err = lambda s: float(jnp.linalg.norm(s - truth) / jnp.linalg.norm(truth))  # noqa: E731
    assert err(single) > 0.3 and err(best) < 0.01


def reference_share(res, share):
    flat = np.asarray(res).reshape(-1)
    keep = max(int(np.ceil(share * flat.size)), 1)
    order = np.argsort(np.where(np.isnan(flat), np.inf, flat), kind="stable")
    mask = np.zeros(flat.size, bool)
    mask[order[:keep]] = True
    return mask.reshape(np.shape(res))


@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3])
def test_smallest_share_keeps_at_least_one_row_when_residuals_tie(value):
    # tied residuals: jnp.quantile interpolates between equal order statistics and can round
    # below their value (0.7 at share 0.001 in float64), and `res <= quantile` kept no row
    res = jnp.full((50, 4), value)
    shares = jnp.array([0.001, 0.005, 0.3, 0.5, 1.0])
    vmapped = jax.vmap(lambda s: cl.smallest_share(res, s))(shares)
    for share, mask in zip(shares, vmapped, strict=True):
        expected = reference_share(res, float(share))
        np.testing.assert_array_equal(cl.smallest_share(res, share), expected)
        np.testing.assert_array_equal(mask, expected)
        assert expected.sum() >= 1


def test_smallest_share_ranks_nan_last(rng):
    res = rng.random((30, 4))
    res[rng.random((30, 4)) < 0.3] = np.nan
    for share in (0.01, 0.25, 0.9):  # the last keeps more rows than are finite
        np.testing.assert_array_equal(cl.smallest_share(res, share), reference_share(res, share))


def test_refinement_on_tied_residuals_stays_finite(rng):
    # every row's best residual is exactly 0.7 (integer ΣW with a zero first column, ±1 tokens,
    # an offset of 0.7 in that column) and the share is 0.001: the quantile threshold kept no
    # row there, and ΣW came out NaN; now one row is kept and ΣW is finite, vmapped and not
    X = rng.choice([-1.0, 1.0], size=(50, 4, 4))
    S = rng.integers(-3, 4, size=(4, 4)).astype(float) * 4
    S[:, 0] = 0.0
    Y = X @ S + np.array([0.7, 0.0, 0.0, 0.0])
    _, res, _ = cl.row_matches(X, Y, S)
    assert np.all(np.asarray(res) == 0.7)
    config = cl.ChenLiConfig(quantile_start=0.001, quantile_end=0.001, refit_rounds=1)
    _, history = cl.refine_sum_w(X, Y, jnp.asarray(S), config)
    assert np.all(np.isfinite(history))
    batched, _ = jax.vmap(lambda s: cl.refine_sum_w(X, Y, s, config))(jnp.stack([S, S]))
    assert np.all(np.isfinite(batched))


def test_refinement_restarts_never_keep_a_nan_start(monkeypatch):
    # a stand-in refinement that returns NaN from the first start: a finite start is kept
    _, problem = teacher_problem(2, samples=200)
    S0 = cl.crude_sum_w(problem.X, problem.Y)

    def fake(X, Y, s, config):
        return jnp.where(jnp.all(s == S0), jnp.nan, s), None

    monkeypatch.setattr(cl, "refine_sum_w", fake)
    best, scores = cl.refine_sum_w_restarts(jax.random.key(0), problem.X, problem.Y, S0, CONFIG)
    assert np.isnan(scores[0]) and np.all(np.isfinite(scores[1:]))
    assert np.all(np.isfinite(best))
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    both, _ = jax.vmap(lambda k: cl.refine_sum_w_restarts(k, problem.X, problem.Y, S0, CONFIG))(
        keys
    )
    assert np.all(np.isfinite(both))
