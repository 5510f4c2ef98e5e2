"""The phase study: its grid, failure types and thresholds against independent readings."""

import numpy as np
import pytest

from mhalearn import stats
from mhalearn.experiments import STUDIES
from mhalearn.experiments.figures import plot
from mhalearn.experiments.phase import (
    STATISTICAL_DIMS,
    THRESHOLD_DIMS,
    critical_samples,
    samples_at,
)
from mhalearn.store import load


@pytest.mark.slow
def test_samples_are_the_ratio_of_the_counting_limit(tiny_results):
    study, path = tiny_results["phase"]
    ds = load(path)
    for d in ds["dim"].values:
        for h in ds["heads"].values:
            # N_c·tokens·dim equations = 2·heads·dim² unknowns
            n_c = float(ds["critical_samples"].sel(dim=d, heads=h))
            assert n_c * study.tokens * d == pytest.approx(2 * h * d**2)
            for r in ds["ratio"].values:
                n = int(ds["samples"].sel(dim=d, heads=h, ratio=r))
                assert n == max(1, round(r * critical_samples(h, d, study.tokens)))
                assert n == samples_at(r, h, d, study.tokens)


@pytest.mark.slow
def test_every_teacher_is_recovered_or_fails_in_exactly_one_way(tiny_results):
    study, path = tiny_results["phase"]
    ds = load(path)
    total = ds["success"] + ds["failure_optimisation"] + ds["failure_identification"]
    assert (total == 1).all()
    failed = ds["success"] == 0
    above = ds["train_excess"] > study.fit_tol
    assert ((ds["failure_optimisation"] == 1) == (failed & above)).all()
    assert ds["failure_optimisation"].attrs["tolerance"] == study.fit_tol
    rate = ds["success_rate"]
    np.testing.assert_array_equal(rate, ds["success"].mean("instance").transpose(*rate.dims))
    assert (ds["success_rate_lower"] <= rate).all() and (rate <= ds["success_rate_upper"]).all()
    # a gradient learner at a 20-step budget fails by optimisation, not by identification
    adam = ds.sel(learner="adam")
    assert (adam["failure_optimisation"] == 1).all()


def _first_crossing(log_n, rate):
    """The independent reading: where the empirical success curve first reaches one half,
    by linear interpolation in log N, and the two grid points around it."""
    for j in range(1, len(rate)):
        if rate[j - 1] < 0.5 <= rate[j]:
            w = (0.5 - rate[j - 1]) / (rate[j] - rate[j - 1])
            return log_n[j - 1] + w * (log_n[j] - log_n[j - 1]), log_n[j - 1], log_n[j]
    return None


@pytest.mark.slow
def test_thresholds_agree_with_a_reading_of_their_own_success_curves(tiny_results):
    _, path = tiny_results["phase"]
    ds = load(path)
    checked = 0
    for at in np.ndindex(*(ds.sizes[d] for d in THRESHOLD_DIMS)):
        sel = dict(zip(THRESHOLD_DIMS, at, strict=True))
        one = ds.isel(sel)
        rate = one["success"].mean("instance").values
        log_n = np.log(ds["samples"].isel(dim=sel["dim"], heads=sel["heads"]).values)
        t = float(one["threshold"])
        reading = _first_crossing(log_n, rate)
        monotone = np.all(np.diff(rate) >= 0)
        if reading is None:
            if rate.max() < 0.5 or rate.min() >= 0.5:
                assert np.isnan(t)  # never (or always) above one half: no crossing inside
            continue
        if monotone:
            interp, lo, hi = reading
            assert lo <= np.log(t) <= hi  # the logistic crosses where the curve does
            assert abs(np.log(t) - interp) <= 0.5 * (hi - lo)
            assert float(one["threshold_lower"]) <= t <= float(one["threshold_upper"])
            n_c = float(ds["critical_samples"].isel(dim=sel["dim"], heads=sel["heads"]))
            assert float(one["threshold_ratio"]) == pytest.approx(t / n_c)
            checked += 1
    assert checked >= 2  # variable projection crosses one half at every tiny head count


@pytest.mark.slow
def test_thresholds_and_their_intervals_are_reproducible(tiny_results):
    study, path = tiny_results["phase"]
    ds = load(path)
    again = study.derive(ds.drop_vars([v for v in ds.data_vars if "threshold" in v]))
    for name in ("threshold", "threshold_lower", "threshold_upper", "threshold_ratio_upper"):
        np.testing.assert_array_equal(again[name].values, ds[name].values)


@pytest.mark.slow
def test_a_separated_curve_has_the_grid_points_around_its_jump_as_interval(tiny_results):
    _, path = tiny_results["phase"]
    ds = load(path).sel(learner="varpro")
    for at in np.ndindex(ds.sizes["heads"], ds.sizes["beta"], ds.sizes["budget"]):
        one = ds.isel(heads=at[0], beta=at[1], budget=at[2], inputs=0, dim=0)
        hits = one["success"].sum("instance").values
        n = one.sizes["instance"]
        log_n = np.log(one["samples"].values)
        lo, hi = stats.separated_bracket(log_n, hits, n)
        if np.isfinite(lo):
            assert float(one["threshold_lower"]) <= np.exp(lo) + 1e-9
            assert float(one["threshold_upper"]) >= np.exp(hi) - 1e-9


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(ratio=(2.0, 1.0)), "increasing"),
        (dict(budget=(2.0, 1.0)), "budget: expected increasing"),
        (dict(budget=(0.0, 1.0)), "budget"),
        (dict(iterations=0), "iterations"),
        (dict(ladder=(4.0, 2.0)), "ladder: expected two increasing"),
        (dict(ladder=(2.0,)), "ladder"),
        (dict(ladder=(0.0, 2.0)), "ladder"),
        (dict(family="near_duplicate"), "needs heads >= 2"),
        (dict(family="two_tokens"), "needs tokens == 2"),
        (dict(family="hard"), "family"),
        (dict(inputs=("uniform",)), "inputs"),
        (dict(learner=("nope",)), "learner"),
        (dict(ratio=(0.0, 1.0)), "ratio"),
        (dict(beta=(-1.0,)), "beta"),
    ],
)
def test_bad_phase_specs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        STUDIES["phase"].preset("tiny", **bad)


@pytest.mark.slow
def test_a_dim_study_at_one_head_draws_its_heatmaps_over_dim(tiny_results):
    """With one head count and several dims the heatmap rows are the dims, and no
    thresholds-vs-heads panel of a single point is drawn."""
    import matplotlib
    import xarray as xr

    matplotlib.use("Agg")
    ds = load(tiny_results["phase"][1]).isel(heads=[0])
    dims = xr.concat([ds, ds.assign_coords(dim=[2 * ds["dim"].item()])], "dim")
    fig = plot(dims)
    heat = next(ax for ax in fig.axes if ax.get_title() == "recovered")
    assert [t.get_text() for t in heat.get_yticklabels()] == [f"{d}" for d in dims["dim"].values]
    curves = [ax.get_title() for ax in fig.axes if ax.get_title().startswith("recovered vs")]
    assert curves == [f"recovered vs N/N_c: dim d {d}" for d in dims["dim"].values]
    assert heat.get_ylabel().endswith("token dimension d")
    xlabels = [ax.get_xlabel() for ax in fig.axes]
    assert "heads m" not in xlabels and "token dimension d" in xlabels


@pytest.mark.slow
def test_budget_rungs_are_nested(tiny_results):
    """The larger budget only adds starts: a teacher fitted within the smaller budget keeps
    its fit, and no teacher runs fewer starts."""
    study, path = tiny_results["phase"]
    ds = load(path)
    small, large = ds.isel(budget=0), ds.isel(budget=1)
    for learner in ds["learner"].values:
        starts = study.starts(str(learner))
        assert starts[1] >= starts[0] >= 1
        s, g = small.sel(learner=learner), large.sel(learner=learner)
        assert (g["info_starts"] >= s["info_starts"]).all()
        assert (s["info_starts"] <= starts[0]).all() and (g["info_starts"] <= starts[1]).all()
        kept = s["converged"] == 1
        for name in ("success", "train_excess", "theta_error_max", "info_starts"):
            np.testing.assert_array_equal(s[name].where(kept), g[name].where(kept), err_msg=name)
    varpro = large.sel(learner="varpro")
    assert (varpro["info_starts"] > 2).any()  # the ladder ran more starts somewhere


def test_the_ladder_runs_the_larger_budgets_only_inside_its_window():
    """With ``ladder`` set, a cell inside the window equals the same cell of the run without
    one, bitwise; a cell outside keeps the first budget's fits at every budget (those of the
    run without a window at the first budget), cost included."""
    from mhalearn.experiments import run_study

    small = dict(learner=("varpro",), ratio=(0.5, 2.0), budget=(1.0, 4.0), heads=(1,), dim=(3,))
    small |= dict(beta=(4.0,), instances=6, bootstrap=10)
    full = run_study(STUDIES["phase"](**small))
    window = run_study(STUDIES["phase"](ladder=(1.0, 4.0), **small))
    fits = ["success", "train_excess", "theta_error_max", "info_starts"]
    inside, outside = dict(ratio=2.0), dict(ratio=0.5)
    for name in fits:
        np.testing.assert_array_equal(window[name].sel(inside), full[name].sel(inside))
        for b in (1.0, 4.0):
            np.testing.assert_array_equal(
                window[name].sel(ratio=0.5, budget=b), full[name].sel(ratio=0.5, budget=1.0)
            )
    np.testing.assert_array_equal(
        window["fit_seconds"].sel(ratio=0.5, budget=4.0),
        window["fit_seconds"].sel(ratio=0.5, budget=1.0),
    )
    assert (window["info_starts"].sel(outside) <= 2).all()
    assert (full["info_starts"].sel(ratio=0.5, budget=4.0) > 2).any()  # the window saved starts


def test_convergence_is_undecided_where_a_crossing_lies_outside_the_ladder():
    """Four cells (budgets 1, 4, 16): agreeing inside the window, disagreeing inside it,
    agreeing but crossing above the window, not crossed at all."""
    import xarray as xr

    from mhalearn.experiments.phase.study import budget_converged

    ratio = np.array(
        [[3.0, 2.5, 2.4], [3.0, 2.5, 2.0], [6.0, 6.0, 6.0], [3.0, 2.5, np.nan]]
    )  # (cell, budget)
    half = np.array([0.1, 0.1, 0.1])
    ds = xr.Dataset(
        {
            "threshold_ratio": (("cell", "budget"), ratio),
            "threshold_lower": (("cell", "budget"), ratio - half),
            "threshold_upper": (("cell", "budget"), ratio + half),
        },
        coords={"budget": [1.0, 4.0, 16.0]},
    )
    np.testing.assert_array_equal(budget_converged(ds), [1, 0, 1, np.nan])
    np.testing.assert_array_equal(budget_converged(ds, (1.8, 4.5)), [1, 0, np.nan, np.nan])


@pytest.mark.slow
def test_converged_thresholds_are_where_the_two_largest_budgets_agree(tiny_results):
    _, path = tiny_results["phase"]
    ds = load(path)
    checked = 0
    for at in np.ndindex(*(ds.sizes[d] for d in THRESHOLD_DIMS if d != "budget")):
        sel = dict(zip([d for d in THRESHOLD_DIMS if d != "budget"], at, strict=True))
        one = ds.isel(sel)
        t, lo, hi = (one[f"threshold{s}"].values for s in ("", "_lower", "_upper"))
        flag = float(one["budget_converged"])
        if not np.isfinite(t).all():
            assert np.isnan(flag) and np.isnan(float(one["threshold_converged"]))
            continue
        agree = lo[1] <= hi[0] and lo[0] <= hi[1]
        assert flag == float(agree)
        expect = t[1] if agree else np.nan
        np.testing.assert_equal(float(one["threshold_converged"]), expect)
        checked += 1
    assert checked >= 2


@pytest.mark.slow
def test_identified_means_no_fit_explains_the_data_away_from_the_teacher(tiny_results):
    study, path = tiny_results["phase"]
    ds = load(path)
    largest = ds.isel(budget=-1)
    away = largest["failure_identification"].max("learner")
    np.testing.assert_array_equal(ds["identified"], 1 - away.transpose(*ds["identified"].dims))
    # below the counting limit (N/N_c = 1/2) the data cannot identify a teacher: the oracle
    # reaches the teacher's training loss from its neighbourhood, away from it, every time
    below = largest.sel(ratio=0.5)
    assert (below.sel(learner="oracle")["train_excess"] <= study.fit_tol).all()
    assert (below["identified"] == 0).all()
    # well above it (16 N_c) every teacher is identified: the oracle recovers each one
    above = largest.sel(ratio=16.0)
    assert (above.sel(learner="oracle")["success"] == 1).all()
    assert (above["identified"] == 1).all()
    # the statistical threshold lies where the identified share crosses one half
    for at in np.ndindex(*(ds.sizes[d] for d in STATISTICAL_DIMS)):
        one = ds.isel(dict(zip(STATISTICAL_DIMS, at, strict=True)))
        t = float(one["threshold_statistical"])
        lo, hi = np.log(0.5 * one["critical_samples"]), np.log(16 * one["critical_samples"])
        assert lo < np.log(t) < hi
        assert float(one["threshold_statistical_lower"]) <= t
        assert t <= float(one["threshold_statistical_upper"])
        gap = one["threshold"].isel(budget=-1) / t
        np.testing.assert_allclose(one["threshold_gap"], gap)


def test_a_teacher_the_data_do_not_identify_is_found_so():
    """Hand-built: every sequence repeats one token, so every score row is constant, the
    attention uniform whatever Θ, and Θ is not identified. The oracle, started beside the
    teacher, fits the data exactly without moving Θ back: a non-identified fit. With
    ordinary data of the same size it recovers the teacher."""
    import jax
    import jax.numpy as jnp

    from mhalearn.data import boolean_tokens
    from mhalearn.experiments.phase import failure_kinds
    from mhalearn.layer import layer_outputs
    from mhalearn.learners.baselines import OracleConfig
    from mhalearn.metrics.recovery import parameter_errors, success
    from mhalearn.problems import RegressionProblem
    from mhalearn.teachers import TeacherSpec, sample_teacher

    spec = TeacherSpec(heads=1, dim=3, tokens=3, beta=2.0)
    teacher = sample_teacher(jax.random.key(1), spec)
    X = boolean_tokens(jax.random.key(2), (40, 3, 3))
    outcomes = []
    for data in (jnp.repeat(X[:, :1], 3, axis=1), X):  # one token repeated; as drawn
        Y = layer_outputs(data, teacher.theta, teacher.W)
        problem = RegressionProblem(X=data, Y=Y, heads=1, teacher=teacher)
        fit = jax.jit(OracleConfig().fit)(jax.random.key(3), problem)
        excess = (problem.loss(fit.params) - problem.loss(teacher)) / jnp.mean(Y**2)
        ok = success(parameter_errors(fit.params, teacher), 1e-3)
        outcomes.append([bool(v) for v in failure_kinds(ok, excess, 1e-6)] + [bool(ok)])
    assert outcomes[0] == [False, True, False]  # non-identified: fitted, away from the truth
    assert outcomes[1] == [False, False, True]  # recovered


def test_a_hard_family_draws_its_own_teachers():
    """The family reaches the teachers: rank-one teachers at one head are drawn (and fitted)
    differently from random ones on the same keys."""
    from mhalearn.experiments import run_study

    small = dict(learner=("oracle",), ratio=(8.0,), heads=(1,), dim=(3,), instances=4)
    runs = [
        run_study(STUDIES["phase"](family=f, bootstrap=10, **small)) for f in ("random", "rank_one")
    ]
    errors = [r["sum_w_error"].values for r in runs]
    assert not np.array_equal(*errors)
    assert runs[1].attrs["config"].count('"family": "rank_one"') == 1


@pytest.mark.slow
def test_the_statistical_thresholds_growth_is_fitted_like_the_computational_ones():
    """Both thresholds' growth in m are least-squares lines through their own point
    estimates (checked against numpy's polyfit), with the slope inside its interval."""
    from mhalearn.experiments import run_study

    study = STUDIES["phase"](
        learner=("oracle",),
        ratio=(0.5, 1.0, 2.0, 4.0),
        heads=(1, 2, 3),
        dim=(3,),
        instances=8,
        bootstrap=50,
    )
    ds = run_study(study).isel(learner=0, inputs=0, dim=0, beta=0)
    m = np.log(ds["heads"].values)
    for name, prefix in (
        ("threshold_statistical_ratio", "growth_statistical"),
        ("threshold_ratio", "growth"),
    ):
        r = ds[name].values if name.startswith("threshold_statistical") else ds[name].values[-1]
        assert np.isfinite(r).all(), name
        power = np.polyfit(m, np.log(r), 1)[0]
        expo = np.polyfit(ds["heads"].values, np.log(r), 1)[0]
        fit = ds[[v for v in ds.data_vars if str(v).startswith(prefix)]]
        np.testing.assert_allclose(float(fit[f"{prefix}_power"]), power, rtol=1e-10)
        np.testing.assert_allclose(float(fit[f"{prefix}_exponential"]), expo, rtol=1e-10)
        assert float(fit[f"{prefix}_better_share"]) >= 0.5


@pytest.mark.slow
def test_the_heads_figure_draws_a_column_per_family(tiny_results):
    import matplotlib

    from mhalearn.experiments.figures.phase import heads_figure

    matplotlib.use("Agg")
    ds = load(tiny_results["phase"][1])
    fig = heads_figure({"random": ds, "again": ds})
    titles = [ax.get_title() for ax in fig.axes]
    assert titles.count("random") == 1 and titles.count("again") == 1
    top = next(ax for ax in fig.axes if ax.get_title() == "random")
    labels = top.get_legend_handles_labels()[1]
    budgets = [f"varpro, budget {b:g}" for b in ds["budget"].values]
    assert all(any(b in label for label in labels) for b in budgets)
    assert any(label.startswith("random: statistical") for label in labels)
    assert any(label.startswith(f"random: {budgets[-1]}") for label in labels)  # its own fits
