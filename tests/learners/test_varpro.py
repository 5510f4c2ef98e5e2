import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.learners import linear, varpro
from tests import reference as ref


def astuple(system):
    return system.H, system.g


def small_problem(rng, samples=12, tokens=3, dim=4, heads=2):
    X = rng.choice([-1.0, 1.0], size=(samples, tokens, dim))
    Y = rng.standard_normal((samples, tokens, dim))
    theta = 0.5 * rng.standard_normal((heads, dim, dim))
    return mh.RegressionProblem(X=X, Y=Y, heads=heads), theta


def test_design_and_least_squares_values_equal_references(rng):
    problem, theta = small_problem(rng)
    Z = np.asarray(linear.design(problem.X, theta))
    for n in range(3):
        A = ref.attention(problem.X[n], problem.X[n], theta)
        for t in range(3):
            expected = np.concatenate([A[i, t] @ problem.X[n] for i in range(2)])
            np.testing.assert_allclose(Z[n * 3 + t], expected, rtol=1e-12)
    W = linear.solve_values(problem.X, problem.Y, theta, ridge=0.0)
    lstsq = np.linalg.lstsq(Z, problem.Y.reshape(-1, 4), rcond=None)[0]
    np.testing.assert_allclose(np.asarray(W).reshape(8, 4), lstsq, rtol=1e-8, atol=1e-10)
    # the residual those values leave, and the reduced cost: against the reference layer
    W, residual = linear.values_and_residual(problem.X, problem.Y, theta, ridge=0.0)
    outputs = np.stack([ref.mha(x, theta, np.asarray(W)) for x in problem.X])
    want = outputs - problem.Y
    np.testing.assert_allclose(residual, want.reshape(-1, 4), rtol=1e-9, atol=1e-12)
    cost = varpro.reduced_cost(problem, theta, 0.0).cost
    np.testing.assert_allclose(cost, np.mean(want**2), rtol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("heads", [1, 2, 3])  # blocks of G: one head, i < j and i > j
def test_gauss_newton_system_is_kaufman_projection(rng, heads):
    problem, theta = small_problem(rng, heads=heads)
    W = linear.solve_values(problem.X, problem.Y, theta, ridge=0.0)
    H, g = astuple(varpro.gauss_newton_system(problem, theta, W, sample_chunk=5))  # 12 = 5 + 5 + 2

    # dense references: J_Θ with W held, the projector onto the W-directions, the residual
    def outputs(flat):
        params = mh.LayerParams(theta=flat.reshape(theta.shape), W=W)
        return mh.problems.predict_layer(params, problem.X).reshape(-1)

    J = np.asarray(jax.jacfwd(outputs)(jnp.asarray(theta.reshape(-1))))
    r = np.asarray(outputs(jnp.asarray(theta.reshape(-1)))) - problem.Y.reshape(-1)
    Z = np.asarray(linear.design(problem.X, theta))
    JW = np.kron(Z, np.eye(4))  # ∂F/∂W, rows (n, t, e), columns (i, a, e)
    P = JW @ np.linalg.pinv(JW)
    JK = J - P @ J
    np.testing.assert_allclose(H, JK.T @ JK, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(g, J.T @ r, rtol=1e-9, atol=1e-11)
    # and J_Kᵀ r is the gradient of the reduced cost (times samples·tokens·dim / 2)
    grad = jax.grad(lambda t: varpro.reduced_cost(problem, t, 0.0).cost)(theta)
    np.testing.assert_allclose(np.asarray(grad).reshape(-1) * r.size / 2, g, rtol=1e-6, atol=1e-9)


def test_restricted_system_is_the_full_system_seen_through_the_basis(rng):
    problem, theta = small_problem(rng)
    W = linear.solve_values(problem.X, problem.Y, theta, ridge=0.0)
    H, g = astuple(varpro.gauss_newton_system(problem, theta, W, sample_chunk=5))  # checked above
    basis = rng.standard_normal((theta.size, 3))
    for chunk in (5, 12):  # 12 = 5 + 5 + 2 (padded), and all at once
        Hb, gb = astuple(varpro.restricted_system(problem, theta, W, jnp.asarray(basis), chunk))
        np.testing.assert_allclose(Hb, basis.T @ H @ basis, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(gb, basis.T @ g, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_a_stalled_start_stops_early_at_the_same_cost():
    # LM restricted to a random 4-dimensional subspace of Θ: its minimum there is no fit, so
    # without the stall test it runs out its budget
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=200)
    _, problem = task.sample(jax.random.key(0))
    basis = jnp.asarray(np.random.default_rng(0).standard_normal((32, 4)))
    theta0 = (basis @ jnp.ones(4)).reshape(2, 4, 4)
    full = varpro.levenberg_marquardt(problem, theta0, varpro.VarProConfig(iterations=40), basis)
    stall = varpro.VarProConfig(iterations=40, stall_tol=1e-9)
    short = varpro.levenberg_marquardt(problem, theta0, stall, basis)
    assert int(full.iterations) == 40 and not bool(full.converged)  # its budget ran out, no fit
    assert int(short.iterations) < 40 and not bool(short.converged)  # stopped early, still no fit
    np.testing.assert_allclose(short.cost, full.cost, rtol=1e-6)


@pytest.mark.slow
def test_variable_projection_recovers_random_teachers():
    # (dim, tokens, heads) = (8, 4, 2), β = 4, float64: ≥ 90% of 32 teachers recovered
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=8, tokens=4), samples=500, test_samples=64
    )
    res = mh.simulate(jax.random.key(0), task, varpro.VarProConfig(iterations=20, restarts=2), 32)
    assert np.mean(res.metrics["success"]) >= 0.9, res.metrics["theta_error_max"]
    ok = res.metrics["success"]
    assert np.all(res.metrics["prediction_error"][ok] < 1e-12)
    assert np.all(res.status["converged"][ok]) and np.all(res.status["steps_taken"][ok] < 20)


@pytest.mark.slow
def test_restarts_keep_the_best_residual(rng):
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=60)
    _, problem = task.sample(jax.random.key(1))
    config = varpro.VarProConfig(iterations=3, restarts=5, tol=0.0)
    out = config.fit(jax.random.key(2), problem)
    singles = [
        varpro.levenberg_marquardt(
            problem, problem.init(jax.random.fold_in(jax.random.key(2), r)).theta, config
        ).cost
        for r in range(5)
    ]
    np.testing.assert_allclose(out.trace.loss[-1], min(singles), rtol=1e-12)
    assert float(out.info["starts"]) == 5  # none fits at tol 0: every start ran


@pytest.mark.slow
def test_starts_run_one_after_another_until_one_fits():
    # realizable data: the first start fits, so the second never runs; vmapped the same (float64
    # products: float32 ones round differently under vmap, and the path then differs in ulps)
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=200)
    _, problem = task.sample(jax.random.key(1))
    config = varpro.VarProConfig(iterations=20, restarts=3, tol=1e-16, products=None)
    key = jax.random.key(2)
    out = config.fit(key, problem)
    first = varpro.levenberg_marquardt(
        problem, problem.init(jax.random.fold_in(key, 0)).theta, config
    )
    assert float(out.info["starts"]) == 1 and bool(out.status.converged)
    # jitted vs eager: ulps, and at the floor (~1e-24 of a start near 1) rounding alone
    np.testing.assert_allclose(out.trace.loss, first.history, rtol=1e-5, atol=1e-20)
    np.testing.assert_allclose(out.params.theta, first.theta, rtol=1e-9, atol=1e-12)
    keys = jnp.stack([key, jax.random.key(3)])
    both = jax.vmap(lambda k: config.fit(k, problem))(keys)
    np.testing.assert_allclose(both.trace.loss[0], first.history, rtol=1e-5, atol=1e-20)
    assert np.all(np.asarray(both.info["starts"]) >= 1)


@pytest.mark.slow
def test_a_nan_start_never_beats_a_finite_one(monkeypatch):
    # a stand-in solver whose final cost is NaN from starts with Θ[0,0,0] > 0: the finite
    # second start must be kept, and a lone NaN first start returned as it is (not +inf)
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=1, dim=2, tokens=2), samples=8)
    _, problem = task.sample(jax.random.key(0))

    def start(key, r):
        return problem.init(jax.random.fold_in(key, r)).theta

    key = next(
        k
        for k in (jax.random.key(i) for i in range(100))
        if start(k, 0)[0, 0, 0] > 0 and start(k, 1)[0, 0, 0] < 0
    )

    def fake(problem, theta0, config):
        cost = jnp.where(theta0[0, 0, 0] > 0, jnp.nan, 1.0)
        W = jnp.zeros_like(theta0)
        history = jnp.full(config.iterations + 1, cost)
        return varpro.Solve(theta0, W, history, jnp.asarray(False), jnp.asarray(3))

    monkeypatch.setattr(varpro, "levenberg_marquardt", fake)
    out = varpro.VarProConfig(iterations=2, restarts=2).fit(key, problem)
    assert float(out.trace.loss[-1]) == 1.0 and float(out.info["starts"]) == 2
    np.testing.assert_array_equal(out.params.theta, start(key, 1))
    lone = varpro.VarProConfig(iterations=2, restarts=1).fit(key, problem)
    assert np.isnan(lone.trace.loss[-1])
    np.testing.assert_array_equal(lone.params.theta, start(key, 0))


def test_reduced_gradient_is_the_systems_gradient(rng):
    problem, theta = small_problem(rng)
    W = linear.solve_values(problem.X, problem.Y, theta, ridge=0.0)
    _, g = astuple(varpro.gauss_newton_system(problem, theta, W, sample_chunk=5))
    np.testing.assert_allclose(varpro.reduced_gradient(problem, theta, W), g, rtol=1e-9)


@pytest.mark.slow
def test_float32_products_and_chunks_give_the_same_system(rng):
    # the float32 system is the float64 one to float32 accuracy, for any chunking
    problem, theta = small_problem(rng, samples=40)
    W = linear.solve_values(problem.X, problem.Y, theta, ridge=0.0)
    H, g = astuple(varpro.gauss_newton_system(problem, theta, W, sample_chunk=40))
    for chunk in (None, 7, 40):
        H32, g32 = astuple(varpro.gauss_newton_system(problem, theta, W, chunk, products="float32"))
        scale = np.abs(H).max()
        np.testing.assert_allclose(H32, H, atol=1e-5 * scale)
        np.testing.assert_allclose(g32, g, atol=1e-5 * np.abs(g).max())


@pytest.mark.slow
def test_reusing_the_system_converges_in_fewer_systems():
    # Shamanskii steps (same matrix, fresh gradient) on realizable data: the cost never
    # rises, every fit converges, and the more steps a matrix may serve, the fewer systems
    # each fit needs (never more)
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=200)
    systems = {}
    for reuse in (1, 2, 4):
        config = varpro.VarProConfig(iterations=20, restarts=1, steps_per_system=reuse)
        res = mh.simulate(jax.random.key(0), task, config, 8)
        assert np.all(np.diff(res.trace["loss"], axis=1) <= 0)
        assert np.all(res.status["converged"])
        systems[reuse] = res.status["steps_taken"]
    for fewer, more in ((1, 2), (2, 4)):
        assert np.all(systems[more] <= systems[fewer])
        assert systems[more].sum() < systems[fewer].sum()


@pytest.mark.slow
def test_a_float32_system_reaches_the_float64_fits():
    # the system built and factored in float32 only sets the step: on realizable data every
    # fit converges to the same parameters as with a float64 system, in about as many systems
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=200)
    fits = {
        products: mh.simulate(
            jax.random.key(0),
            task,
            varpro.VarProConfig(iterations=20, restarts=1, products=products),
            8,
            keep_params=True,
        )
        for products in ("float32", None)
    }
    low, full = fits["float32"], fits[None]
    assert np.all(low.status["converged"]) and np.all(full.status["converged"])
    assert np.all(np.abs(low.status["steps_taken"] - full.status["steps_taken"]) <= 1)
    np.testing.assert_allclose(low.params.theta, full.params.theta, rtol=1e-7, atol=1e-9)
    assert low.params.theta.dtype == np.float64
