"""Intervals and thresholds (mhalearn.stats) against closed forms and slow references."""

import numpy as np
import pytest
import scipy.optimize

from mhalearn import stats


def test_wilson_intervals_match_the_closed_form():
    k, n = np.array([0, 3, 10]), np.array([10, 10, 10])
    lo, hi = stats.wilson(k, n)
    z = 1.959963984540054
    p = k / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    np.testing.assert_allclose(lo, centre - half, atol=1e-12)
    np.testing.assert_allclose(hi, centre + half, atol=1e-12)
    assert np.isnan(stats.wilson(np.array([0]), np.array([0])).lower).all()


def _penalised_nll(coef, z, k, n):
    """The objective of stats.logistic_fit in the standardised variable, written plainly."""
    a, b = coef
    total = 0.0
    for zj, kj, nj in zip(z, k, n, strict=True):
        eta = a + b * zj
        total -= kj * eta - nj * np.logaddexp(0.0, eta)
    return total + stats.RIDGE * (a**2 + b**2) / 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_logistic_fit_is_the_maximum_of_its_likelihood(seed):
    rng = np.random.default_rng(seed)
    x = np.log(np.geomspace(4, 200, 8))
    n = rng.integers(5, 60, size=8)
    k = rng.binomial(n, 1 / (1 + np.exp(-(x - x.mean()) * rng.uniform(0.5, 4))))
    a, b = stats.logistic_fit(x, k, n)
    z = (x - x.mean()) / x.std()
    ref = scipy.optimize.minimize(
        _penalised_nll,
        np.zeros(2),
        args=(z, k, n),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
    ).x
    # back in x: a + b·(x − c)/s
    np.testing.assert_allclose(
        [a, b], [ref[0] - ref[1] * x.mean() / x.std(), ref[1] / x.std()], rtol=1e-5, atol=1e-6
    )


def test_the_crossing_of_a_known_logistic_is_found_and_a_batch_matches_one_at_a_time():
    rng = np.random.default_rng(3)
    x = np.linspace(0.0, 4.0, 12)
    truth = np.array([1.3, 2.0, 2.9])
    n = np.full(12, 4000)
    k = rng.binomial(n, 1 / (1 + np.exp(-3.0 * (x[None] - truth[:, None]))))
    found = stats.logistic_crossing(x, k, n)
    np.testing.assert_allclose(found, truth, atol=0.05)
    one = [stats.logistic_crossing(x, k[i], n) for i in range(3)]
    np.testing.assert_allclose(found, one, rtol=1e-12)


def test_a_jump_from_none_to_all_crosses_between_the_two_points():
    x = np.log(np.array([4.0, 8, 16, 32, 64]))
    n = np.full(5, 1024)
    k = np.array([0, 0, 0, 1024, 1024])
    x50 = stats.logistic_crossing(x, k, n)
    assert x[2] < x50 < x[3]


def test_no_crossing_inside_the_grid_is_nan():
    x = np.linspace(0, 1, 5)
    n = np.full(5, 100)
    always, never = np.full(5, 100), np.zeros(5)
    falling = np.array([100, 80, 50, 20, 0])
    assert np.isnan(stats.logistic_crossing(x, np.stack([always, never, falling]), n)).all()


def test_bootstrap_counts_resample_instances_jointly():
    flags = np.array([[0, 1, 1, np.nan], [1, 1, 0, 1]])
    idx = np.array([[0, 0, 0, 0], [1, 2, 3, 3]])
    k, n = stats.resampled_counts(flags, idx)
    np.testing.assert_array_equal(k, [[0, 4], [2, 3]])
    np.testing.assert_array_equal(n, [[4, 4], [2, 4]])


def test_percentile_intervals_and_their_unresolved_tails():
    reps = np.arange(1.0, 1001.0)
    lo, hi = stats.percentile_interval(reps)
    assert lo == pytest.approx(np.percentile(reps, 2.5)) and hi == pytest.approx(
        np.percentile(reps, 97.5)
    )
    reps[:30] = np.nan  # 3% of replicates found no threshold: more than one tail
    assert np.isnan(stats.percentile_interval(reps)).all()


def test_growth_fits_tell_a_power_law_from_an_exponential():
    m = np.array([1.0, 2, 3, 4, 6])
    rng = np.random.default_rng(0)
    noise = lambda: np.exp(rng.normal(0, 0.01, size=(200, 5)))  # noqa: E731
    power = 3.0 * m**1.5
    fits = stats.growth_fits(m, power, power * noise())
    assert fits["better"] == "power" and fits["better_share"] > 0.9
    assert fits["power_lower"] < 1.5 < fits["power_upper"]
    expo = 2.0 * np.exp(0.7 * m)
    fits = stats.growth_fits(m, expo, expo * noise())
    assert fits["better"] == "exponential"
    assert fits["exponential_lower"] < 0.7 < fits["exponential_upper"]
    two = stats.growth_fits(m[:2], power[:2], power[:2] * noise()[:, :2])
    assert np.isnan(two["power"]) and two["better"] == ""


def test_loglog_slope_recovers_a_power_law_and_brackets_it_under_noise():
    rng = np.random.default_rng(0)
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    exact = np.repeat((3.0 * x**-0.5)[:, None], 16, axis=1)
    slope, lo, hi = stats.loglog_slope(x, exact)
    np.testing.assert_allclose([slope, lo, hi], -0.5, rtol=1e-12)
    # independent multiplicative noise per point and instance: the interval holds the true rate
    noisy = exact * np.exp(0.2 * rng.standard_normal(exact.shape))
    slope, lo, hi = stats.loglog_slope(x, noisy)
    assert lo < -0.5 < hi and lo < slope < hi


def test_power_law_fit_reaches_its_target_where_the_closed_form_says():
    x = np.array([1e2, 1e3, 1e4, 1e5])
    exact = np.repeat((3.0 * x**-0.5)[:, None], 8, axis=1)
    fit = stats.power_law_fit(x, exact, target=1e-3)
    # 3·N^(-1/2) = 1e-3 at N = (3e3)²
    np.testing.assert_allclose([fit[k] for k in ("reach", "reach_lower", "reach_upper")], 9e6)
    np.testing.assert_allclose(fit["rate"], -0.5)
    flat = stats.power_law_fit(x, np.ones((4, 8)) * 0.06, target=1e-3)  # a plateau: never
    assert abs(flat["rate"]) < 1e-12 and np.isinf(flat["reach"]) and np.isnan(flat["reach_lower"])
    few = stats.power_law_fit(x[:2], exact[:2], target=1e-3)
    assert np.isnan(few["rate"]) and np.isnan(few["reach"])


def test_median_interval_is_the_median_and_a_bracket_of_it():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 400)) + np.array([[0.0], [1.0], [2.0]])
    mid, lo, hi = stats.median_interval(values)
    np.testing.assert_allclose(mid, np.median(values, axis=1))
    assert np.all((lo < mid) & (mid < hi)) and np.all(hi - lo < 0.5)
    assert np.all((lo < [0, 1, 2]) & ([0, 1, 2] < hi))


def test_mean_interval_is_the_mean_and_its_normal_theory_width():
    rng = np.random.default_rng(2)
    values = rng.standard_normal((3, 400)) + np.array([[0.0], [1.0], [2.0]])
    mid, lo, hi = stats.mean_interval(values)
    np.testing.assert_allclose(mid, values.mean(axis=1))
    # the bootstrap interval of a mean of 400 unit normals: about ±1.96/√400 = ±0.098
    np.testing.assert_allclose(hi - lo, 2 * 1.96 * values.std(axis=1) / 20, rtol=0.15)
    assert np.all((lo < mid) & (mid < hi))


def test_zero_crossing_interpolates_the_last_sign_change():
    x = np.array([0.0, 1.0, 2.0, 4.0])
    y = np.array(
        [
            [2.0, 1.0, -1.0, -3.0],  # between 1 and 2, halfway
            [1.0, 2.0, 3.0, 4.0],  # never
            [-1.0, 1.0, 1.0, -1.0],  # the last change, between 2 and 4, halfway
            [np.nan, 3.0, 1.0, -1.0],  # between 2 and 4, three quarters of the way
        ]
    )
    np.testing.assert_allclose(stats.zero_crossing(x, y), [1.5, np.nan, 3.0, 3.0])
    # the crossing of a line is its root wherever the grid puts the points around it
    slope, root = -0.7, 1.234
    assert stats.zero_crossing(x, slope * (x - root)) == pytest.approx(root)


def test_crossing_interval_of_lines_is_their_mean_root():
    """Each instance a line slope·(x − root_i): the mean curve is the line through the mean
    root, so the crossing is that mean, and its interval a bootstrap interval of a mean of 400
    roots (about ±1.96·sd/20); a curve of the mean moves the crossing as it should."""
    rng = np.random.default_rng(3)
    x = np.linspace(0.0, 4.0, 9)
    roots = 2.0 + 0.3 * rng.standard_normal(400)
    values = -0.7 * (x[:, None] - roots[None, :])  # (points, instances)
    found = stats.crossing_interval(x, values)
    assert found.value == pytest.approx(roots.mean())
    half = 1.96 * roots.std() / 20
    assert found.lower == pytest.approx(roots.mean() - half, abs=0.3 * half)
    assert found.upper == pytest.approx(roots.mean() + half, abs=0.3 * half)
    shifted = stats.crossing_interval(x, values, curve=lambda y: y + 0.7)  # root + 1
    assert shifted.value == pytest.approx(roots.mean() + 1)
