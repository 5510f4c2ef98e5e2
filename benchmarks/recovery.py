"""Recovery of random Chen–Li teachers by every learner, on the same teachers and samples.

    python benchmarks/recovery.py            # the default grid (float64)
    python benchmarks/recovery.py --small    # a quick look
    python benchmarks/recovery.py --full     # the full product grid (hours on 2 cores)

The default grid is a star around the base cell (heads 2, dim 8, tokens 4, β 4, samples 1000):
each axis takes its values — heads {1, 2, 3}, dim {4, 8, 16}, tokens {2, 4, 8}, β {2, 4, 8},
samples {250, 1000, 4000} — with the others at the base, plus the hard families
(near-duplicate heads, cancelling W's) at the base; the two-token family is the random draw
at k = 2, which the tokens axis already runs. Every learner sees the same
teachers and samples in a cell (the same root key). Prints success rate (every matched Θ_i and
W_i within relative error 1e-3), median parameter error (max over heads of the Θ and W
errors), median normalised prediction error and wall time (compilation included); appends rows
to benchmarks/results/recovery.csv.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import jax
import numpy as np

import mhalearn as mh
from mhalearn.learners import make_learner

mh.set_precision("float64")  # variable projection and the pipeline need it

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table  # noqa: E402

BASE = dict(heads=2, dim=8, tokens=4, beta=4.0, samples=1000)
AXES = dict(
    heads=[1, 2, 3],
    dim=[4, 8, 16],
    tokens=[2, 4, 8],
    beta=[2.0, 4.0, 8.0],
    samples=[250, 1000, 4000],
)
# (the two-token family is the random draw at k = 2: the star's tokens = 2 cell runs it)
HARD = [("near_duplicate", {}), ("ill_conditioned", {})]


def learners(small: bool) -> dict:
    """The recovery study's learners (GD and Adam: 500 steps with --small, else 1000)."""
    names = ("gd", "adam", "varpro", "chen_li", "uniform", "alternating", "oracle")
    return {name: make_learner(name, 500 if small else 1000) for name in names}


def cells(full: bool, small: bool) -> list[dict]:
    if small:
        return [dict(BASE, family="random"), dict(BASE, heads=1, family="random")]
    if full:
        return [
            dict(zip(AXES, v, strict=True), family="random")
            for v in itertools.product(*AXES.values())
        ]
    out = [dict(BASE, family="random")]
    for axis, values in AXES.items():
        out += [dict(BASE, **{axis: v}, family="random") for v in values if v != BASE[axis]]
    out += [dict(BASE, **extra, family=family) for family, extra in HARD]
    return out


def run_cell(cell: dict, learner_name: str, learner, teachers: int) -> dict:
    spec = mh.TeacherSpec(
        heads=cell["heads"],
        dim=cell["dim"],
        tokens=cell["tokens"],
        beta=cell["beta"],
        family=cell["family"],
    )
    task = mh.RegressionTask(teacher=spec, samples=cell["samples"], test_samples=256)
    tic = time.perf_counter()
    res = mh.simulate(jax.random.key(2026), task, learner, teachers)
    wall = time.perf_counter() - tic
    m = res.metrics
    param = np.maximum(m["theta_error_max"], m["w_error_max"])
    return {
        "learner": learner_name,
        **cell,
        "teachers": teachers,
        "success_rate": float(np.mean(m["success"])),
        "median_param_error": float(np.median(param)),
        "median_prediction_error": float(np.median(m["prediction_error"])),
        "wall_s": wall,
        "compile_s": res.attrs["compile_seconds"],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--small", action="store_true", help="two cells, 8 teachers, shorter runs")
    p.add_argument("--full", action="store_true", help="the full product grid (243 cells)")
    p.add_argument(
        "--teachers", type=int, default=None, help="teachers per cell (default 32; 8 with --small)"
    )
    p.add_argument("--learners", nargs="*", default=None, help="a subset of the learners")
    args = p.parse_args()
    teachers = args.teachers or (8 if args.small else 32)
    chosen = learners(args.small)
    if args.learners:
        chosen = {k: chosen[k] for k in args.learners}
    rows = []
    start = time.perf_counter()
    for cell in cells(args.full, args.small):
        for name, learner in chosen.items():
            row = run_cell(cell, name, learner, teachers)
            rows.append(row)
            elapsed = time.perf_counter() - start
            rate = row["success_rate"]
            print(f"[{elapsed:7.1f}s] {name:12s} {cell} success {rate:.2f}", flush=True)
    cols = [
        "learner",
        "family",
        "heads",
        "dim",
        "tokens",
        "beta",
        "samples",
        "success_rate",
        "median_param_error",
        "median_prediction_error",
        "wall_s",
    ]
    print()
    print(table(rows, cols))
    info = machine()
    path = append_rows(
        "recovery",
        [
            {**info, "grid": "small" if args.small else "full" if args.full else "default", **r}
            for r in rows
        ],
    )
    total = time.perf_counter() - start
    print(f"\ntotal {total:.0f}s on {info['cpu']}, {info['cores']} cores; rows appended to {path}")


if __name__ == "__main__":
    main()
