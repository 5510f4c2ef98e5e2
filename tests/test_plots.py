"""Every figure renders from a saved results file (Agg backend)."""

import matplotlib
import pytest

from mhalearn import plots
from mhalearn.store import load
from tests.studies import TINY

matplotlib.use("Agg")


@pytest.mark.parametrize("name", list(TINY))
def test_every_figure_renders_from_a_saved_file(tiny_results, tmp_path, name):
    _, path = tiny_results[name]
    fig = plots.plot(load(path))
    labels = [ax.get_xlabel() for ax in fig.axes]
    assert all(labels) and len(fig.axes) >= 1
    assert any(line.get_xydata().size for ax in fig.axes for line in ax.get_lines())
    target = tmp_path / f"{name}.png"
    plots.save(fig, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_results_are_refused(tiny_results):
    ds = load(tiny_results["margin"][1])
    ds.attrs["study"] = "nonsense"
    with pytest.raises(ValueError, match="no known study"):
        plots.plot(ds)
