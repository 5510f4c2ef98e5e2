import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from tests import reference as ref

KEY = jax.random.key(11)


def sample_many(spec, n=64, key=KEY):
    keys = jax.random.split(key, n)
    return jax.jit(jax.vmap(lambda k: mh.sample_teacher_with_info(k, spec)))(keys)


# ---- brute-force references ------------------------------------------------------------


def brute_parameter_diagnostics(theta, W):
    theta, W = np.asarray(theta, np.float64), np.asarray(W, np.float64)
    m = len(theta)
    fro = lambda a: math.sqrt(sum(v * v for v in a.ravel()))  # noqa: E731
    w_norms = [fro(W[i]) for i in range(m)]
    t_norms = [fro(theta[i]) for i in range(m)]
    w_rms = math.sqrt(sum(v * v for v in w_norms) / m)
    t_rms = math.sqrt(sum(v * v for v in t_norms) / m)
    seps = [fro(theta[i] - theta[j]) for i, j in itertools.permutations(range(m), 2)]
    s = np.linalg.svd(W.sum(0), compute_uv=False)
    rows = np.stack([theta[i].ravel() / t_norms[i] for i in range(m)])
    return dict(
        w_norm=min(w_norms) / w_rms,
        separation=min(seps) / t_rms if seps else np.inf,
        sigma_ratio=s.min() / s.max(),
        theta_sv=np.linalg.svd(rows, compute_uv=False).min(),
        sum_w_norm=fro(W.sum(0)) / math.sqrt(sum(v * v for v in w_norms)),
    )


def brute_attention_statistics(X, theta, delta):
    A = ref.attention(X, X, theta)
    heads, tokens = A.shape[0], A.shape[1]
    maxes, entropies, agree = [], [], 0
    for q in range(tokens):
        for h in range(heads):
            maxes.append(max(A[h, q]))
            entropies.append(-sum(a * math.log(a) for a in A[h, q] if a > 0))
        values = {tuple(x) for x in X}
        for v in values:
            on_v = [
                sum(A[h, q, k] for k in range(tokens) if tuple(X[k]) == v) for h in range(heads)
            ]
            if min(on_v) >= 1 - delta:
                agree += 1
                break
    return np.mean(maxes), np.mean(entropies), agree / tokens


# ---- sampling ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", mh.FAMILIES)
def test_sampled_teachers_satisfy_enforced_thresholds(family):
    spec = mh.TeacherSpec(
        heads=3, dim=6, tokens=2 if family == "two_tokens" else 4, beta=4.0, family=family
    )
    teachers, info = sample_many(spec)
    assert np.all(info.accepted) and np.all(info.attempts >= 1)
    diag = jax.vmap(mh.parameter_diagnostics)(teachers.theta, teachers.W)
    enforced = mh.teachers._ENFORCED[family]
    for check, (value, floor) in {
        "w_norm": (diag.w_norm, spec.min_w_norm),
        "separation": (diag.separation, spec.min_separation),
        "sigma_ratio": (diag.sigma_ratio * spec.dim, spec.min_sigma_ratio),
        "theta_sv": (diag.theta_sv, spec.min_theta_sv),
    }.items():
        if check in enforced:
            assert np.all(np.asarray(value) >= floor), (check, np.min(value))


def test_checks_do_reject_and_resample():
    # a demanding ΣW threshold makes first draws fail; every returned teacher still passes
    spec = mh.TeacherSpec(heads=2, dim=6, tokens=4, min_sigma_ratio=1.0)
    teachers, info = sample_many(spec)
    assert np.max(info.attempts) > 1 and np.all(info.accepted)
    diag = jax.vmap(mh.parameter_diagnostics)(teachers.theta, teachers.W)
    assert np.all(np.asarray(diag.sigma_ratio) * 6 >= 1.0)
    # a threshold no draw meets (perfectly conditioned ΣW) is reported, not hidden; one above
    # the ratio's ceiling is refused (tests/test_validation.py)
    impossible = mh.TeacherSpec(heads=2, dim=4, tokens=4, min_sigma_ratio=4.0, max_attempts=5)
    _, info = mh.sample_teacher_with_info(KEY, impossible)
    assert not info.accepted and info.attempts == 5


@pytest.mark.parametrize(
    "family, demanding",
    [
        ("random", dict(min_sigma_ratio=0.8)),
        pytest.param("near_duplicate", dict(min_sigma_ratio=0.8), marks=pytest.mark.slow),
        pytest.param("ill_conditioned", dict(min_theta_sv=0.8), marks=pytest.mark.slow),
        pytest.param("rank_one", dict(min_sigma_ratio=0.8), marks=pytest.mark.slow),
    ],
)
def test_side_by_side_draws_give_the_loops_teachers(family, demanding):
    # the accelerator form (candidates drawn at once, the first accepted kept, the loop only
    # for an instance none of them passes) against the CPU form (one draw at a time): the same
    # draws accepted, and the same teachers to rounding (XLA may fuse a family's sums over
    # heads differently when the draws are batched). A demanding threshold (of a check the
    # family enforces) makes some instances need more draws than the candidates, so the
    # fallback loop runs too.
    spec = mh.TeacherSpec(heads=3, dim=5, tokens=4, family=family, **demanding)
    keys = jax.random.split(KEY, 64)

    def draw(candidates):
        return jax.jit(
            jax.vmap(lambda k: mh.sample_teacher_with_info(k, spec, candidates=candidates))
        )(keys)

    (loop, loop_info), (wide, wide_info) = draw(1), draw(3)
    assert np.max(loop_info.attempts) > 3 and np.min(loop_info.attempts) == 1
    np.testing.assert_array_equal(wide_info.attempts, loop_info.attempts)
    np.testing.assert_array_equal(wide_info.accepted, loop_info.accepted)
    chex.assert_trees_all_close(wide, loop, rtol=1e-13, atol=1e-13)
    # a spec no draw passes: every form returns the last draw, flagged, after max_attempts
    impossible = mh.TeacherSpec(heads=2, dim=4, tokens=4, min_sigma_ratio=4.0, max_attempts=5)
    last = jax.jit(
        lambda k: [mh.sample_teacher_with_info(k, impossible, candidates=c) for c in (1, 2, 5, 9)]
    )(KEY)
    for teacher, info in last:
        assert not info.accepted and info.attempts == 5
        chex.assert_trees_all_equal(teacher, last[0][0])


def test_draw_scales():
    spec = mh.TeacherSpec(heads=2, dim=8, tokens=4, beta=3.0, w_scale=2.0)
    draws = jax.vmap(lambda k: mh.draw_teacher(k, spec))(jax.random.split(KEY, 400))
    theta_norm2 = np.sum(np.asarray(draws.theta) ** 2, axis=(-2, -1))  # E = β² exactly
    w_norm2 = np.sum(np.asarray(draws.W) ** 2, axis=(-2, -1))  # E = w_scale² · dim
    np.testing.assert_allclose(theta_norm2.mean(), 9.0, rtol=0.05)
    np.testing.assert_allclose(w_norm2.mean(), 4.0 * 8, rtol=0.05)


@pytest.mark.slow
def test_stress_families_have_their_defining_property():
    base = dict(heads=3, dim=6, tokens=4, beta=4.0, stress_eps=0.01)
    near, _ = sample_many(mh.TeacherSpec(family="near_duplicate", **base), n=16)
    gap = np.linalg.norm(np.asarray(near.theta[:, 1] - near.theta[:, 0]), axis=(-2, -1))
    assert np.all(gap < 0.05 * 4.0)
    ill, _ = sample_many(mh.TeacherSpec(family="ill_conditioned", **base), n=16)
    d = jax.vmap(mh.parameter_diagnostics)(ill.theta, ill.W)
    assert np.all(np.asarray(d.sum_w_norm) < 0.05)
    rank1, _ = sample_many(mh.TeacherSpec(family="rank_one", **base), n=16)
    s = np.linalg.svd(np.asarray(rank1.theta), compute_uv=False)
    np.testing.assert_allclose(s[..., 0], 4.0, rtol=1e-10)
    assert np.all(s[..., 1] < 1e-10)
    plain, _ = sample_many(mh.TeacherSpec(**base), n=16)
    assert np.all(
        np.asarray(jax.vmap(mh.parameter_diagnostics)(plain.theta, plain.W).sum_w_norm) > 0.2
    )


@pytest.mark.slow
def test_sampling_vmaps_over_keys_and_beta():
    spec = mh.TeacherSpec(heads=2, dim=5, tokens=3)
    keys = jax.random.split(KEY, 5)
    batched = jax.vmap(lambda k: mh.sample_teacher(k, spec))(keys)
    for i in range(5):
        single = mh.sample_teacher(keys[i], spec)
        np.testing.assert_allclose(batched.theta[i], single.theta, rtol=1e-14)
        np.testing.assert_allclose(batched.W[i], single.W, rtol=1e-14)
    # β is a leaf: a sweep over β compiles once and matches specs built one by one
    betas = jnp.array([1.0, 2.0, 8.0])

    def teachers_for(beta):
        return jax.vmap(
            lambda b: mh.sample_teacher(KEY, mh.TeacherSpec(heads=2, dim=5, tokens=3, beta=b))
        )(beta)

    sweep = jax.jit(chex.assert_max_traces(teachers_for, n=1))
    out = sweep(betas)
    sweep(betas * 2)
    for i, b in enumerate([1.0, 2.0, 8.0]):
        np.testing.assert_allclose(
            out.theta[i],
            mh.sample_teacher(KEY, mh.TeacherSpec(heads=2, dim=5, tokens=3, beta=b)).theta,
            rtol=1e-12,
        )


def test_same_key_same_teacher_float32():
    spec = mh.TeacherSpec(heads=2, dim=5, tokens=3)
    a = mh.sample_teacher(KEY, spec)
    b = mh.sample_teacher(KEY, spec)
    np.testing.assert_array_equal(a.theta, b.theta)


# ---- diagnostics against brute force ----------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_parameter_diagnostics_equal_brute_force(rng, heads):
    theta = rng.standard_normal((heads, 5, 5))
    W = rng.standard_normal((heads, 5, 5))
    got = mh.parameter_diagnostics(theta, W)
    want = brute_parameter_diagnostics(theta, W)
    for name, value in want.items():
        np.testing.assert_allclose(getattr(got, name), value, rtol=1e-10, err_msg=name)


@pytest.mark.parametrize("heads,tokens,dim,beta", [(3, 5, 3, 6.0), (2, 4, 2, 20.0), (1, 3, 4, 2.0)])
def test_attention_statistics_equal_brute_force(rng, heads, tokens, dim, beta):
    # small dim so that Boolean tokens repeat and the merging of identical tokens matters
    theta = beta / dim * rng.standard_normal((heads, dim, dim))
    for _ in range(5):
        X = rng.choice([-1.0, 1.0], size=(tokens, dim))
        got = mh.attention_statistics(X, theta, 0.1)
        want = brute_attention_statistics(X, theta, 0.1)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_teacher_diagnostics_average_over_fresh_inputs(rng):
    spec = mh.TeacherSpec(heads=2, dim=3, tokens=4, beta=8.0)
    teacher = mh.sample_teacher(KEY, spec)
    key = jax.random.key(3)
    diag = mh.teacher_diagnostics(key, teacher, spec, samples=40, delta=0.2)
    X = mh.boolean_tokens(key, (40, 4, 3))
    stats = np.array([brute_attention_statistics(np.asarray(x), teacher.theta, 0.2) for x in X])
    np.testing.assert_allclose(
        [diag.mean_max_attention, diag.attention_entropy, diag.agreement], stats.mean(0), rtol=1e-10
    )
    # near-uniform attention at small β, near-hard at large β
    soft_spec = mh.TeacherSpec(heads=2, dim=8, tokens=4, beta=0.1)
    soft = mh.teacher_diagnostics(key, mh.sample_teacher(KEY, soft_spec), soft_spec, samples=64)
    assert soft.attention_entropy > 0.97 * math.log(4) and soft.agreement == 0


@pytest.mark.slow
def test_agreement_falls_with_heads():
    # the concrete face of the exponential cost in heads (RESEARCH.md §1: 0.45, 0.062, 0.0095)
    shares = []
    for heads in (1, 2, 3):
        spec = mh.TeacherSpec(heads=heads, dim=8, tokens=4, beta=4.0)
        teachers, _ = sample_many(spec, n=32)
        keys = jax.random.split(jax.random.key(5), 32)
        d = jax.jit(jax.vmap(lambda k, t, s=spec: mh.teacher_diagnostics(k, t, s, samples=256)))(
            keys, teachers
        )
        shares.append(float(np.mean(d.agreement)))
    assert shares[0] > 3 * shares[1] > 9 * shares[2] > 0, shares


# ---- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(heads=0, dim=4, tokens=3), "heads must be an integer >= 1, received 0"),
        (dict(heads=2, dim=-1, tokens=3), "dim must be an integer >= 1, received -1"),
        (dict(heads=2, dim=4, tokens=0), "tokens must be an integer >= 1"),
        (dict(heads=2, dim=4, tokens=3, beta=-1.0), "beta must lie in"),
        (dict(heads=2, dim=4, tokens=3, w_scale=0.0), "w_scale must lie in"),
        (dict(heads=2, dim=4, tokens=3, family="adversarial"), "family must be one of"),
        (dict(heads=2, dim=4, tokens=3, inputs="uniform"), "inputs must be one of"),
        (dict(heads=1, dim=4, tokens=3, family="near_duplicate"), "needs heads >= 2"),
        (dict(heads=2, dim=4, tokens=3, family="two_tokens"), "needs tokens == 2"),
    ],
)
def test_teacher_spec_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        mh.TeacherSpec(**kwargs)


def test_diagnostics_validation():
    spec = mh.TeacherSpec(heads=2, dim=4, tokens=3)
    t = mh.sample_teacher(KEY, spec)
    with pytest.raises(ValueError, match="delta must lie in"):
        mh.teacher_diagnostics(KEY, t, spec, delta=0.7)
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        mh.teacher_diagnostics(KEY, t, spec, samples=0)
