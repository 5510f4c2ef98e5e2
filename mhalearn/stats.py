"""Statistics over instances: intervals of shares, and where a success curve crosses one half.

- :func:`wilson`: Wilson 95% intervals of success shares (scipy).
- :func:`logistic_crossing`: the point x₅₀ where a logistic fit of success counts in x crosses
  one half, for many curves at once (vectorised Newton on the binomial log-likelihood).
- :func:`separated_bracket`: where counts jump from none to all between two points (the fit
  cannot place its crossing between them).
- :func:`mean_interval`, :func:`median_interval`: a mean or median over instances with its
  bootstrap percentile interval.
- :func:`bootstrap_indices` and :func:`percentile_interval`: a bootstrap over instances
  (the same resampled instances for every curve that shares them) and its percentile interval.
- :func:`zero_crossing`: where a curve last changes sign, interpolated;
  :func:`crossing_interval`: that of a mean over instances, with its bootstrap interval.
- :func:`growth_fits`: a threshold's growth in the head count, fitted as a power law and as an
  exponential, with bootstrap intervals on both rates and which fits better.

Several results are named tuples (:class:`Interval`, :class:`Estimate`, :class:`Counts`,
:class:`Logistic`): read by field, or unpacked in order like numpy's pairs.

A hand-written Newton rather than statsmodels' GLM: the thresholds' bootstrap fits thousands
of two-parameter curves at once, which one vectorised Newton does in milliseconds and a loop
of GLM fits in minutes; the tests hold it against scipy's optimiser on the same likelihood.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

#: the logistic fits' ridge on both coefficients (standardised x): keeps the slope finite when
#: the counts are separated (a jump from 0 to 1 between two grid points), negligible otherwise
RIDGE = 1e-2


class Interval(NamedTuple):
    """Lower and upper bounds, arrays (or floats) of one shape; NaN where not resolved."""

    lower: np.ndarray
    upper: np.ndarray


class Estimate(NamedTuple):
    """A point estimate with the bounds of its interval."""

    value: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


class Counts(NamedTuple):
    """Success and trial counts of one shape."""

    successes: np.ndarray
    trials: np.ndarray


class Logistic(NamedTuple):
    """The coefficients of the success rate σ(intercept + slope·x)."""

    intercept: np.ndarray
    slope: np.ndarray


def wilson(successes: np.ndarray, trials: np.ndarray) -> Interval:
    """Wilson 95% intervals (lower, upper) of success shares (NaN where there is no trial)."""
    from scipy import stats

    lower = np.full(np.shape(trials), np.nan)
    upper = np.full(np.shape(trials), np.nan)
    for idx in np.ndindex(np.shape(trials)):
        if trials[idx] > 0:
            ci = stats.binomtest(int(successes[idx]), int(trials[idx])).proportion_ci(
                confidence_level=0.95, method="wilson"
            )
            lower[idx], upper[idx] = ci.low, ci.high
    return Interval(lower, upper)


def logistic_fit(
    x: np.ndarray, successes: np.ndarray, trials: np.ndarray, iterations: int = 100
) -> Logistic:
    """(a, b) maximising Σ_j k_j·log p_j + (n_j − k_j)·log(1 − p_j) − RIDGE·(a² + b²)/2 with
    p_j = σ(a + b·z_j), z = (x − mean x)/std x, for every curve at once.

    ``x``: (points,); ``successes`` k and ``trials`` n: (..., points). Newton's method on the
    strictly concave objective, its steps capped in length."""
    x = np.asarray(x, float)
    k = np.asarray(successes, float)
    n = np.broadcast_to(np.asarray(trials, float), k.shape)
    center, scale = x.mean(), x.std() or 1.0
    z = (x - center) / scale
    design = np.stack([np.ones_like(z), z], axis=-1)  # (points, 2)
    coef = np.zeros((*k.shape[:-1], 2))
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-(coef @ design.T)))
        grad = (k - n * p) @ design - RIDGE * coef
        w = n * p * (1 - p)
        hess = np.einsum("...j,ja,jb->...ab", w, design, design) + RIDGE * np.eye(2)
        step = np.linalg.solve(hess, grad[..., None])[..., 0]
        length = np.linalg.norm(step, axis=-1, keepdims=True)
        step = step * np.minimum(1.0, 5.0 / np.maximum(length, 1e-300))
        coef = coef + step
        if np.all(length < 1e-10):
            break
    a, b = coef[..., 0], coef[..., 1]
    # back to x: a + b·(x − c)/s
    return Logistic(a - b * center / scale, b / scale)


def logistic_crossing(x: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """x₅₀ = −a/b of :func:`logistic_fit`: where the fitted success rate crosses one half.
    NaN where the fit does not rise (b ≤ 0) or crosses outside [min x, max x] (the grid does
    not resolve it)."""
    a, b = logistic_fit(x, successes, trials)
    with np.errstate(divide="ignore", invalid="ignore"):
        x50 = np.where(b > 0, -a / b, np.nan)
    inside = (x50 >= np.min(x)) & (x50 <= np.max(x))
    return np.where(inside, x50, np.nan)


def separated_bracket(x: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> Interval:
    """The two neighbouring points of ``x`` (increasing) between which the counts jump from
    none recovered to all recovered, where they do (every point at or below the first all
    failures, every point above all successes); NaN elsewhere. There the fitted crossing is
    set by the ridge, and the data say only that it lies between those two points."""
    x = np.asarray(x, float)
    k = np.asarray(successes, float)
    n = np.broadcast_to(np.asarray(trials, float), k.shape)
    none, every = k == 0, k == n
    lower = np.full(k.shape[:-1], np.nan)
    upper = np.full(k.shape[:-1], np.nan)
    for j in range(1, x.shape[0]):
        jump = np.all(none[..., :j], axis=-1) & np.all(every[..., j:], axis=-1)
        lower = np.where(jump, x[j - 1], lower)
        upper = np.where(jump, x[j], upper)
    return Interval(lower, upper)


def bootstrap_indices(instances: int, replicates: int, seed: int) -> np.ndarray:
    """(replicates, instances) indices drawn with replacement: replicate r resamples the
    instances idx[r] (use the same ones for every curve whose instances are shared)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, instances, size=(replicates, instances))


def resampled_counts(flags: np.ndarray, idx: np.ndarray) -> Counts:
    """Successes and trials of the 0/1 ``flags`` (points, instances; NaN: missing) for each
    bootstrap replicate ``idx`` (replicates, instances): two (replicates, points) arrays."""
    flags = np.asarray(flags, float)
    picked = flags[:, idx]  # (points, replicates, instances)
    return Counts(np.nansum(picked, axis=-1).T, np.sum(np.isfinite(picked), axis=-1).T)


def percentile_interval(replicates: np.ndarray, level: float = 0.95, axis: int = 0) -> Interval:
    """The percentile interval of bootstrap ``replicates`` along ``axis``; NaN where more
    than (1 − level)/2 of the replicates are not finite (the interval is then not resolved:
    a tail of replicates fell outside what was measured)."""
    r = np.asarray(replicates, float)
    tail = (1 - level) / 2
    missing = np.mean(~np.isfinite(r), axis=axis)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice is NaN
        lo, hi = np.nanpercentile(r, [100 * tail, 100 * (1 - tail)], axis=axis)
    bad = missing > tail
    return Interval(np.where(bad, np.nan, lo), np.where(bad, np.nan, hi))


def _line_fits(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares slopes, residual sums of squares and intercepts of y (..., points) on x
    (points,); NaN where fewer than three points of y are finite."""
    y = np.asarray(y, float)
    ok = np.isfinite(y)
    slope = np.full(y.shape[:-1], np.nan)
    ssr = np.full(y.shape[:-1], np.nan)
    intercept = np.full(y.shape[:-1], np.nan)
    for idx in np.ndindex(y.shape[:-1]):
        keep = ok[idx]
        if keep.sum() < 3:
            continue
        xs, ys = x[keep], y[idx][keep]
        design = np.stack([np.ones_like(xs), xs], axis=-1)
        coef, *_ = np.linalg.lstsq(design, ys, rcond=None)
        intercept[idx], slope[idx] = coef
        ssr[idx] = np.sum((ys - design @ coef) ** 2)
    return slope, ssr, intercept


def line_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of y (..., points) on x (points,), NaN where fewer than three
    points of y are finite."""
    return _line_fits(np.asarray(x, float), y)[0]


def median_interval(
    values: np.ndarray, level: float = 0.95, replicates: int = 2000, seed: int = 0
) -> Estimate:
    """The median over the last axis (NaN ignored) and the percentile interval of the
    medians of ``replicates`` bootstrap resamples of that axis."""
    return _bootstrapped(np.nanmedian, values, level, replicates, seed)


def mean_interval(
    values: np.ndarray, level: float = 0.95, replicates: int = 2000, seed: int = 0
) -> Estimate:
    """The mean over the last axis (NaN ignored) and the percentile interval of the means of
    ``replicates`` bootstrap resamples of that axis."""
    return _bootstrapped(np.nanmean, values, level, replicates, seed)


def _bootstrapped(statistic, values, level: float, replicates: int, seed: int) -> Estimate:
    values = np.asarray(values, float)
    idx = bootstrap_indices(values.shape[-1], replicates, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice is NaN
        mid = statistic(values, axis=-1)
        reps = statistic(values[..., idx], axis=-1)  # (..., replicates)
    return Estimate(mid, *percentile_interval(reps, level, axis=-1))


def loglog_slope(
    x: np.ndarray, values: np.ndarray, level: float = 0.95, replicates: int = 2000, seed: int = 0
) -> Estimate:
    """The least-squares slope of log(median) vs log x, with medians over the instances of
    ``values`` (points, instances), and its bootstrap percentile interval: each replicate
    resamples the instances, the same ones at every point (they share their random
    problems)."""
    fit = power_law_fit(x, values, None, level, replicates, seed)
    return Estimate(fit["rate"], fit["rate_lower"], fit["rate_upper"])


def power_law_fit(
    x: np.ndarray,
    values: np.ndarray,
    target: float | None = None,
    level: float = 0.95,
    replicates: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """The power law median(values) ≈ c·x^rate, fitted by least squares of log(median) on
    log x (medians over the instances of ``values`` (points, instances)), and where it
    reaches ``target`` (``reach``: x = (target/c)^(1/rate); +inf where the rate is not
    negative, so the fit never comes down to the target). Each with a bootstrap percentile
    interval (NaN where more than the interval's tail of replicates is not finite): a
    replicate resamples the instances, the same ones at every point (they share their random
    problems). NaN with fewer than three finite medians."""
    values = np.asarray(values, float)
    idx = bootstrap_indices(values.shape[-1], replicates, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log of a 0 median, all-NaN slices
        log_mid = np.log(np.nanmedian(values, axis=-1))
        log_reps = np.log(np.nanmedian(values[:, idx], axis=-1)).T  # (replicates, points)
    log_x = np.log(np.asarray(x, float))
    both = np.concatenate([log_mid[None], log_reps])  # the point estimate, then the replicates
    slope, _, intercept = _line_fits(log_x, both)
    out = {"rate": float(slope[0])}
    out["rate_lower"], out["rate_upper"] = map(float, percentile_interval(slope[1:], level))
    if target is not None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            reach = np.where(slope < 0, np.exp((np.log(target) - intercept) / slope), np.inf)
        reach = np.where(np.isnan(slope), np.nan, reach)
        out["reach"] = float(reach[0])
        out["reach_lower"], out["reach_upper"] = map(float, percentile_interval(reach[1:], level))
    return out


def growth_fits(
    heads: np.ndarray, ratio: np.ndarray, replicates: np.ndarray, level: float = 0.95
) -> dict[str, np.ndarray | float]:
    """How a threshold ratio r(m) (> 0) grows with the head count m: log r = c + k·log m (a
    power law, rate k) and log r = c + s·m (an exponential, rate s per head), fitted by least
    squares to the point estimates ``ratio`` (heads,) and to each bootstrap replicate
    (replicates, heads) for the intervals. ``better`` is the model with the smaller residual
    sum of squares at the point estimate (both have two parameters), ``better_share`` the
    share of replicates in which that model also fits better. NaN with fewer than three
    finite thresholds."""
    m = np.asarray(heads, float)
    log_r = np.log(np.asarray(ratio, float))
    log_reps = np.log(np.asarray(replicates, float))
    power, ssr_power, _ = _line_fits(np.log(m), log_r)
    expo, ssr_expo, _ = _line_fits(m, log_r)
    power_reps, ssr_power_reps, _ = _line_fits(np.log(m), log_reps)
    expo_reps, ssr_expo_reps, _ = _line_fits(m, log_reps)
    power_lo, power_hi = percentile_interval(power_reps, level)
    expo_lo, expo_hi = percentile_interval(expo_reps, level)
    if np.isnan(ssr_power) or np.isnan(ssr_expo):
        better, share = "", np.nan
    else:
        better = "power" if ssr_power <= ssr_expo else "exponential"
        mine, other = (ssr_power_reps, ssr_expo_reps)
        if better == "exponential":
            mine, other = other, mine
        both = np.isfinite(mine) & np.isfinite(other)
        share = float(np.mean(mine[both] <= other[both])) if both.any() else np.nan
    return {
        "power": float(power),
        "power_lower": float(power_lo),
        "power_upper": float(power_hi),
        "exponential": float(expo),
        "exponential_lower": float(expo_lo),
        "exponential_upper": float(expo_hi),
        "better": better,
        "better_share": share,
    }


def zero_crossing(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where ``y`` (..., points) last changes sign along ``x`` (points, increasing), so that
    beyond it ``y`` keeps one sign on the grid: the zero of the line through the two points
    around that change; NaN where ``y`` keeps one sign (or is not finite) at every point."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    out = np.full(y.shape[:-1], np.nan)
    done = np.zeros(y.shape[:-1], bool)
    for j in range(x.shape[0] - 1, 0, -1):
        a, b = y[..., j - 1], y[..., j]
        change = ~done & np.isfinite(a) & np.isfinite(b) & ((a > 0) != (b > 0))
        with np.errstate(divide="ignore", invalid="ignore"):
            at = x[j - 1] + (x[j] - x[j - 1]) * a / (a - b)
        out = np.where(change, at, out)
        done |= change
    return out


def crossing_interval(
    x: np.ndarray,
    values: np.ndarray,
    curve: Callable[[np.ndarray], np.ndarray] | None = None,
    level: float = 0.95,
    replicates: int = 2000,
    seed: int = 0,
) -> Estimate:
    """:func:`zero_crossing` along ``x`` of the mean over instances of ``values`` (...,
    points, instances), or of ``curve`` of that mean (e.g. log(mean) − log ε), with the
    percentile interval of the same crossing over ``replicates`` bootstrap resamples of the
    instances (the same ones at every point)."""
    values = np.asarray(values, float)
    curve = curve or (lambda y: y)
    idx = bootstrap_indices(values.shape[-1], replicates, seed)
    reps = np.moveaxis(np.mean(values[..., idx], axis=-1), -1, 0)  # (replicates, ..., points)
    at = zero_crossing(x, curve(values.mean(-1)))
    return Estimate(at, *percentile_interval(zero_crossing(x, curve(reps)), level))


def crossing_thresholds(
    flags: np.ndarray, log_n: np.ndarray, replicates: int, seed: int
) -> dict[str, np.ndarray]:
    """Where the rate of 0/1 ``flags`` (…, points, instances; NaN: missing) crosses one half
    along ``log_n`` (…, points), per leading index: the rate per point with its Wilson 95%
    bounds (``rate``, ``rate_lower``, ``rate_upper``), and the crossing N* = exp(x*) of the
    logistic fit in log N (``threshold``) with a 95% bootstrap interval over instances
    (``threshold_lower``, ``threshold_upper``; ``replicates`` resamplings drawn from
    ``seed``), widened to at least the two grid points around a jump from 0 to 1 (every
    replicate jumps there too: what the grid resolves). ``threshold_replicates``: every
    replicate's N*, shape (replicates, …)."""
    shape = flags.shape[:-2]
    idx = bootstrap_indices(flags.shape[-1], replicates, seed)
    point = np.full(shape, np.nan)
    jump = np.full((2, *shape), np.nan)
    reps = np.full((replicates, *shape), np.nan)
    hits, trials = np.nansum(flags, axis=-1), np.sum(np.isfinite(flags), axis=-1)
    low, high = wilson(hits, trials)
    for at in np.ndindex(shape):
        x = log_n[at]
        point[at] = np.exp(logistic_crossing(x, hits[at], trials[at]))
        jump[(slice(None), *at)] = separated_bracket(x, hits[at], trials[at])
        k, n = resampled_counts(flags[at], idx)  # flags[at]: (points, instances)
        reps[(slice(None), *at)] = np.exp(logistic_crossing(x, k, n))
    lower, upper = percentile_interval(reps)
    lower, upper = np.fmin(lower, np.exp(jump[0])), np.fmax(upper, np.exp(jump[1]))
    return {
        "rate": hits / trials,
        "rate_lower": low,
        "rate_upper": high,
        "threshold": point,
        "threshold_lower": lower,
        "threshold_upper": upper,
        "threshold_replicates": reps,
    }


def growth_table(
    heads: np.ndarray, ratio: np.ndarray, replicates: np.ndarray, axis: int
) -> dict[str, np.ndarray]:
    """:func:`growth_fits` along the heads axis ``axis`` of ``ratio`` (its replicates:
    ``replicates``, one leading axis more), per index of the other axes: arrays of every
    number it returns, and ``exponential_better`` (1.0 where the exponential fit is the
    better one, 0.0 where the power law is, NaN where neither can be fitted)."""
    shape = ratio.shape[:axis] + ratio.shape[axis + 1 :]
    names = ("power", "power_lower", "power_upper", "exponential", "exponential_lower")
    names += ("exponential_upper", "better_share")
    out = {name: np.full(shape, np.nan) for name in (*names, "exponential_better")}
    for at in np.ndindex(shape):
        pick = (*at[:axis], slice(None), *at[axis:])
        fits = growth_fits(heads, ratio[pick], replicates[(slice(None), *pick)])
        for name in names:
            out[name][at] = fits[name]
        if fits["better"]:
            out["exponential_better"][at] = fits["better"] == "exponential"
    return out
