"""Every figure renders from a saved results file (Agg backend) and says what it draws."""

import matplotlib
import numpy as np
import pytest
import xarray as xr

from mhalearn import plots
from mhalearn.experiments import STUDIES, figures
from mhalearn.experiments.figures import plot
from mhalearn.store import load

matplotlib.use("Agg")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_figure_renders_and_explains_itself(tiny_results, tmp_path, name):
    study, path = tiny_results[name]
    fig = plot(load(path))
    panels = [ax for ax in fig.axes if not hasattr(ax, "_colorbar")]  # colour bars: y only
    labels = [ax.get_xlabel() for ax in panels]
    assert all(labels) and all(ax.get_ylabel() for ax in fig.axes)
    curves = [line for ax in panels for line in ax.get_lines()]
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
    with pytest.raises(ValueError, match="no study with a figure"):
        plot(ds)
    with pytest.raises(ValueError, match="no study with a figure"):
        plot(xr.Dataset())


@pytest.mark.slow
def test_sculpt_figure_draws_the_rows_asked_for_and_refuses_others(tiny_results):
    from mhalearn.experiments.figures.sculpt import FIGURE_ROWS
    from mhalearn.experiments.figures.sculpt import figure as sculpt_figure

    ds = load(tiny_results["sculpt"][1])
    heads = ds.sizes["heads"]
    for rows in (("sigma_w", "truth_in_k"), ("span",), ("theta_error", "recovered")):
        fig = sculpt_figure(ds, rows)
        assert len(fig.axes) == len(rows) * heads
        texts = " ".join(t.get_text() for t in fig.texts)
        assert f"Row {len(rows)}:" in texts and f"Row {len(rows) + 1}:" not in texts
    assert len(sculpt_figure(ds).axes) == len(FIGURE_ROWS) * heads
    with pytest.raises(ValueError, match="rows: expected some of"):
        sculpt_figure(ds, ("nonsense",))


@pytest.mark.slow
def test_phase_figure_opens_with_success_curves_and_colour_bars(tiny_results):
    ds = load(tiny_results["phase"][1])
    fig = plot(ds)
    top = [ax for ax in fig.axes if ax.get_title().startswith("recovered vs N/N_c")]
    assert len(top) == ds.sizes["heads"]
    for ax in top:
        assert ax.get_ylabel() == "share recovered" and ax.get_lines()
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "share of teachers"]
    assert len(bars) == ds.sizes["learner"] * ds.sizes["beta"]


def test_max_margin_curves_that_coincide_stay_apart():
    """Two cells with identical values: drawn at shifted steps, one with hollow markers."""
    steps = np.array([0, 1, 10])
    values = np.broadcast_to(np.linspace(0, 1, 3), (1, 2, 1, 4, 3)).copy()
    trace = (("shape", "attention", "heads", "instance", "step"), values)
    ds = xr.Dataset(
        {"trace_correlation": trace, "trace_selected_weight": trace},
        coords={"shape": ["6x8x10"], "attention": ["cross", "self"], "heads": [1], "step": steps},
    )
    ds.attrs["config"] = "{}"
    fig = figures.max_margin.figure(ds)
    lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) == 3]
    assert len({tuple(line.get_xdata()) for line in lines}) == 2
    assert {line.get_markerfacecolor() == "none" for line in lines} == {True, False}


def test_a_ratio_axis_writes_plain_ticks_inside_its_limits():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mhalearn import plots

    fig, ax = plt.subplots()
    ax.plot([1, 2], [1.2, 3.5])
    plots.ratio_axis(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    low, high = ax.get_ylim()
    assert labels == [f"{v:g}" for v in plots.RATIO_TICKS if low <= v <= high]
    assert "1.5" in labels and "3" in labels and ax.get_yscale() == "log"
    plt.close(fig)
