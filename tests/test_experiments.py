"""Built-in studies: dimensions, coordinates and attributes, and every grid point holding the
numbers of its own instance (recomputed directly, one instance at a time)."""

import itertools
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import mhalearn as mh
from mhalearn._version import source_commit
from mhalearn.experiments import STUDIES, Recovery, Regimes, run_study
from mhalearn.metrics import theory
from mhalearn.simulate import instance_keys
from mhalearn.store import load

DIMS = {
    "recovery": ("learner", "samples", "heads", "instance", "step"),
    "regimes": ("inputs", "heads", "tokens", "beta", "instance"),
    "heads": ("noise", "heads", "lr", "instance", "step"),
    "stepsize": ("heads", "instance", "step"),
    "samples": ("samples", "heads", "instance", "step"),
    "margin": ("init", "heads", "instance"),
    "phase": ("learner", "inputs", "dim", "heads", "ratio", "budget", "beta", "instance"),
    "sculpt": ("heads", "samples", "beta", "instance", "phase"),  # phase: the timed phases
    "max_margin": ("shape", "attention", "heads", "instance", "step"),
    "aim": ("alpha", "dim", "tokens", "rho", "instance", "step"),
    "attention_phase": ("init", "alpha", "omega", "dim", "instance", "step"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_study_dataset_has_documented_dims_coords_and_attrs(tiny_results, name):
    study, path = tiny_results[name]
    ds = load(path)
    assert set(ds.dims) == set(DIMS[name])
    for dim in DIMS[name]:
        if dim == "instance":
            np.testing.assert_array_equal(ds[dim], np.arange(study.instances))
        elif dim not in ("step", "phase"):
            np.testing.assert_array_equal(ds[dim].values, np.asarray(getattr(study, dim)))
    head = ds[study.headline]
    assert head.dims[: len(study.static_axes)] == study.static_axes  # static axes lead
    assert json.loads(ds.attrs["config"]) == json.loads(json.dumps(study.config()))
    assert ds.attrs["study"] == name and ds.attrs["seed"] == study.seed
    assert ds.attrs["precision"] == "float64"  # the tests enable x64
    assert ds.attrs["jax_version"] == jax.__version__
    assert ds.attrs["mhalearn_version"] == mh.__version__
    assert ds.attrs["mhalearn_commit"] == source_commit()
    assert ds.attrs["device_kind"] == jax.devices()[0].device_kind
    assert np.isfinite(head.values).any()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["aim", "attention_phase"])
def test_solvable_model_points_match_direct_runs(tiny_results, name):
    # each point is the authors' learner on the task of its cell, instance i from key i
    study, path = tiny_results[name]
    ds = load(path)
    cell = study.cells()[-1]
    learner = (
        mh.GDConfig(optimizer="adam", lr=study.lr, steps=study.steps)
        if name == "aim"
        else mh.GDConfig(optimizer="gd", lr=study.lr, steps=study.steps)
    )
    direct = mh.simulate(jax.random.key(study.seed), study.task(cell), learner, 1, key_ids=[1])
    point = ds.sel(**cell, instance=1)
    for var in direct.metrics:
        np.testing.assert_allclose(point[var], direct.metrics[var][0], rtol=1e-9, err_msg=var)


@pytest.mark.slow
def test_recovery_points_match_direct_runs_and_flags_stay_integers(tiny_results):
    study, path = tiny_results["recovery"]
    ds = load(path)
    assert ds["success"].dtype == np.int8 and ds["diverged"].dtype == np.int8
    # the learners log different steps: each keeps its own, NaN elsewhere
    adam_steps = set(mh.GDConfig(steps=study.steps, snapshots=8).snapshot_steps())
    assert set(ds["step"].values) >= adam_steps
    spec = mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=study.beta)
    task = mh.RegressionTask(teacher=spec, samples=60, test_samples=256)
    learner = mh.GDConfig(optimizer="adam", steps=study.steps, lr=1e-2, snapshots=8)
    direct = mh.simulate(jax.random.key(study.seed), task, learner, 1, key_ids=[1])
    point = ds.sel(learner="adam", samples=60, heads=2, instance=1)
    for name in ("theta_error_max", "prediction_error", "train_loss"):
        np.testing.assert_allclose(point[name], direct.metrics[name][0], rtol=1e-9)
    np.testing.assert_allclose(
        point["trace_loss"].sel(step=direct.trace_steps), direct.trace["loss"][0], rtol=1e-9
    )


@pytest.mark.slow
def test_regimes_points_match_direct_diagnostics(tiny_results):
    study, path = tiny_results["regimes"]
    ds = load(path)
    keys = instance_keys(jax.random.fold_in(jax.random.key(study.seed), 2))
    spec = mh.TeacherSpec(heads=2, dim=study.dim, tokens=4, beta=4.0)
    teacher, info = mh.sample_teacher_with_info(keys.problem, spec)
    diag = mh.teacher_diagnostics(keys.evaluate, teacher, spec, study.samples, study.delta)
    point = ds.sel(inputs="boolean", heads=2, tokens=4, beta=4.0, instance=2)
    np.testing.assert_allclose(point["agreement"], diag.agreement, rtol=1e-12)
    np.testing.assert_allclose(point["attention_entropy"], diag.attention_entropy, rtol=1e-12)
    assert int(point["attempts"]) == int(info.attempts)
    # sharper teachers attend more sharply (same draws, larger β)
    sharp = ds["mean_max_attention"].sel(beta=4.0) >= ds["mean_max_attention"].sel(beta=1.0)
    assert bool(sharp.all())


def classification_task(study, noise, samples, **numbers):
    return study.task(samples, max(study.heads), noise, **numbers)


@pytest.mark.slow
def test_heads_points_match_direct_runs(tiny_results):
    study, path = tiny_results["heads"]
    ds = load(path)
    task = classification_task(study, 1.0, study.samples, active_heads=2)
    learner = mh.GDConfig(optimizer="gd", steps=study.steps, lr=0.3, snapshots=20)
    direct = mh.simulate(jax.random.key(study.seed), task, learner, 1, key_ids=[1])
    point = ds.sel(noise=1.0, heads=2, lr=0.3, instance=1)
    np.testing.assert_allclose(point["test_loss"], direct.metrics["test_loss"][0], rtol=1e-9)
    np.testing.assert_allclose(point["trace_test_loss"], direct.trace["test_loss"][0], rtol=1e-9)
    assert int(point["active_heads"]) == 2
    # the monitored attention on relevant positions, at the start, on the held-out draw
    keys = instance_keys(jax.random.fold_in(jax.random.key(study.seed), 1))
    held_out, problem = task.sample(keys.problem)
    start = learner.start(keys.fit, problem)
    mass = theory.relevant_attention(
        start, held_out.X, held_out.relevant, problem.spec, problem.head_mask()
    )
    np.testing.assert_allclose(point["trace_relevant_attention"].sel(step=0), mass, rtol=1e-9)


@pytest.mark.slow
def test_stepsize_bisection_agrees_with_a_sequential_search(tiny_results):
    study, path = tiny_results["stepsize"]
    ds = load(path)
    # the bisection visits only the points of this grid (the bracket halved `halvings` times)
    grid = np.geomspace(study.lr_low, study.lr_high, 2**study.halvings + 1)
    interior = 0
    for h in study.heads:
        task = classification_task(study, study.noise, study.samples, active_heads=h)
        for i in range(study.instances):
            flags = []
            for lr in grid:  # a sequential search: every grid step size, in order
                probe = mh.GDConfig(optimizer="gd", steps=study.steps, lr=lr, log_every=1)
                run = mh.simulate(jax.random.key(study.seed), task, probe, 1, key_ids=[i])
                loss = run.trace["loss"][0]
                rises = [b - a > study.rise_tol * abs(a) for a, b in itertools.pairwise(loss)]
                flags.append(not run.status["diverged"][0] and not any(rises))
            point = ds.sel(heads=h, instance=i)
            star = float(point["largest_stable_lr"])
            if not flags[0] or all(flags):
                np.testing.assert_allclose(star, study.lr_high if all(flags) else 0.0, rtol=1e-12)
                assert int(point["lr_censored"]) == 1
                continue
            interior += 1
            j = int(np.argmin(np.abs(grid - star)))
            np.testing.assert_allclose(star, grid[j], rtol=1e-9)
            np.testing.assert_allclose(point["smallest_unstable_lr"], grid[j + 1], rtol=1e-9)
            assert flags[j] and not flags[j + 1]  # a stable step next to an unstable one
            first_unstable = flags.index(False)
            if all(not f for f in flags[first_unstable:]):  # monotone: the one edge
                assert j == first_unstable - 1
    assert interior >= 2, "no instance had its edge inside the bracket: the test tested nothing"


@pytest.mark.slow
def test_stepsize_curves_rates_and_curvature_at_the_gd_start(tiny_results):
    study, path = tiny_results["stepsize"]
    ds = load(path)
    point = ds.sel(heads=2, instance=1)
    task = classification_task(study, study.noise, study.samples, active_heads=2)
    for run, lr in (("fixed", study.fixed_lr), ("star", float(point["largest_stable_lr"]))):
        trainer = mh.GDConfig(
            optimizer="gd", steps=study.train_steps, lr=lr, snapshots=study.snapshots
        )
        direct = mh.simulate(jax.random.key(study.seed), task, trainer, 1, key_ids=[1])
        loss = direct.trace["loss"][0]
        np.testing.assert_allclose(point[f"trace_loss_{run}"], loss, rtol=1e-9)
        t = np.asarray(ds["step"], float)
        keep = (t >= study.rate_from * study.train_steps) & (t > 0)
        slope = np.polyfit(np.log(t[keep]), np.log(loss[keep]), 1)[0]
        np.testing.assert_allclose(point[f"rate_{run}"], slope, rtol=1e-9)
    # curvature and margin are measured where GD starts: same problem, same initial loss
    keys = instance_keys(jax.random.fold_in(jax.random.key(study.seed), 1))
    _, problem = task.sample(keys.problem)
    start = mh.GDConfig().start(keys.fit, problem)
    np.testing.assert_allclose(point["trace_loss_fixed"][0], problem.loss(start), rtol=1e-9)
    k1, _, k3 = jax.random.split(keys.evaluate, 3)
    norm = theory.hessian_spectral_norm(problem.loss, start, k1, study.lanczos_matvecs)
    np.testing.assert_allclose(point["hessian_norm"], norm, rtol=1e-9)
    scores = [
        theory.hessian_spectral_norm(
            lambda p, x=x: problem.scores(p, x[None])[0], start, k3, study.lanczos_matvecs
        )
        for x in problem.X[: study.score_samples]
    ]
    np.testing.assert_allclose(point["score_hessian_norm"], np.mean(scores), rtol=1e-9)
    features = theory.ntk_features(start, problem.X, problem.spec, problem.head_mask())["all"]
    gamma = theory.svm_margin(theory.ntk_gram(features), problem.y, study.svm_iterations).margin
    np.testing.assert_allclose(point["margin"], gamma, rtol=1e-9, atol=1e-12)
    if gamma > 0:
        expected = 1 / (study.fixed_lr * study.train_steps * float(gamma) ** 2)
        np.testing.assert_allclose(point["theory_loss_fixed"], expected, rtol=1e-9)


@pytest.mark.slow
def test_samples_stop_at_the_target_loss_as_a_run_logged_at_every_step(tiny_results):
    study, path = tiny_results["samples"]
    ds = load(path)
    stopped = 0
    for n in study.samples:
        task = classification_task(study, study.noise, n, active_heads=2)
        # no target: every step's loss, from which the stopping step is read by hand
        learner = mh.GDConfig(optimizer="gd", steps=study.steps, lr=study.lr, log_every=1)
        direct = mh.simulate(jax.random.key(study.seed), task, learner, 1, key_ids=[1])
        losses = direct.trace["loss"][0]  # L̂(θ_t) for t = 0 .. steps
        reached = np.flatnonzero(losses <= study.target_loss)
        stop = int(reached[0]) if reached.size else study.steps
        stopped += bool(reached.size)
        point = ds.sel(samples=n, heads=2, instance=1)
        assert int(point["converged"]) == int(reached.size > 0)
        np.testing.assert_allclose(point["train_loss"], losses[stop], rtol=1e-9)
        proxy = study.lr / n * losses[:stop].sum()
        np.testing.assert_allclose(point["stability_proxy"], proxy, rtol=1e-9)
        assert int(point["proxy_bounds_gap"]) == int(float(point["gap"]) <= proxy)
    assert stopped >= 1, "no run reached the target: the stopping rule was not tested"
    # the fitted slope: least squares on the log medians over n
    for h in study.heads:
        medians = ds["test_loss"].sel(heads=h).median("instance").values
        slope = np.polyfit(np.log(study.samples), np.log(medians), 1)[0]
        if len(study.samples) >= 3:
            np.testing.assert_allclose(ds["test_loss_slope"].sel(heads=h), slope, rtol=1e-9)


@pytest.mark.slow
def test_margin_points_match_direct_computation(tiny_results):
    study, path = tiny_results["margin"]
    ds = load(path)
    task = classification_task(
        study,
        study.noise,
        study.samples,
        active_heads=2,
        start=mh.ClassifierStart(w_init=0.0, one_step=study.one_step_lr),
    )
    keys = instance_keys(jax.random.fold_in(jax.random.key(study.seed), 1))
    _, problem = task.sample(keys.problem)
    params = mh.GDConfig().start(keys.fit, problem)  # where the optimiser starts
    features = theory.ntk_features(params, problem.X, problem.spec, problem.head_mask())
    point = ds.sel(init="one_step", heads=2, instance=1)
    for part, suffix in (("all", ""), ("U", "_u")):
        m = theory.svm_margin(theory.ntk_gram(features[part]), problem.y, study.svm_iterations)
        np.testing.assert_allclose(point[f"margin{suffix}"], m.margin, rtol=1e-9, atol=1e-14)
        assert int(point[f"separable{suffix}"]) == int(m.separable)


@pytest.mark.slow
def test_in_memory_run_equals_the_stored_one(tiny_results):
    study, path = tiny_results["regimes"]
    ds = run_study(study)
    stored = load(path)
    for name in ds.data_vars:
        np.testing.assert_array_equal(ds[name].values, stored[name].values)
    assert ds.attrs == stored.attrs


@pytest.mark.parametrize(
    "make,fragment",
    [
        (lambda: Recovery(heads=()), "heads: expected at least one value"),
        (lambda: Recovery(samples=(100, 100)), "samples: values must be distinct"),
        (lambda: Recovery(heads=(0,)), "heads must be an integer >= 1"),
        (lambda: Recovery(family="two_tokens"), "needs tokens == 2"),
        (lambda: Regimes(instances=0), "instances must be an integer >= 1"),
        (lambda: STUDIES["heads"](noise=(-1.0,)), "noise"),
        (lambda: STUDIES["heads"](lr=(0.0, 1.0)), r"lr must lie in \(0.0"),
        (lambda: STUDIES["samples"](lr=0.0), r"lr must lie in \(0.0"),
        (lambda: STUDIES["stepsize"](lr_low=0.0), r"lr_low must lie in \(0.0"),
        (lambda: STUDIES["stepsize"](lr_low=2.0, lr_high=1.0), "lr_low must be < lr_high"),
        (lambda: Regimes(delta=0.9), "delta must lie in"),
        (lambda: Regimes(seed=-1), "seed must lie in"),
        (lambda: STUDIES["margin"](svm_iterations=0), "svm_iterations must be an integer >= 1"),
    ],
)
def test_invalid_specs_raise_clear_errors(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_cells_are_every_combination_of_the_static_axes_last_fastest():
    study = Recovery(learner=("adam", "uniform"), samples=(40, 60, 80), heads=(1, 2))
    expected = [
        {"learner": lr, "samples": n, "heads": h}
        for lr in ("adam", "uniform")
        for n in (40, 60, 80)
        for h in (1, 2)
    ]
    assert study.cells() == expected
    assert STUDIES["stepsize"]().cells() == [{}]  # no static axis: one cell
    assert STUDIES["margin"](svm_iterations=5).cells() == [{}]
    assert STUDIES["heads"](noise=(0.5, 1.5)).cells() == [{"noise": 0.5}, {"noise": 1.5}]


#: Datasets of every study at its tiny size, stored before the package's layout was rebuilt
#: (tests/tiny_references.py), and in its subfolders those of the studies that give other
#: last digits on another kind of CPU, computed there by the same code
REFERENCES = Path(__file__).resolve().parent / "data" / "tiny"


def _timed(ds, name: str) -> bool:
    """A wall-clock time, or a number computed from one: it differs run to run."""
    return ds[name].attrs.get("units") == "s" or "seconds" in name


def _assert_equal_to(ds, ref) -> None:
    """The same variables, coordinates and numbers: integers and flags exactly, floats to 1e-9
    relative (XLA may fuse a moved function differently), timings apart."""
    assert set(ds.data_vars) == set(ref.data_vars)
    assert dict(ds.sizes) == dict(ref.sizes)
    for coord in ref.coords:
        np.testing.assert_array_equal(ds[coord].values, ref[coord].values, err_msg=coord)
    for var in ref.data_vars:
        if _timed(ref, var):
            continue
        got, want = ds[var].values, ref[var].values
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=var)
        else:
            np.testing.assert_array_equal(got, want, err_msg=var)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_at_tiny_equals_its_stored_dataset(tiny_results, name):
    # the same numbers as before a move of code, on one of the kinds of CPU a set was stored
    # for (tests/tiny_references.py --cpu): on a new kind, store its set with the code of
    # before the move
    ds = load(tiny_results[name][1])
    stored = [REFERENCES / f"{name}.nc", *sorted(REFERENCES.glob(f"*/{name}.nc"))]
    failures = []
    for path in stored:
        try:
            _assert_equal_to(ds, load(path))
            return
        except AssertionError as err:
            failures.append(f"{path.relative_to(REFERENCES)}: {err}")
    raise AssertionError("equal to none of the stored Datasets:\n" + "\n".join(failures))


def test_every_study_has_a_figure_and_declares_its_instances_and_seed():
    from mhalearn.experiments.figures import FIGURES

    assert set(FIGURES) == set(STUDIES)
    for cls in STUDIES.values():
        study = cls()
        assert study.instances >= 1 and isinstance(study.seed, int)


def test_a_study_without_its_abstract_parts_is_refused():
    import dataclasses

    from mhalearn.experiments import Study, register_study

    @dataclasses.dataclass(frozen=True)
    class NoCells(Study):
        name = "no_cells"
        summary = "a study that forgot run_cell"
        static_axes = ()
        headline = "x"
        presets = {"tiny": {}}  # noqa: RUF012 (a class constant, as in every study)
        instances: int = 2
        seed: int = 0

    with pytest.raises(ValueError, match="does not implement"):
        register_study(NoCells)
    with pytest.raises(TypeError):
        NoCells()
    assert "no_cells" not in STUDIES
