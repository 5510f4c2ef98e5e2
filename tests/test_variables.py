"""Every variable a study or simulate writes says what it is: long_name, description, units."""

import jax
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.experiments import STUDIES
from mhalearn.store import load
from mhalearn.variables import VARIABLES, attributes, meta

UNITS = {"relative", "rad", "steps", "nats", "s"}


def check_described(ds):
    for name, var in ds.data_vars.items():
        assert meta(str(name)) is not None, f"{name} is not registered in mhalearn.variables"
        attrs = var.attrs
        assert attrs["long_name"] and attrs["description"].endswith("."), name
        assert "\n" not in attrs["description"]
        assert attrs.get("units", "relative") in UNITS, name
        if "flag_values" in attrs:  # a flag: 0, 1 or missing
            values = var.values[np.isfinite(var.values.astype(float))]
            assert np.isin(values, [0, 1]).all(), name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_variable_is_described_on_disk(tiny_results, name):
    _, path = tiny_results[name]
    check_described(load(path))


@pytest.mark.slow
def test_simulate_results_are_described_with_the_tolerance():
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=3, tokens=2, beta=1.0),
        samples=20,
        test_samples=8,
        success_tol=1e-2,
    )
    learner = mh.ChenLiConfig(candidates=1, span_queries=2, qp_iterations=20)
    ds = mh.simulate(jax.random.key(0), task, learner, 2).to_xarray()
    check_described(ds)
    assert ds["success"].attrs["tolerance"] == 1e-2
    assert (
        "Σ_n ‖F̂(X_n) − F(X_n)‖²_F / Σ_n ‖F(X_n)‖²_F" in ds["prediction_error"].attrs["description"]
    )


def test_patterns_and_unknown_names():
    assert meta("trace_loss").long_name == VARIABLES["train_loss"].long_name
    assert meta("trace_test_loss").description.startswith("At each logged step: ")
    assert meta("info_movement_theta_relative").units == "relative"
    assert "‖W_T − W_0‖_F" in meta("info_movement_W").description
    assert meta("my_own") is None
    assert attributes("my_own") == {"long_name": "my own", "description": "Not documented."}
