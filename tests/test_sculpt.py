"""The sculpt study: its flags, phase times and onsets against independent readings."""

import numpy as np
import pytest

from mhalearn.experiments import figures
from mhalearn.experiments.sculpt import ONSETS, PHASES, onset
from mhalearn.learners import chen_li as cl
from mhalearn.store import load


def onset_reference(values, samples, holds):
    """A loop: walk down from the largest N while the criterion holds."""
    out = np.full(values.shape[:-1], np.nan)
    for at in np.ndindex(*values.shape[:-1]):
        first = np.nan
        for j in reversed(range(len(samples))):
            if not holds(values[at][j]):
                break
            first = samples[j]
        out[at] = first
    return out


def test_onset_equals_a_loop_reference(rng):
    samples = np.array([10, 30, 100, 300, 1000])
    values = rng.random((4, 3, 5))
    values[0, 0] = [0.9, 0.1, 0.9, 0.1, 0.1]  # holds, fails, holds: the onset is after the fail
    values[1, 1] = 0.9  # never holds
    holds = lambda v: v < 0.5  # noqa: E731
    got = onset(values, samples, holds)
    np.testing.assert_array_equal(got, onset_reference(values, samples, holds))
    assert got[0, 0] == 300 and np.isnan(got[1, 1])


@pytest.mark.slow
def test_sculpt_flags_times_and_onsets(tiny_results):
    study, path = tiny_results["sculpt"]
    ds = load(path)
    recovered, accepted = ds["success"] == 1, ds["info_accepted"] == 1
    assert ((ds["false_accept"] == 1) == (accepted & ~recovered)).all()
    assert ((ds["false_reject"] == 1) == (~accepted & recovered)).all()
    # the search used the study's span method, estimated from the same K as the others
    np.testing.assert_allclose(
        ds["span_angle_estimate"], ds[f"span_angle_{study.span_method}"], atol=1e-12
    )
    for method in cl.SPAN_METHODS:
        angle = ds[f"span_angle_{method}"].values
        assert np.all((angle >= 0) & (angle <= np.pi / 2 + 1e-9)), method
    tilt = ds["k_tilt"].values  # K's tilt at the heads (checked against a loop in test_chen_li)
    assert np.all((tilt >= 0) & (tilt <= np.pi / 2))
    seconds = ds["phase_seconds"]
    assert list(seconds["phase"].values) == list(PHASES)
    assert np.all(np.isfinite(seconds)) and np.all(seconds > 0)
    samples = ds["samples"].values
    for name, criterion in ONSETS.items():
        da = ds[criterion.variable].transpose("heads", "beta", "samples", "instance")
        stat = np.mean if criterion.statistic == "rate" else np.nanmedian  # NaN: no row certified
        value = stat(da.values.astype(float), axis=-1)
        want = onset_reference(value, samples, criterion.holds)
        np.testing.assert_array_equal(ds[f"onset_{name}"].values, want, err_msg=name)


def test_sculpt_refuses_bad_specs():
    from mhalearn.experiments import Sculpt

    with pytest.raises(ValueError, match="span_method"):
        Sculpt(span_method="lines")
    with pytest.raises(ValueError, match="increasing"):
        Sculpt(samples=(1000, 300))


@pytest.mark.slow
def test_sculpt_figure_shades_where_k_stops_growing(tiny_results):
    """Grey in the span row from the first N where the median teacher certifies at least the
    rows K keeps; none where it never does."""
    import matplotlib.pyplot as plt

    study, path = tiny_results["sculpt"]
    ds = load(path)
    samples = ds["samples"].values
    rows = ds["info_rows_certified"].astype(float)
    for first in (1, None):  # full from the second N on; never full
        cut = np.inf if first is None else samples[first]
        ds["info_rows_certified"] = rows * 0 + (ds["samples"] >= cut) * 2.0 * study.max_rows
        fig = figures.sculpt.figure(ds)
        ax = fig.axes[2 * ds.sizes["heads"]]  # the span row, first column (axes row by row)
        shaded = [p for p in ax.patches if p.get_label().startswith("K full")]
        if first is None:
            assert not shaded
        else:
            (patch,) = shaded
            assert patch.get_x() == samples[first]
        plt.close(fig)
