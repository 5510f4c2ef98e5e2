import itertools
import math

import jax
import numpy as np
import optax
import pytest
import scipy.linalg
import scipy.optimize

import mhalearn as mh
from mhalearn.metrics import recovery
from tests import reference as ref


def layer(rng, heads, dim, scale=1.0):
    return mh.LayerParams(
        theta=scale * rng.standard_normal((heads, dim, dim)),
        W=scale * rng.standard_normal((heads, dim, dim)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("rows,cols", [(3, 3), (5, 5), (5, 3), (4, 2), (1, 1)])
def test_hungarian_equals_scipy(rng, rows, cols):
    costs = rng.standard_normal((16, rows, cols))
    # the assignment solver match_heads uses, under jit and vmap
    solve = jax.jit(jax.vmap(lambda c: c[optax.assignment.hungarian_algorithm(c)].sum()))
    got = solve(costs)
    for c, g in zip(costs, got, strict=True):
        r, k = scipy.optimize.linear_sum_assignment(c)
        np.testing.assert_allclose(g, c[r, k].sum(), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("student_heads,teacher_heads", [(2, 2), (3, 2), (4, 4), (5, 5), (6, 3)])
def test_match_heads_least_total_cost_equals_scipy(rng, student_heads, teacher_heads):
    # (2, 2), (3, 2), (4, 4): every pairing scored; (5, 5), (6, 3): the Hungarian algorithm
    enumerated = math.perm(student_heads, teacher_heads) <= recovery.ENUMERATED_PAIRINGS
    assert enumerated == (student_heads <= 4)
    students = [layer(rng, student_heads, 3) for _ in range(8)]
    teachers = [layer(rng, teacher_heads, 3) for _ in range(8)]
    stack = lambda ls: jax.tree.map(lambda *a: np.stack(a), *ls)  # noqa: E731
    s_idx, t_idx = jax.jit(jax.vmap(mh.match_heads))(stack(students), stack(teachers))
    for s, t, si, ti in zip(students, teachers, s_idx, t_idx, strict=True):
        cost = np.asarray(recovery.matching_cost(s, t))
        r, k = scipy.optimize.linear_sum_assignment(cost)
        np.testing.assert_array_equal(ti, np.arange(teacher_heads))
        assert len(set(np.asarray(si).tolist())) == teacher_heads  # distinct student heads
        np.testing.assert_allclose(cost[si, ti].sum(), cost[r, k].sum(), rtol=1e-12)


def brute_force_errors(student, teacher):
    """Best pairing by enumerating every assignment, then the errors in plain numpy."""
    th_s, w_s = np.asarray(student.theta), np.asarray(student.W)
    th_t, w_t = np.asarray(teacher.theta), np.asarray(teacher.W)
    m = len(th_t)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    best = min(
        itertools.permutations(range(len(th_s)), m),
        key=lambda p: sum(
            rel(th_s[p[j]], th_t[j]) ** 2 + rel(w_s[p[j]], w_t[j]) ** 2 for j in range(m)
        ),
    )
    t_err = [rel(th_s[best[j]], th_t[j]) for j in range(m)]
    w_err = [rel(w_s[best[j]], w_t[j]) for j in range(m)]
    angles = scipy.linalg.subspace_angles(th_t.reshape(m, -1).T, th_s.reshape(len(th_s), -1).T)
    return dict(
        theta_error_max=max(t_err),
        theta_error_mean=np.mean(t_err),
        w_error_max=max(w_err),
        w_error_mean=np.mean(w_err),
        sum_w_error=rel(w_s.sum(0), w_t.sum(0)),
        span_angle=angles.max(),
    ), best


@pytest.mark.slow
@pytest.mark.parametrize("student_heads,teacher_heads", [(3, 3), (4, 2), (2, 1), (3, 2)])
def test_parameter_errors_equal_brute_force(rng, student_heads, teacher_heads):
    teacher = layer(rng, teacher_heads, 3)
    for noise in (0.05, 1.0):  # near the teacher (a clear pairing) and far from it
        student = layer(rng, student_heads, 3)
        student = mh.LayerParams(
            theta=student.theta * noise
            + np.pad(teacher.theta, ((0, student_heads - teacher_heads), (0, 0), (0, 0))),
            W=student.W * noise
            + np.pad(teacher.W, ((0, student_heads - teacher_heads), (0, 0), (0, 0))),
        )
        perm = rng.permutation(student_heads)
        student = mh.LayerParams(theta=student.theta[perm], W=student.W[perm])
        got = mh.parameter_errors(student, teacher)
        want, best = brute_force_errors(student, teacher)
        s_idx, t_idx = mh.match_heads(student, teacher)
        np.testing.assert_array_equal(t_idx, np.arange(teacher_heads))
        np.testing.assert_array_equal(s_idx, best)
        for name, value in want.items():
            np.testing.assert_allclose(
                getattr(got, name), value, rtol=1e-9, atol=1e-12, err_msg=name
            )


def test_errors_invariant_to_permuting_student_heads(rng):
    teacher, student = layer(rng, 4, 5), layer(rng, 4, 5)
    base = mh.parameter_errors(student, teacher)
    for _ in range(5):
        perm = rng.permutation(4)
        moved = mh.parameter_errors(
            mh.LayerParams(theta=student.theta[perm], W=student.W[perm]), teacher
        )
        for name in base.__dataclass_fields__:
            np.testing.assert_allclose(getattr(moved, name), getattr(base, name), rtol=1e-12)
    exact = mh.parameter_errors(
        mh.LayerParams(theta=teacher.theta[::-1], W=teacher.W[::-1]), teacher
    )
    assert exact.theta_error_max == 0 and exact.w_error_max == 0 and exact.span_angle < 1e-7


def test_span_angle_small_angles_are_accurate():
    # span{e1} vs span{cos t e1 + sin t e2}: the angle is t, even for tiny t
    for t in (1e-9, 1e-4, 0.3, math.pi / 2):
        a = np.array([[1.0, 0.0, 0.0]])
        b = np.array([[math.cos(t), math.sin(t), 0.0]])
        np.testing.assert_allclose(recovery.largest_principal_angle(a, b), t, rtol=1e-7)
    # fewer student directions than teacher directions: some direction is missed entirely
    assert recovery.largest_principal_angle(np.eye(3)[:2], np.eye(3)[:1]) == pytest.approx(
        math.pi / 2
    )


def test_prediction_error_equals_loop_reference(rng):
    teacher, student = layer(rng, 3, 5, 0.4), layer(rng, 3, 5, 0.4)
    X = rng.choice([-1.0, 1.0], size=(6, 4, 5))
    num = sum(
        np.sum((ref.mha(x, student.theta, student.W) - ref.mha(x, teacher.theta, teacher.W)) ** 2)
        for x in X
    )
    den = sum(np.sum(ref.mha(x, teacher.theta, teacher.W) ** 2) for x in X)
    np.testing.assert_allclose(mh.prediction_error(student, teacher, X), num / den, rtol=1e-11)
    assert mh.prediction_error(teacher, teacher, X) == 0


def test_success_and_classification_errors(rng):
    errors = recovery.ParameterErrors(*(np.float64(v) for v in (1e-4, 0, 2e-3, 0, 0, 0)))
    assert not recovery.success(errors, 1e-3) and recovery.success(errors, 3e-3)
    scores, y = rng.standard_normal(50), rng.choice([-1.0, 1.0], 50)
    out = recovery.classification_errors(scores, y)
    np.testing.assert_allclose(out.loss, np.mean(np.log1p(np.exp(-y * scores))), rtol=1e-12)
    np.testing.assert_allclose(out.error, np.mean(np.sign(scores) != y), rtol=1e-12)


@pytest.mark.slow
def test_metrics_under_jit_and_vmap(rng):
    teachers = jax.vmap(lambda k: mh.sample_teacher(k, mh.TeacherSpec(heads=2, dim=4, tokens=3)))(
        jax.random.split(jax.random.key(0), 6)
    )
    students = jax.tree.map(lambda a: a[::-1], teachers)
    batched = jax.jit(jax.vmap(mh.parameter_errors))(students, teachers)
    for i in range(6):
        single = mh.parameter_errors(
            jax.tree.map(lambda a, i=i: a[i], students), jax.tree.map(lambda a, i=i: a[i], teachers)
        )
        np.testing.assert_allclose(batched.theta_error_max[i], single.theta_error_max, rtol=1e-12)


def test_match_heads_needs_enough_student_heads(rng):
    with pytest.raises(ValueError, match="student heads must be >= teacher heads"):
        mh.match_heads(layer(rng, 1, 3), layer(rng, 2, 3))
