"""Throughput and memory of the engine on the Chen–Li regression workload (full-batch GD).

    python benchmarks/throughput.py            # the standard shape, then the instance sweep
    python benchmarks/throughput.py --small    # a quick look (fewer steps and instances)
    python benchmarks/throughput.py --large 16384   # also one large batch (accelerators)

Standard shape: heads 4, dim 16, tokens 8, samples 512, 256 instances. Each configuration runs
in a fresh subprocess so that its peak memory (max RSS) is its own; compilation is timed apart
from the steady-state run. The sweep over instances (64 .. 4096, chunk 256) shows time growing
linearly and peak memory staying flat. ``--large B`` adds a row of B instances in one chunk
(on an accelerator the engine fits its group width to the device memory). Every row carries
the device's float32 matrix-product rate, measured in the same process at the precision the
engine's products run in (``ceiling_gflops``, ``precision``), and the share of it reached: end
to end (``inst_steps_per_s``: simulate's run, drawing teachers and data, fitting and scoring)
and, for the standard and large rows, the fit alone (``fit_inst_steps_per_s``: the engine's
map over the same fits, the data drawn beforehand). Rows go to
benchmarks/results/throughput.csv.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    RESULTS,
    STANDARD,
    append_rows,
    ceiling_gflops,
    engine_fit_seconds,
    fused_setting,
    gd_workload,
    layer_flops_per_step,
    machine,
    peak_rss_mb,
    table,
)

SHAPE = STANDARD


def one(args) -> dict:
    """Run one configuration in this process and report it."""
    import jax

    import mhalearn as mh
    from mhalearn.batch import MATMUL_PRECISION

    shape = {k: getattr(args, k) for k in STANDARD}
    task, learner = gd_workload(**shape, steps=args.steps)
    res = mh.simulate(jax.random.key(0), task, learner, args.instances, chunk_size=args.chunk_size)
    peak = peak_rss_mb()  # the end-to-end run's (the fit-only run holds its data in memory)
    run = res.attrs["run_seconds"]
    rate = args.instances * args.steps / run
    flops = layer_flops_per_step(args.heads, args.dim, args.tokens, args.samples)
    # the engine's products run at MATMUL_PRECISION ("highest": true float32): its ceiling
    ceiling = ceiling_gflops(precision=MATMUL_PRECISION)
    fit = {}
    if args.fit_only:
        _, fit_run = engine_fit_seconds(task, learner, args.instances, chunk_size=args.chunk_size)
        fit_rate = args.instances * args.steps / fit_run
        fit = {
            "fit_run_s": fit_run,
            "fit_inst_steps_per_s": fit_rate,
            "fit_pct_of_ceiling": 100 * fit_rate * flops / 1e9 / ceiling,
        }
    return {
        **{
            k: getattr(args, k) for k in ("heads", "dim", "tokens", "samples", "instances", "steps")
        },
        "chunk_size": args.chunk_size or args.instances,
        "compile_s": res.attrs["compile_seconds"],
        "run_s": run,
        "inst_steps_per_s": rate,
        "gflops": rate * flops / 1e9,
        "ceiling_gflops": ceiling,
        # JAX's default precision: TensorFloat-32 products on NVIDIA GPUs; on CPU the same
        "ceiling_default_gflops": (
            ceiling if jax.devices()[0].platform == "cpu" else ceiling_gflops(precision="default")
        ),
        "pct_of_ceiling": 100 * rate * flops / 1e9 / ceiling,
        **fit,
        "precision": MATMUL_PRECISION,
        "vector_width": res.attrs["vector_width"],
        "peak_rss_mb": peak,
        "result_bytes_per_instance": sum(a.nbytes for a in res.arrays().values()) / args.instances,
        "device_kind": res.attrs["device_kind"],
        "jax": res.attrs["jax_version"],
        "diverged": int(res.status["diverged"].sum()),
    }


def spawn(**config) -> dict:
    cmd = [sys.executable, __file__, "--one"]
    for k, v in config.items():
        if v is True:  # a flag
            cmd.append(f"--{k.replace('_', '-')}")
        elif v is not None and v is not False:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fit-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--small", action="store_true", help="fewer steps and instances")
    p.add_argument("--heads", type=int, default=SHAPE["heads"])
    p.add_argument("--dim", type=int, default=SHAPE["dim"])
    p.add_argument("--tokens", type=int, default=SHAPE["tokens"])
    p.add_argument("--samples", type=int, default=SHAPE["samples"])
    p.add_argument("--instances", type=int, default=256)
    p.add_argument(
        "--steps", type=int, default=None, help="GD steps (default 100; 20 with --small)"
    )
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--large", type=int, default=None, help="also B instances in one chunk")
    p.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        default=None,
        help="instance counts for the memory sweep (default 64 256 1024 4096; none: no sweep)",
    )
    p.add_argument(
        "--sweep-steps", type=int, default=None, help="GD steps in the sweep (default 10)"
    )
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return

    steps = args.steps or (20 if args.small else 100)
    sweep = (
        args.sweep
        if args.sweep is not None
        else ([64, 256] if args.small else [64, 256, 1024, 4096])
    )
    sweep_steps = args.sweep_steps or (5 if args.small else 10)
    shape = {k: getattr(args, k) for k in SHAPE}
    info = {**machine(), "fused_on_gpu": fused_setting()}

    def run(kind: str, **config) -> dict:
        """One configuration in a fresh subprocess; its row appended at once (a run cut short
        keeps the rows it finished)."""
        row = spawn(**shape, **config)
        append_rows("throughput", [{**info, "kind": kind, **row}])
        return row

    rows = [
        run(
            "standard",
            instances=args.instances,
            steps=steps,
            chunk_size=args.chunk_size,
            fit_only=True,
        )
    ]
    if args.large:
        rows.append(
            run("large", instances=args.large, steps=steps, chunk_size=args.large, fit_only=True)
        )
    print("standard shape, full-batch GD:")
    cols = [
        "heads",
        "dim",
        "tokens",
        "samples",
        "instances",
        "steps",
        "compile_s",
        "run_s",
        "inst_steps_per_s",
        "gflops",
        "pct_of_ceiling",
        "fit_inst_steps_per_s",
        "fit_pct_of_ceiling",
        "vector_width",
        "peak_rss_mb",
    ]
    print(table(rows, cols), flush=True)
    sweep_rows = [
        run("sweep", instances=n, steps=sweep_steps, chunk_size=args.chunk_size) for n in sweep
    ]
    if sweep_rows:
        base = sweep_rows[0]
        for r in sweep_rows:
            r["time_per_instance_ms"] = 1e3 * r["run_s"] / r["instances"]
            r["rss_vs_smallest"] = r["peak_rss_mb"] / base["peak_rss_mb"]
        print(f"\nsweep over instances (chunk {args.chunk_size}, {sweep_steps} steps):")
        cols = ["instances", "run_s", "time_per_instance_ms", "inst_steps_per_s", "peak_rss_mb"]
        print(table(sweep_rows, [*cols, "rss_vs_smallest"]))
    print(f"\n{info['cpu']}, {info['cores']} cores; rows appended to {RESULTS / 'throughput.csv'}")


if __name__ == "__main__":
    main()
