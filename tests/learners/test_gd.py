import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import mhalearn as mh
from mhalearn.learners import gd
from tests.engine.compiles import count_compiles

KEY = jax.random.key(2)
# The documented easy, well-conditioned case (found by experiment, float64): random teachers
# at (dim, tokens, heads, beta) = (4, 3, 2, 2) from 200 Boolean samples; Adam with lr 1e-2
# for 2000 steps recovers 8 of 8 seeds to parameter error < 1e-4.
EASY = mh.RegressionTask(
    teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=2.0), samples=200, test_samples=128
)


def regression_problem(key=KEY, task=EASY):
    return task.sample(key)


@pytest.mark.slow
def test_adam_recovers_easy_teachers_float64():
    res = mh.simulate(
        jax.random.key(0), EASY, mh.GDConfig(optimizer="adam", steps=2000, lr=1e-2), 8
    )
    err = np.maximum(res.metrics["theta_error_max"], res.metrics["w_error_max"])
    assert np.sum(err < 1e-3) >= 7, err
    assert np.mean(res.metrics["success"]) >= 7 / 8
    ok = err < 1e-3
    assert np.all(res.metrics["prediction_error"][ok] < 1e-8)
    assert np.all(res.metrics["prediction_error_other"][ok] < 1e-8)  # Boolean → Gaussian transfer
    # eight orders of magnitude or more (the slowest of these 8 teachers: 7e-10 of its start)
    assert np.all(res.trace["loss"][ok, -1] < 1e-8 * res.trace["loss"][ok, 0])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,lr", [("gd", 0.5), ("momentum", 0.1), ("normalized_gd", 0.01)])
def test_other_optimisers_drive_the_loss_down(optimizer, lr):
    res = mh.simulate(
        jax.random.key(1), EASY, mh.GDConfig(optimizer=optimizer, steps=300, lr=lr), 4
    )
    loss = res.trace["loss"]
    assert not res.status["diverged"].any()
    assert np.all(loss[:, -1] < 0.2 * loss[:, 0]), loss[:, [0, -1]]


@pytest.mark.slow
def test_fit_equals_an_explicit_optax_loop():
    _, problem = regression_problem()
    assert mh.prepared(problem) is problem  # float64: the samples-major kernel
    # laid out as a float32 problem would be: the fit's steps run the lanes kernel
    problem = dataclasses.replace(problem, lanes=mh.lay_out(problem.X, problem.Y))
    assert mh.prepared(problem) is problem and problem.lanes is not None
    config = mh.GDConfig(optimizer="adam", steps=7, lr=3e-2, log_every=1)
    out = config.fit(KEY, problem)
    params = problem.init(jax.random.split(KEY)[0])
    opt = optax.adam(3e-2)
    state = opt.init(params)
    losses = [problem.loss(params)]
    for _ in range(7):
        grads = jax.grad(problem.loss)(params)
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(problem.loss(params))
    np.testing.assert_allclose(out.params.theta, params.theta, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.params.W, params.W, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.trace.loss, losses, rtol=1e-12)
    np.testing.assert_array_equal(out.trace.steps, np.arange(8))
    assert int(out.status.steps_taken) == 7


def test_trace_size_depends_on_snapshots_not_steps():
    for steps in (10, 1000, 100_000):
        s = mh.GDConfig(steps=steps, snapshots=12).snapshot_steps()
        assert s[0] == 0 and s[-1] == steps and len(s) <= 12 and np.all(np.diff(s) > 0)
    big = mh.GDConfig(steps=100_000, snapshots=12).snapshot_steps()
    assert np.allclose(np.diff(np.log(big[1:])), np.log(100_000) / 10, rtol=0.1)  # log-spaced
    np.testing.assert_array_equal(
        mh.GDConfig(steps=10, log_every=4).snapshot_steps(), [0, 4, 8, 10]
    )


def test_monitor_is_traced_at_snapshots():
    _, problem = regression_problem()
    config = mh.GDConfig(steps=50, snapshots=5)
    out = config.fit(KEY, problem, monitor=lambda p: {"w_norm": jnp.sum(p.W**2)})
    assert out.trace.metrics["w_norm"].shape == out.trace.steps.shape
    np.testing.assert_allclose(
        out.trace.metrics["w_norm"][-1], jnp.sum(out.params.W**2), rtol=1e-12
    )


@pytest.mark.slow
def test_divergence_is_flagged_and_neighbours_unchanged():
    lrs = np.array([1e-2, 1e6, 3e-2])  # gd with lr 1e6 blows up
    learner = mh.GDConfig(optimizer="gd", steps=60, snapshots=8, lr=lrs)
    res = mh.simulate(jax.random.key(3), EASY, learner, 3, keep_params=True)
    assert list(res.status["diverged"]) == [False, True, False]
    assert 0 <= res.status["diverged_at"][1] < 60 and res.status["diverged_at"][0] == -1
    assert res.status["steps_taken"][1] == res.status["diverged_at"][1]
    after = res.trace_steps > res.status["diverged_at"][1]
    assert np.all(np.isnan(res.trace["loss"][1, after])) and np.all(
        np.isfinite(res.trace["loss"][[0, 2]])
    )
    # the same instances without the divergent one: identical, bit for bit
    alone = mh.simulate(
        jax.random.key(3),
        EASY,
        mh.GDConfig(optimizer="gd", steps=60, snapshots=8, lr=lrs[[0, 2]]),
        2,
        key_ids=[0, 2],
    )
    for name in res.metrics:
        np.testing.assert_array_equal(res.metrics[name][[0, 2]], alone.metrics[name], err_msg=name)
    # the diverged instance keeps its last finite parameters
    assert np.all(np.isfinite(res.params.theta[1])) and np.all(np.isfinite(res.params.W[1]))


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [None, 16])
def test_every_snapshot_holds_the_full_loss_and_monitor_at_that_step(batch_size):
    """The trace at snapshot k equals a fit stopped at that step (minibatches are keyed by
    step, so a shorter fit follows the same path): full training loss, monitor, both."""
    _, problem = regression_problem()
    monitor = lambda p: {"w_norm": jnp.sum(p.W**2)}  # noqa: E731
    config = mh.GDConfig(optimizer="adam", steps=40, log_every=10, batch_size=batch_size)
    out = config.fit(KEY, problem, monitor=monitor)
    for k, step in enumerate(config.snapshot_steps()):
        if step == 0:
            params = config.start(KEY, problem)
        else:
            short = mh.GDConfig(optimizer="adam", steps=int(step), batch_size=batch_size)
            params = short.fit(KEY, problem).params
        np.testing.assert_allclose(out.trace.loss[k], problem.loss(params), rtol=1e-10)
        np.testing.assert_allclose(
            out.trace.metrics["w_norm"][k], monitor(params)["w_norm"], rtol=1e-10
        )


def test_early_stop_at_tolerance():
    learner = mh.GDConfig(optimizer="adam", steps=3000, lr=1e-2, tol=1e-6)
    res = mh.simulate(jax.random.key(0), EASY, learner, 3)
    stopped = res.status["converged"]
    assert stopped.all()
    assert np.all(res.status["steps_taken"] < 3000)
    assert np.all(res.trace["loss"][:, -1] <= 1e-6)


def test_minibatch_fit():
    _, problem = regression_problem()
    config = mh.GDConfig(optimizer="adam", steps=300, batch_size=32, lr=1e-2)
    a = config.fit(KEY, problem)
    b = config.fit(KEY, problem)
    np.testing.assert_array_equal(a.params.theta, b.params.theta)  # same key, same batches
    assert a.trace.loss[-1] < 0.5 * a.trace.loss[0]
    with pytest.raises(ValueError, match="batch_size must be <= samples"):
        mh.GDConfig(batch_size=500).fit(KEY, problem)


def test_custom_optax_factory():
    _, problem = regression_problem()
    out = mh.GDConfig(optimizer=optax.rmsprop, steps=100, lr=1e-2).fit(KEY, problem)
    assert out.trace.loss[-1] < out.trace.loss[0]


def test_classifier_training_learns_the_mixture():
    mixture = mh.MixtureSpec(tokens=6, dim=8, relevant_fraction=0.5, noise=0.3, signal_norm=1.0)
    task = mh.ClassificationTask(mixture=mixture, heads=4, samples=128, test_samples=256)
    res = mh.simulate(jax.random.key(0), task, mh.GDConfig(optimizer="gd", steps=200, lr=1.0), 4)
    assert np.all(res.trace["loss"][:, -1] < 0.5 * res.trace["loss"][:, 0])
    assert np.all(res.metrics["test_error"] < 0.05)
    assert np.all(res.metrics["active_heads"] == 4)


def test_student_with_more_heads_than_teacher():
    task = mh.RegressionTask(teacher=EASY.teacher, samples=200, student_heads=3, test_samples=64)
    res = mh.simulate(jax.random.key(0), task, mh.GDConfig(steps=400, lr=1e-2), 2, keep_params=True)
    assert res.params.theta.shape == (2, 3, 4, 4)
    assert np.all(res.trace["loss"][:, -1] < 0.1 * res.trace["loss"][:, 0])


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(optimizer="sgd"), "optimizer must be one of"),
        (dict(steps=0), "steps must be an integer >= 1"),
        (dict(lr=-1.0), "lr must lie in"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
        (dict(momentum=1.5), "momentum must lie in"),
    ],
)
def test_config_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        mh.GDConfig(**kwargs)


@pytest.mark.slow
def test_one_step_initialisation_is_one_explicit_gd_step():
    mixture = mh.MixtureSpec(tokens=5, dim=6, relevant_fraction=0.4, noise=0.3)
    task = mh.ClassificationTask(
        mixture=mixture,
        heads=3,
        samples=64,
        start=mh.ClassifierStart(w_init=0.0, one_step=0.7),
    )
    _, problem = task.sample(KEY)
    stepped = problem.init(KEY)
    plain = mh.ClassificationProblem(X=problem.X, y=problem.y, spec=problem.spec, heads=3)
    start = plain.init(KEY)
    grads = jax.grad(plain.loss)(start)
    np.testing.assert_allclose(stepped.W, start.W - 0.7 * grads.W, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(stepped.U, start.U - 0.7 * grads.U, rtol=1e-12, atol=1e-15)
    assert np.any(stepped.W != 0)  # from W = 0, the step moves the attention


def test_classifier_sweep_over_heads_step_sizes_and_seeds_compiles_once():
    heads = np.repeat([1, 2, 4], 4)  # 3 head counts × 2 step sizes × 2 seeds
    lrs = np.tile(np.repeat([0.3, 1.0], 2), 3)
    seeds = np.tile([0, 1], 6)
    mixture = mh.MixtureSpec(tokens=4, dim=6, relevant_fraction=0.5, noise=0.3)
    task = mh.ClassificationTask(
        mixture=mixture, heads=4, samples=32, test_samples=64, active_heads=heads
    )
    learner = mh.GDConfig(optimizer="gd", steps=30, lr=lrs)
    mh.batch.clear_programs()
    with count_compiles() as names:
        res = mh.simulate(jax.random.key(0), task, learner, 12, key_ids=seeds)
    assert names.count("instance_group") == 1, names
    np.testing.assert_array_equal(res.metrics["active_heads"], heads)
    np.testing.assert_array_equal(res.sweep["task.active_heads"], heads)
    # same seed and head count, different step size: the same data and start
    start = res.trace["loss"][:, 0]
    np.testing.assert_array_equal(start[[0, 4, 8]], start[[2, 6, 10]])
    assert np.all(np.isfinite(res.trace["loss"]))


@pytest.mark.slow
def test_loss_sum_and_movement_for_the_theory():
    mixture = mh.MixtureSpec(tokens=4, dim=6, relevant_fraction=0.5, noise=0.3)
    _, problem = mh.ClassificationTask(mixture=mixture, heads=2, samples=32).sample(KEY)
    out = mh.GDConfig(optimizer="gd", steps=6, lr=0.5, log_every=1).fit(KEY, problem)
    # full batch: the losses seen at the 6 updates are the traced losses at steps 0..5
    np.testing.assert_allclose(out.info["loss_sum"], np.sum(out.trace.loss[:-1]), rtol=1e-12)
    start = problem.init(jax.random.split(KEY)[0])
    moved = np.linalg.norm(out.params.U - start.U)
    np.testing.assert_allclose(out.info["movement_U"], moved, rtol=1e-12)
    np.testing.assert_allclose(
        out.info["movement_U_relative"], moved / np.linalg.norm(start.U), rtol=1e-12
    )
    assert np.isinf(out.info["movement_W_relative"])  # W started at zero and moved


@pytest.mark.slow
@pytest.mark.parametrize("normalize", ["joint", "field"])
def test_normalized_gd_takes_exact_steps_after_the_gradient_vanishes(normalize):
    # a separable classification problem: the logistic loss's gradient falls below 1e-6 early,
    # where a step divided by ‖∇‖ + 1e-6 would shrink; the float64 loop keeps full steps
    mixture = mh.MixtureSpec(tokens=4, dim=6, noise=0.1)
    data = mh.tokenized_mixture(jax.random.key(3), mixture, 8)
    problem = mh.ClassificationProblem(X=data.X, y=data.y, spec=mh.ClassifierSpec(), heads=2)
    config = mh.GDConfig(optimizer="normalized_gd", steps=2000, lr=0.1, normalize=normalize)
    fit = config.fit(KEY, problem)
    params = config.start(KEY, problem)
    grad = jax.jit(jax.grad(problem.loss))
    smallest = np.inf
    for _ in range(2000):
        g = grad(params)
        leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(g)]
        if normalize == "joint":
            norm = np.sqrt(sum(np.sum(x**2) for x in leaves))
            norms = [norm] * len(leaves)
        else:
            norms = [np.sqrt(np.sum(x**2)) for x in leaves]
        smallest = min(smallest, np.sqrt(sum(np.sum(x**2) for x in leaves)))
        new = [
            p - 0.1 * x / n for p, x, n in zip(jax.tree.leaves(params), leaves, norms, strict=True)
        ]
        params = jax.tree.unflatten(jax.tree.structure(params), new)
    assert smallest < 1e-6  # the regime the fix is about
    for got, want in zip(jax.tree.leaves(fit.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    moved = np.array([fit.info["movement_W"], fit.info["movement_U"]])
    if normalize == "field":  # each field moves by at most lr per step, ~lr·steps when aligned
        assert np.all(moved <= 0.1 * 2000 + 1e-9)
    assert int(fit.status.steps_taken) == 2000


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["normalized_gd", "adam"])
def test_frozen_fields_keep_their_start_and_the_rest_trains_as_alone(optimizer):
    mixture = mh.MixtureSpec(tokens=4, dim=6, noise=0.1)
    data = mh.tokenized_mixture(jax.random.key(3), mixture, 8)
    problem = mh.ClassificationProblem(X=data.X, y=data.y, spec=mh.ClassifierSpec(), heads=2)
    config = mh.GDConfig(optimizer=optimizer, steps=200, lr=0.1, trainable=("W",))
    fit = config.fit(KEY, problem)
    start = config.start(KEY, problem)
    np.testing.assert_array_equal(fit.params.U, start.U)
    # W alone, by hand: the readout is a constant of the loss
    opt = optax.adam(0.1) if optimizer == "adam" else None
    W, state = start.W, opt.init(start.W) if opt else None
    grad = jax.jit(jax.grad(lambda w: problem.loss(mh.ClassifierParams(W=w, U=start.U))))
    for _ in range(200):
        g = grad(W)
        if opt:
            step, state = opt.update(g, state, W)
            W = W + step
        else:
            W = W - 0.1 * g / np.linalg.norm(np.ravel(g))
    np.testing.assert_allclose(fit.params.W, W, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match=r"trainable must name parameter fields of \['U', 'W'\]"):
        mh.GDConfig(steps=2, trainable=("V",)).fit(KEY, problem)


@pytest.mark.parametrize("batch_size", [None, 16])
def test_the_early_stop_test_between_blocks_changes_nothing(batch_size):
    # one batch where instances converge (tol), diverge (a huge lr) and run out the budget, at
    # snapshot intervals shorter and longer than the block: testing whether any instance
    # runs after every step (check_every=1, the loop of a step at a time) or only between
    # blocks of 7 or 16 steps gives the same fits, bit for bit. The problems are drawn once
    # and the fits alone vmapped over them, each instance with its own lr and tol.
    keys = jax.random.split(KEY, 4)
    problems = jax.jit(jax.vmap(lambda k: EASY.sample(k).problem))(keys)
    lrs = np.array([1.0, 1e6, 1e-3, 3e-2]) * (1.0 if batch_size is None else 1e-1)
    tol = np.array([1e-2, 0.0, 0.0, 0.0])

    def fits(every):
        config = mh.GDConfig(
            optimizer="gd" if batch_size is None else "adam",
            steps=90,
            snapshots=9,
            lr=lrs,
            tol=tol,
            batch_size=batch_size,
            check_every=every,
        )
        axes = jax.tree.map(lambda leaf: 0 if np.ndim(leaf) == 1 else None, config)
        return jax.jit(jax.vmap(lambda c, k, p: c.fit(k, p), in_axes=(axes, 0, 0)))(
            config, keys, problems
        )

    base = fits(1)
    if batch_size is None:
        assert list(base.status.diverged) == [False, True, False, False]
        assert base.status.converged[0] and 0 < base.status.steps_taken[0] < 90
    for every in (7, 16):
        fit = fits(every)
        for field in ("diverged", "diverged_at", "converged", "steps_taken"):
            np.testing.assert_array_equal(
                getattr(fit.status, field), getattr(base.status, field), err_msg=field
            )
        np.testing.assert_array_equal(fit.trace.loss, base.trace.loss)
        np.testing.assert_array_equal(fit.params.theta, base.params.theta)
        np.testing.assert_array_equal(fit.params.W, base.params.W)


@pytest.mark.parametrize("steps, snapshots, check_every", [(50, 2, 16), (100, 10, 16), (90, 9, 7)])
def test_a_batch_of_fits_computes_exactly_its_steps(steps, snapshots, check_every, monkeypatch):
    # under vmap, every step the program computes (a step of an instance that has stopped
    # included) calls the callback once for the whole batch: the steps left after the whole
    # blocks of each snapshot interval must not be computed beyond the interval (as a mask of
    # k - 1 steps would be)
    calls = []
    step = gd._step

    def counted(*args):
        jax.debug.callback(lambda: calls.append(1))
        return step(*args)

    monkeypatch.setattr(gd, "_step", counted)
    config = mh.GDConfig(
        optimizer="gd", steps=steps, snapshots=snapshots, lr=0.05, check_every=check_every
    )
    keys = jax.random.split(KEY, 3)
    problems = jax.vmap(lambda k: EASY.sample(k).problem)(keys)
    fit = jax.jit(jax.vmap(config.fit))(keys, problems)
    jax.effects_barrier()
    assert np.all(np.asarray(fit.status.steps_taken) == steps)
    assert len(calls) == steps


@pytest.mark.parametrize("heads, dim, tokens, samples", [(4, 16, 8, 512), (3, 5, 7, 33)])
def test_step_cost_counts_the_layers_products(heads, dim, tokens, samples):
    # XLA's count of a full-batch GD step against the products written out (per sample and
    # head, forward: XΘ 2Td², (XΘ)Xᵀ 2T²d, AX 2T²d, (AX)W 2Td²; the backward pass about twice
    # that), per instance whatever the batch; and the bytes it moves say the unfused step is
    # memory-bound on a GPU (an H100's float32 rate over its bandwidth is about 20 FLOP/byte)
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=heads, dim=dim, tokens=tokens), samples=samples
    )
    config = mh.GDConfig(optimizer="gd", steps=4, lr=0.05)
    keys = jax.random.split(KEY, 12)
    problems = jax.jit(jax.vmap(lambda k: task.sample(k).problem))(keys)
    costs = [
        mh.learners.step_cost(config, keys[:n], jax.tree.map(lambda a, n=n: a[:n], problems))
        for n in (4, 12)
    ]
    forward = heads * samples * (4 * tokens * dim**2 + 4 * tokens**2 * dim)
    for cost in costs:
        assert 2.0 * forward < cost.flops < 3.5 * forward
        assert 0 < cost.intensity < 20
    np.testing.assert_allclose(costs[0].flops, costs[1].flops, rtol=0.02)
