"""The phase study: its grid, failure types and thresholds against independent readings."""

import numpy as np
import pytest

from mhalearn import stats
from mhalearn.experiments import STUDIES
from mhalearn.experiments.phase import THRESHOLD_DIMS, critical_samples, samples_at
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
    for at in np.ndindex(ds.sizes["heads"], ds.sizes["beta"]):
        one = ds.isel(heads=at[0], beta=at[1], inputs=0, dim=0)
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
    fig = STUDIES["phase"].figure(dims)
    heat = next(ax for ax in fig.axes if ax.get_title() == "recovered")
    assert [t.get_text() for t in heat.get_yticklabels()] == [f"{d}" for d in dims["dim"].values]
    curves = [ax.get_title() for ax in fig.axes if ax.get_title().startswith("recovered vs")]
    assert curves == [f"recovered vs N/N_c: dim d {d}" for d in dims["dim"].values]
    assert heat.get_ylabel().endswith("token dimension d")
    xlabels = [ax.get_xlabel() for ax in fig.axes]
    assert "heads m" not in xlabels and "token dimension d" in xlabels
