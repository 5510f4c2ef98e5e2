"""Where an instance's time goes: drawing it, fitting it, scoring it, each stage apart.

    python benchmarks/stages.py                  # standard shape, 1024 instances (CPU: 64)
    python benchmarks/stages.py --instances 4096 --steps 20

``mh.simulate`` runs, per instance, the task's draw (the teacher, with its rejection loop and
its checks, and the data), the learner's fit and the task's scores in one program; this script
runs each stage as its own program, ``jit(vmap(stage))`` over the instances on the default
device, and times it after compiling it (best of ``--repeats``), so that a stage whose cost
does not belong where it runs (a per-instance linear-algebra call an accelerator runs one
instance at a time, say) shows. The workload is benchmarks/compare.py's: full-batch GD in
float32 on a random Chen–Li teacher. Prints milliseconds per stage and per instance, and the
FLOPs and bytes of one GD step per instance from XLA's cost analysis of the compiled step
(``mhalearn.learners.step_cost``; their ratio says whether the step is bound by memory or by
compute on a device), and appends rows to benchmarks/results/stages.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

from mhalearn.learners import step_cost
from mhalearn.metrics.recovery import parameter_errors
from mhalearn.simulate import instance_keys
from mhalearn.teachers import sample_teacher_with_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STANDARD, append_rows, fused_setting, gd_workload, machine, table


def timed(fn, *args, repeats: int) -> tuple[float, float]:
    """(compile seconds, best run seconds) of ``jit(fn)(*args)``."""
    tic = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - tic
    jax.block_until_ready(compiled(*args))
    best = np.inf
    for _ in range(repeats):
        tic = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - tic)
    return compile_s, best


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--instances", type=int, default=None, help="default 1024 (CPU: 64)")
    p.add_argument("--steps", type=int, default=20, help="GD steps of the fit stage")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    device = jax.devices()[0]
    B = args.instances or (64 if device.platform == "cpu" else 1024)
    task, learner = gd_workload(**STANDARD, steps=args.steps)
    keys = jax.vmap(lambda i: instance_keys(jax.random.fold_in(jax.random.key(0), i)))(np.arange(B))
    truth, problem = jax.jit(jax.vmap(task.sample))(keys.problem)
    fit = jax.jit(jax.vmap(learner.fit))(keys.fit, problem)
    stages = {
        "sample_teacher": (
            jax.vmap(lambda k: sample_teacher_with_info(k, task.teacher)),
            (keys.problem,),
        ),
        "sample (teacher and data)": (jax.vmap(task.sample), (keys.problem,)),
        "checks": (jax.vmap(task.checks), (truth,)),
        f"fit ({args.steps} GD steps)": (jax.vmap(learner.fit), (keys.fit, problem)),
        "evaluate": (jax.vmap(task.evaluate), (keys.evaluate, truth, problem, fit)),
        "parameter_errors": (jax.vmap(parameter_errors), (fit.params, truth)),
    }
    rows = []
    for name, (fn, fn_args) in stages.items():
        compile_s, run_s = timed(fn, *fn_args, repeats=args.repeats)
        rows.append(
            {
                "stage": name,
                "instances": B,
                "compile_s": compile_s,
                "run_ms": 1e3 * run_s,
                "us_per_instance": 1e6 * run_s / B,
            }
        )
        print(f"{name}: {1e3 * run_s:.2f} ms (compile {compile_s:.1f} s)", flush=True)
    print(f"\n{device.device_kind}, {B} instances, shape {STANDARD}:")
    print(table(rows, ["stage", "instances", "compile_s", "run_ms", "us_per_instance"]))
    cost = step_cost(learner, keys.fit, problem)
    print(
        f"one GD step per instance (XLA's cost analysis of the compiled step): "
        f"{cost.flops / 1e6:.1f} MFLOP, {cost.bytes / 1e6:.1f} MB, {cost.intensity:.2f} FLOP/byte"
    )
    for r in rows:
        r.update(step_mflop=cost.flops / 1e6, step_mb=cost.bytes / 1e6)
    context = {
        **machine(),
        "fused_on_gpu": fused_setting(),
        **STANDARD,
        "steps": args.steps,
        "jax": jax.__version__,
    }
    context["device_kind"] = device.device_kind
    path = append_rows("stages", [{**r, **context} for r in rows])
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
