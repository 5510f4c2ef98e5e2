"""Classifier training sweeps over heads and step sizes, and the cost of the theory quantities.

    python benchmarks/heads.py                        # 8 heads × 8 step sizes × 16 seeds
    python benchmarks/heads.py --small --steps 10000  # 4 × 3 × 4 cells of 10⁴ steps

Part 1: one compiled sweep of full-batch GD on the tokenized mixture (tokens 4, dim 8, 128
samples, up to 8 heads): by default heads 1..8 × 8 step sizes in [0.1, 10] × 16 seeds = 1024
cells of 1000 steps; with --small heads {1, 2, 4, 8} × {0.3, 1, 3} × 4 seeds. Prints the time
per (seed × heads × step size) cell and the median final training loss per head count and
step size (time per cell grows linearly with --steps).
Part 2: steady-state time (compilation apart) of each theory quantity at random initialisation
versus samples and heads. Rows go to benchmarks/results/heads_sweep.csv and heads_theory.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table

import mhalearn as mh
from mhalearn.experiments import Heads
from mhalearn.metrics import theory

STUDY = Heads()  # the heads study's mixture, samples and model, at its first noise level
MIXTURE = STUDY.mixture(STUDY.noise[0])


def sweep(steps: int, small: bool) -> tuple[list[dict], dict]:
    heads = np.array([1, 2, 4, 8]) if small else np.arange(1, 9)
    lrs = np.array([0.3, 1.0, 3.0]) if small else np.geomspace(0.1, 10.0, 8)
    seeds = 4 if small else 16
    grid = np.array(np.meshgrid(heads, lrs, np.arange(seeds), indexing="ij")).reshape(3, -1)
    task = STUDY.task(STUDY.samples, 8, STUDY.noise[0], active_heads=grid[0].astype(int))
    learner = mh.GDConfig(optimizer="gd", steps=steps, lr=grid[1], snapshots=20)
    res = mh.simulate(jax.random.key(0), task, learner, grid.shape[1], key_ids=grid[2].astype(int))
    cells = grid.shape[1]
    summary = {
        "cells": cells,
        "steps": steps,
        "compile_s": res.attrs["compile_seconds"],
        "run_s": res.attrs["run_seconds"],
        "s_per_cell": res.attrs["run_seconds"] / cells,
        "cell_steps_per_s": cells * steps / res.attrs["run_seconds"],
    }
    rows = []
    for h in heads:
        for lr in lrs:
            pick = (grid[0] == h) & (grid[1] == lr)
            rows.append(
                {
                    "heads": int(h),
                    "lr": float(lr),
                    "final_train_loss": float(np.median(res.trace["loss"][pick, -1])),
                    "test_error": float(np.median(res.metrics["test_error"][pick])),
                    "diverged": int(res.status["diverged"][pick].sum()),
                }
            )
    return rows, summary


def timed(fn, *args, repeats: int = 3) -> tuple[float, float]:
    compiled = jax.jit(fn)
    tic = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - tic
    tic = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(compiled(*args))
    return first, (time.perf_counter() - tic) / repeats


def quantities(data: mh.Mixture, problem: mh.ClassificationProblem) -> dict:
    spec, key = problem.spec, jax.random.key(3)

    def gram(p):
        return theory.ntk_gram(theory.ntk_features(p, data.X, spec)["all"])

    return {
        "ntk_gram": gram,
        "ntk_margin": lambda p: theory.svm_margin(gram(p), data.y, 2000).margin,
        "hessian_norm": lambda p: theory.hessian_spectral_norm(problem.loss, p, key),
        "weak_convexity": lambda p: theory.weak_convexity_ratio(problem.loss, p, key),
        "relevant_attention": lambda p: theory.relevant_attention(p, data.X, data.relevant, spec),
    }


def theory_costs(samples_grid, heads_grid) -> list[dict]:
    rows = []
    for n in samples_grid:
        data = mh.tokenized_mixture(jax.random.key(1), MIXTURE, n)
        for h in heads_grid:
            problem = mh.ClassificationProblem(
                X=data.X,
                y=data.y,
                spec=mh.ClassifierSpec(),
                heads=h,
                start=mh.ClassifierStart(w_init=1.0),
            )
            params = problem.init(jax.random.key(2))
            for name, fn in quantities(data, problem).items():
                first, steady = timed(fn, params)
                rows.append(
                    {
                        "quantity": name,
                        "samples": n,
                        "heads": h,
                        "compile_s": first - steady,
                        "steady_s": steady,
                    }
                )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--small", action="store_true")
    p.add_argument(
        "--steps", type=int, default=None, help="GD steps per cell (default 10⁴; 10³ small)"
    )
    args = p.parse_args()
    mh.set_precision("float32")
    steps = args.steps or 1000
    rows, summary = sweep(steps, args.small)
    print(
        f"sweep: {summary['cells']} cells (heads × step size × seed), {steps} full-batch GD steps, "
        f"one compilation ({summary['compile_s']:.1f}s)"
    )
    print(
        f"  {summary['run_s']:.1f}s in all, {summary['s_per_cell']:.3f}s per cell, "
        f"{summary['cell_steps_per_s']:.0f} cell-steps/s"
    )
    print(table(rows, ["heads", "lr", "final_train_loss", "test_error", "diverged"]))
    costs = theory_costs(
        [64, 256] if args.small else [64, 256, 1024], [2, 8] if args.small else [2, 8, 32]
    )
    print("\ntheory quantities at random initialisation (steady state, compilation apart):")
    print(table(costs, ["quantity", "samples", "heads", "steady_s", "compile_s"]))
    info = machine()
    first = append_rows("heads_sweep", [{**info, **summary, **r} for r in rows])
    second = append_rows("heads_theory", [{**info, **r} for r in costs])
    print(f"\n{info['cpu']}, {info['cores']} cores; rows appended to {first} and {second}")


if __name__ == "__main__":
    main()
