"""The forms the engine takes on an accelerator that no GPU has timed, each timed both ways.

    python benchmarks/gpu_choices.py            # on a GPU, after gpu_check.sh (CPU: 69 s)
    python benchmarks/gpu_choices.py --small    # fewer instances (the tests' trial on a CPU)

Two forms are chosen for an accelerator (``mhalearn.platforms``) from the kernel launches of
programs compiled for a GPU without one (``benchmarks/gpu_programs.py``) and by reasoning, and
a third is taken on every platform though it was measured on a CPU only. Each is timed here
on the default device both ways, through ``mh.simulate`` on the same instances, in the steady
state (the run after compilation, the better of two calls; the programs kept are forgotten
before each setting, so each compiles its own):

- ``chunk_rows``: variable projection's Gauss–Newton sums in chunks of 512 (sample, token)
  rows, the CPU's, or 4096, an accelerator's (``reduced.CHUNK_ROWS``), at
  recovery_speed.py's first cell (dim 8, tokens 4, heads 2, 1000 samples), 256 teachers,
  float64;
- ``candidates``: the teachers' first draws one at a time, the CPU's, or 4 side by side, an
  accelerator's (``teachers.CANDIDATES``), and ``lanes``: GD's full-batch gradients with the
  training set laid out as lanes (``layer.LANES_MAX`` 128, as every platform takes it at this
  shape) or not (0), both with compare.py's GD workload at the phase cells' shape (heads 2,
  dim 8, tokens 4, 32 samples), 1024 instances, 50 steps, float32, the fused kernel as
  ``MHALEARN_BENCH_FUSED`` says (off by default; where it is on, it replaces both layouts).

Prints the seconds of each setting, which is faster and by how much, and appends each
choice's rows to ``benchmarks/results/gpu_choices.csv`` as it finishes. Where the faster
setting is not the one the engine takes on that platform, the constant named above is the
one to change. On a CPU the run is a trial of the script and the figures say nothing of an
accelerator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest.mock import patch

import jax

import mhalearn as mh
from mhalearn import layer, teachers
from mhalearn.learners import make_learner, reduced

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_rows, fused_setting, gd_workload, machine, table


def steady_seconds(task, learner, instances: int) -> tuple[float, int]:
    """(the better run seconds of two ``mh.simulate`` calls after compiling, the instances
    whose teacher was recovered), the programs kept from before forgotten first."""
    mh.batch.clear_programs()
    runs = [mh.simulate(jax.random.key(0), task, learner, instances) for _ in range(2)]
    return min(r.attrs["run_seconds"] for r in runs), int(runs[-1].metrics["success"].sum())


def timed_both_ways(name: str, settings: dict, workload, context: dict) -> list[dict]:
    """``workload()``'s steady seconds under each of ``settings`` (a value: a context that
    sets it), its rows appended as the second finishes (a run cut short keeps the choices
    it timed)."""
    rows = []
    for value, setting in settings.items():
        with setting:
            seconds, recovered = workload()
        rows.append(dict(choice=name, setting=value, seconds=seconds, recovered=recovered))
        print(f"{name} {value}: {seconds:.3f} s")
    fast, slow = sorted(rows, key=lambda r: r["seconds"])
    print(f"{name}: {fast['setting']} faster, {slow['seconds'] / fast['seconds']:.2f}×")
    append_rows("gpu_choices", [dict(r, **context) for r in rows])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--small", action="store_true", help="16 teachers, 64 GD instances")
    args = p.parse_args()
    device = jax.devices()[0]
    platform = device.platform
    teachers_n, gd_n = (16, 64) if args.small else (256, 1024)
    context = {**machine(), "device_kind": device.device_kind, "jax": jax.__version__}
    context["fused_on_gpu"] = fused_setting()

    mh.set_precision("float32")
    task, learner = gd_workload(heads=2, dim=8, tokens=4, samples=32, steps=50)

    def gd():
        return steady_seconds(task, learner, gd_n)

    candidates = {n: patch.dict(teachers.CANDIDATES, {platform: n}) for n in (1, 4)}
    rows = timed_both_ways("candidates", candidates, gd, context)
    lanes = {n: patch.object(layer, "LANES_MAX", n) for n in (128, 0)}
    rows += timed_both_ways("lanes", lanes, gd, context)

    mh.set_precision("float64")  # variable projection needs it
    spec = mh.TeacherSpec(heads=2, dim=8, tokens=4, beta=4.0)  # recovery_speed.py's first cell
    vp_task = mh.RegressionTask(teacher=spec, samples=1000, test_samples=256, success_tol=1e-3)
    vp = make_learner("varpro", 0)
    chunks = {n: patch.dict(reduced.CHUNK_ROWS, {platform: n}) for n in (512, 4096)}
    rows += timed_both_ways(
        "chunk_rows", chunks, lambda: steady_seconds(vp_task, vp, teachers_n), context
    )
    print(f"\n{device.device_kind}:")
    print(table(rows, ["choice", "setting", "seconds", "recovered"]))
    print(f"rows appended to {RESULTS / 'gpu_choices.csv'}")


if __name__ == "__main__":
    main()
