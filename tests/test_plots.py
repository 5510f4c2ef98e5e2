"""Every figure renders from a saved results file (Agg backend) and says what it draws."""

import matplotlib
import numpy as np
import pytest
import xarray as xr

from mhalearn import plots
from mhalearn.experiments import STUDIES, plot
from mhalearn.store import load

matplotlib.use("Agg")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_figure_renders_and_explains_itself(tiny_results, tmp_path, name):
    study, path = tiny_results[name]
    fig = plot(load(path))
    labels = [ax.get_xlabel() for ax in fig.axes]
    assert all(labels) and all(ax.get_ylabel() for ax in fig.axes)
    curves = [line for ax in fig.axes for line in ax.get_lines()]
    assert curves
    for line in curves:  # every curve drawn has points (an all-NaN curve is a defect)
        assert np.isfinite(np.asarray(line.get_ydata(), float)).any(), line.get_label()
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    texts = " ".join(t.get_text() for t in fig.texts)
    assert f"{study.instances} " in texts and ("interquartile" in texts or "Wilson" in texts)
    assert fig.get_suptitle()
    target = tmp_path / f"{name}.png"
    plots.save(fig, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_sample_axes_show_the_values_and_curves_are_told_apart(tiny_results):
    study, path = tiny_results["recovery"]
    fig = plot(load(path))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in study.samples]
    (errors,) = [ax for ax in fig.axes if ax.get_ylabel().startswith("squared")][:1]
    styles = {(line.get_marker(), line.get_linestyle()) for line in errors.get_lines()}
    assert len(styles) == len(study.learner)
    xs = [tuple(line.get_xdata()) for line in errors.get_lines()]
    assert len(set(xs)) == len(xs)  # shifted: coinciding curves stay visible


@pytest.mark.slow
def test_unknown_results_are_refused(tiny_results):
    ds = load(tiny_results["margin"][1])
    ds.attrs["study"] = "nonsense"
    with pytest.raises(ValueError, match="no known study"):
        plot(ds)
    with pytest.raises(ValueError, match="no known study"):
        plot(xr.Dataset())
