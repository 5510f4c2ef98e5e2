"""The same instances on the accelerator and on the host CPU: how far apart the results are.

    python benchmarks/accelerator_agreement.py            # on a machine with a GPU or TPU
    python benchmarks/accelerator_agreement.py --small    # fewer instances and steps

Three workloads, each run twice through ``mh.simulate`` with the same root key (the same
teachers, data and starts): once on the default device (the accelerator: a vmapped group, its
width fitted to the memory) and once on the host CPU (a looped group):

- ``gd_float32``: full-batch GD in float32 at (heads 2, dim 8, tokens 4, samples 256), the
  accelerator's matrix products at JAX's default precision (on NVIDIA GPUs since Ampere:
  TensorFloat-32, about 10 bits of mantissa);
- ``gd_float32_highest``: the same under ``jax.default_matmul_precision("highest")``;
- ``varpro_float64``: variable projection in float64 at (dim 8, tokens 4, heads 2, β 4,
  samples 1000), recovery tolerance 1e-3 (benchmarks/recovery_speed.py's first cell).

Prints, per workload and metric, the largest absolute difference and the largest difference
relative to the metric's scale (its largest magnitude over the instances), the success counts
on each device, and appends rows to benchmarks/results/accelerator_agreement.csv. On a machine
without an accelerator both runs are on the CPU (a check of the script, not of a device).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import jax
import numpy as np

import mhalearn as mh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, fused_setting, gd_workload, machine, table


def workloads(small: bool):
    steps = 50 if small else 300
    gd = gd_workload(heads=2, dim=8, tokens=4, samples=256, steps=steps)
    spec = mh.TeacherSpec(heads=2, dim=8, tokens=4, beta=4.0)
    varpro = (
        mh.RegressionTask(teacher=spec, samples=1000, test_samples=256, success_tol=1e-3),
        mh.VarProConfig(iterations=20, restarts=2),
    )
    return {
        "gd_float32": ("float32", contextlib.nullcontext, gd),
        "gd_float32_highest": (
            "float32",
            lambda: jax.default_matmul_precision("highest"),
            gd,
        ),
        "varpro_float64": ("float64", contextlib.nullcontext, varpro),
    }


def compare(name: str, ours: mh.Results, host: mh.Results) -> list[dict]:
    rows = []
    a, b = ours.arrays(), host.arrays()
    for metric in sorted(a):
        if np.asarray(a[metric]).dtype == bool:
            continue
        x, y = np.asarray(a[metric], np.float64), np.asarray(b[metric], np.float64)
        finite = np.isfinite(x) & np.isfinite(y)
        if not finite.any():
            continue
        diff = np.abs(x - y)[finite]
        scale = max(np.max(np.abs(y[finite])), np.finfo(np.float64).tiny)
        rows.append(
            {
                "workload": name,
                "metric": metric,
                "max_abs_diff": float(diff.max()),
                "max_rel_to_scale": float(diff.max() / scale),
                "nonfinite_mismatch": int((np.isfinite(x) != np.isfinite(y)).sum()),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--small", action="store_true", help="16 instances, 50 GD steps")
    p.add_argument("--instances", type=int, default=None, help="default 64 (16 with --small)")
    args = p.parse_args()
    instances = args.instances or (16 if args.small else 64)
    default, host = jax.devices()[0], jax.devices("cpu")
    print(f"default device: {default.device_kind} ({default.platform}); host: {host[0]}")
    rows, summary = [], []
    for name, (precision, context, (task, learner)) in workloads(args.small).items():
        mh.set_precision(precision)
        runs = {}
        for where, devices in (("default", None), ("cpu", host)):
            with context():
                res = mh.simulate(jax.random.key(0), task, learner, instances, devices=devices)
            runs[where] = res
        metric_rows = compare(name, runs["default"], runs["cpu"])
        rows += metric_rows
        worst = max(metric_rows, key=lambda r: r["max_rel_to_scale"])
        summary.append(
            {
                "workload": name,
                "instances": instances,
                "success_default": int(runs["default"].metrics["success"].sum()),
                "success_cpu": int(runs["cpu"].metrics["success"].sum()),
                "width_default": runs["default"].attrs["vector_width"],
                "worst_metric": worst["metric"],
                "worst_rel": worst["max_rel_to_scale"],
                "run_s_default": runs["default"].attrs["run_seconds"],
                "run_s_cpu": runs["cpu"].attrs["run_seconds"],
            }
        )
    print(table(rows, ["workload", "metric", "max_abs_diff", "max_rel_to_scale"]))
    print()
    print(table(summary, list(summary[0])))
    context = {
        **machine(),
        "fused_on_gpu": fused_setting(),
        "jax": jax.__version__,
        "device_kind": default.device_kind,
    }
    path = append_rows("accelerator_agreement", [{**r, **context} for r in rows])
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
