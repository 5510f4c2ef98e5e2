"""The command runs in a subprocess: this also exercises the default precision (x64 off)."""

import os
import subprocess
import sys

import pytest


def mhalearn(*args):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    return subprocess.run(
        [sys.executable, "-m", "mhalearn", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_run_prints_a_diagnostics_table():
    out = mhalearn("run", "--teachers", "3", "--samples", "32", "--heads", "3", "--dim", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "3 teachers: heads=3 dim=5" in lines[0] and "float32" in lines[0]
    header = lines[1].split()
    assert header[:3] == ["teacher", "attempts", "w_norm"] and "agreement" in header
    rows = [line.split() for line in lines[2:5]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    for r in rows:
        values = [float(v) for v in r[2:]]
        assert all(v == v for v in values)  # no NaN
        assert 0 < float(r[header.index("max_attn")]) <= 1
    assert lines[5].startswith(" median")


def test_same_seed_same_table_and_float64():
    a = mhalearn("run", "--teachers", "2", "--samples", "16", "--seed", "3")
    b = mhalearn("run", "--teachers", "2", "--samples", "16", "--seed", "3")
    assert a.returncode == 0 and a.stdout.splitlines()[1:] == b.stdout.splitlines()[1:]
    c = mhalearn("run", "--teachers", "2", "--samples", "16", "--precision", "float64")
    assert c.returncode == 0 and "float64" in c.stdout


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["run", "--heads", "0"], "heads must be an integer >= 1, received 0"),
        (["run", "--teachers", "0"], "teachers must be an integer >= 1"),
        (["run", "--delta", "0.9"], "delta must lie in"),
        (["run", "--family", "two_tokens"], "needs tokens == 2"),
    ],
)
def test_invalid_config_is_one_line_and_exit_2(args, fragment):
    out = mhalearn(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhalearn: error: ")
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_bad_argument_exits_2():
    out = mhalearn("run", "--heads", "many")
    assert out.returncode == 2 and "Traceback" not in out.stderr
