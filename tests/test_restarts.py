"""Starts as rounds over the unfitted instances, against a restart loop one instance at a time."""

import jax
import numpy as np
import pytest

from mhalearn.learners.gd import GDConfig
from mhalearn.learners.varpro import VarProConfig
from mhalearn.restarts import OneStart, default_starts, simulate_starts, single_start
from mhalearn.simulate import simulate
from mhalearn.tasks import RegressionTask
from mhalearn.teachers import TeacherSpec

BETA = np.array([1.0, 4.0] * 6)  # swept: each round must hand its instances their own β
TASK = RegressionTask(
    teacher=TeacherSpec(heads=2, dim=3, tokens=3, beta=BETA), samples=20, test_samples=16
)
# few iterations per start: some instances need several starts, some never fit
LEARNER = VarProConfig(iterations=8, restarts=9, tol=1e-10)
KEY = jax.random.key(3)


def reference(starts: int) -> dict[str, np.ndarray]:
    """Each instance alone, its starts one after another until one fits: the kept start is
    the lowest final loss (ties: the earlier), NaN last."""
    out = {"theta_error_max": [], "train_loss": [], "starts": [], "steps_taken": []}
    for i in range(BETA.size):
        task = RegressionTask(
            teacher=TeacherSpec(heads=2, dim=3, tokens=3, beta=float(BETA[i])),
            samples=20,
            test_samples=16,
        )
        kept, kept_loss, ran = None, np.inf, 0
        for r in range(starts):
            res = simulate(KEY, task, OneStart(single_start(LEARNER), r), 1, key_ids=[i])
            ran += 1
            loss = res.trace["loss"][0, -1]
            loss = np.inf if np.isnan(loss) else loss
            if loss < kept_loss or kept is None:
                kept, kept_loss = res, loss
            if res.status["converged"][0]:
                break
        out["theta_error_max"].append(kept.metrics["theta_error_max"][0])
        out["train_loss"].append(kept.trace["loss"][0, -1])
        out["starts"].append(ran)
        out["steps_taken"].append(kept.status["steps_taken"][0])
    return {k: np.array(v) for k, v in out.items()}


def test_rounds_equal_one_instance_at_a_time():
    ladder = simulate_starts(KEY, TASK, LEARNER, BETA.size, [1, 3, 9])
    for starts, res in zip([1, 3, 9], ladder, strict=True):
        ref = reference(starts)
        np.testing.assert_array_equal(res.metrics["info_starts"], ref["starts"])
        np.testing.assert_array_equal(res.status["steps_taken"], ref["steps_taken"])
        np.testing.assert_array_equal(res.trace["loss"][:, -1], ref["train_loss"])
        np.testing.assert_array_equal(res.metrics["theta_error_max"], ref["theta_error_max"])
    # the case is one where starts matter: some instances need more than one, some fit
    starts = ladder[-1].metrics["info_starts"]
    assert (starts > 1).any() and (starts < 9).any()
    assert ladder[-1].status["converged"].sum() > ladder[0].status["converged"].sum()


def test_rungs_are_nested_and_independent_of_the_chunk_size():
    whole = simulate_starts(KEY, TASK, LEARNER, BETA.size, [2, 5])
    alone = simulate_starts(KEY, TASK, LEARNER, BETA.size, 2, chunk_size=5)
    chunked = simulate_starts(KEY, TASK, LEARNER, BETA.size, [2, 5], chunk_size=5)
    for a, b in zip(whole, chunked, strict=True):
        for name in a.metrics:
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    for name in whole[0].metrics:  # the rung at 2 starts is the run of 2 starts
        np.testing.assert_array_equal(whole[0].metrics[name], alone[0].metrics[name])
    np.testing.assert_array_equal(whole[0].sweep["task.teacher.beta"], BETA)


def test_a_learner_without_restarts_and_bad_ladders():
    gd = GDConfig(steps=5, lr=0.01)
    assert default_starts(gd) == 1 and single_start(gd) is gd
    assert default_starts(LEARNER) == 9 and single_start(LEARNER).restarts == 1
    (res,) = simulate_starts(KEY, TASK, gd, BETA.size, 2)
    np.testing.assert_array_equal(res.metrics["info_starts"], 2)  # GD never "fits" here
    for bad in ([], [0, 1], [3, 2], [2, 2]):
        with pytest.raises(ValueError, match="starts"):
            simulate_starts(KEY, TASK, LEARNER, BETA.size, bad)


def test_one_start_is_the_learners_own_fit():
    """Start 0 fits from the learner's key itself: one start of a learner without restarts
    is a plain simulate, bitwise."""
    gd = GDConfig(steps=7, lr=0.01)
    (res,) = simulate_starts(KEY, TASK, gd, BETA.size, 1)
    plain = simulate(KEY, TASK, gd, BETA.size)
    for name in plain.metrics:
        np.testing.assert_array_equal(res.metrics[name], plain.metrics[name], err_msg=name)


TWO_DEVICES = """
import sys
import numpy as np
import mhalearn as mh
mh.set_precision("float64")
mh.split_cpu(2)
from tests.test_restarts import BETA, KEY, LEARNER, TASK
from mhalearn.restarts import simulate_starts
ladder = simulate_starts(KEY, TASK, LEARNER, BETA.size, [2, 5], devices=2, chunk_size=4)
np.savez(sys.argv[1], **{f"{i}/{k}": v for i, r in enumerate(ladder) for k, v in r.metrics.items()})
"""


@pytest.mark.slow
def test_two_cpu_devices_give_the_same_rounds_bit_for_bit(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "two.npz"
    run = subprocess.run(
        [sys.executable, "-c", TWO_DEVICES, str(out)], cwd=root, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    saved = np.load(out)
    here = simulate_starts(KEY, TASK, LEARNER, BETA.size, [2, 5])
    for i, res in enumerate(here):
        for name, value in res.metrics.items():
            np.testing.assert_array_equal(saved[f"{i}/{name}"], value, err_msg=name)
