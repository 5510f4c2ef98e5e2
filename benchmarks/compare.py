"""mhalearn's engine against the straightforward implementations, side by side in one process.

    python benchmarks/compare.py                 # four shapes, every implementation
    python benchmarks/compare.py --small         # the first two shapes, fewer steps
    python benchmarks/compare.py --shapes 3      # some of the shapes (indices)
    python benchmarks/compare.py --memory        # also: peak memory at 256 and 4096 instances
    python benchmarks/compare.py --compilation-cache /tmp/jaxcache   # persistent XLA cache
    python benchmarks/compare.py --width 1       # one instance per call (CPU: see batch/devices.py)

The workload: B students fitted by full-batch GD (float32, fixed step size) to B random
Chen–Li teachers, at the standard shape (heads 4, dim 16, tokens 8, samples 512, B 256) and at
(2, 8, 4, 256, B 64), (4, 64, 16, 256, B 16) and the phase diagrams' cells (2, 8, 4, 32,
B 1024). Implementations:

- ``mhalearn``: ``mh.simulate`` with ``GDConfig(optimizer="gd")`` — its timed run also draws
  every teacher and data set and scores every fit, so it does more than the others. The CPU
  is split into ``--cpu-devices`` devices (``mh.split_cpu``; default one per core) and the
  engine runs one instance program per device, plus a reference row on one device
  (``engine_devices`` 1). Every implementation runs on the same cores; the split leaves the
  others' speed unchanged (``--impls jax_naive`` with ``--cpu-devices 1`` and then ``2``
  measured 379 and 367 instance-steps/s, one run each);
- ``mhalearn_fit``: the engine's fit alone, ``mh.map_instances`` of ``GDConfig.fit`` on the
  same devices over teachers and data drawn beforehand: the same work as the baselines do;
- ``jax_naive``: ``jit(vmap(scan(step)))`` of an einsum formulation of the loss, ``jax.grad``;
- ``torch_loop``: PyTorch, one instance after another, autograd and an in-place update;
- ``torch_vmap``: ``torch.func.vmap(torch.func.grad(loss))`` over the instances, per step;
- ``ceiling``: the device's measured float32 matrix-multiply rate (jax; 2048² on CPU, 8192²
  on an accelerator), in the same run.

PyTorch is optional (``pip install -e ".[bench]"``); its rows are skipped with a message when it
is absent. Prints instance-steps/s, GFLOP/s (3× forward FLOPs per step), the ratio of mhalearn
(end to end, and the fit alone) to every baseline and the percentage of the ceiling in the
precision each implementation's products run in (``precision``: "highest" is true float32,
"default" is JAX's default, TensorFloat-32 on NVIDIA GPUs); compilation is timed apart (steady state
excludes it). Every implementation runs three times (mhalearn's later calls reuse its
compiled program, as a study's next cells do) and its steady state is the fastest run: the
first run of a compiled program pays one-time costs, a large share of mhalearn's 0.07 s run
at (2, 8, 4, 256, B 64), and runs that short vary by a tenth from one to the next on two
devices. Rows go to benchmarks/results/compare.csv (columns impl, heads, dim, tokens,
samples, instances, inst_steps_per_s, gflops, pct_of_ceiling, then context).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    LR,
    STANDARD,
    append_rows,
    ceiling_gflops,
    engine_fit_seconds,
    fused_setting,
    gd_workload,
    layer_flops_per_step,
    machine,
    table,
)

import mhalearn as mh
from mhalearn.batch import MATMUL_PRECISION

SHAPES = [
    dict(STANDARD, instances=256),
    dict(heads=2, dim=8, tokens=4, samples=256, instances=64),
    dict(heads=4, dim=64, tokens=16, samples=256, instances=16),
    dict(heads=2, dim=8, tokens=4, samples=32, instances=1024),  # the phase diagrams' cells
]


#: runs of every implementation; the fastest is its steady state
RUNS = 3


def problems(shape: dict) -> tuple[np.ndarray, ...]:
    """X, Y (B, samples, tokens, dim) and the students' start θ₀, W₀ (B, heads, dim, dim)."""
    B, m, d, T, N = (shape[k] for k in ("instances", "heads", "dim", "tokens", "samples"))
    spec = mh.TeacherSpec(heads=m, dim=d, tokens=T)
    keys = jax.random.split(jax.random.key(0), B)
    teachers = jax.vmap(lambda k: mh.sample_teacher(k, spec))(keys)
    X = mh.boolean_tokens(jax.random.key(1), (B, N, T, d))
    Y = jax.vmap(jax.vmap(mh.mha, in_axes=(0, None, None)))(X, teachers.theta, teachers.W)
    theta0 = jax.random.normal(jax.random.key(2), (B, m, d, d)) / d
    W0 = jax.random.normal(jax.random.key(3), (B, m, d, d)) / np.sqrt(d)
    return tuple(np.asarray(a, np.float32) for a in (X, Y, theta0, W0))


def run_mhalearn(
    shape: dict,
    steps: int,
    data,
    devices: int | None = None,
    options: dict | None = None,
    width: int | None = None,
):
    task, learner = gd_workload(**{k: shape[k] for k in STANDARD}, steps=steps)
    res = mh.simulate(
        jax.random.key(0),
        task,
        learner,
        shape["instances"],
        devices=devices,
        options=options,
        vector_width=width,
    )
    return res.attrs["compile_seconds"], res.attrs["run_seconds"]


def run_mhalearn_fit(shape: dict, steps: int, data, devices: int | None = None):
    """The engine's fit alone (:func:`_common.engine_fit_seconds`): the same work as the
    baselines do."""
    task, learner = gd_workload(**{k: shape[k] for k in STANDARD}, steps=steps)
    return engine_fit_seconds(task, learner, shape["instances"], devices=devices)


def naive_loss(params, X, Y):
    theta, W = params
    scores = jnp.einsum("ntd,hde,nse->nhts", X, theta, X)
    A = jax.nn.softmax(scores, axis=-1)
    F = jnp.einsum("nhts,nsd,hde->nte", A, X, W)
    return jnp.mean(jnp.sum((F - Y) ** 2, axis=(1, 2)))


def run_jax_naive(shape: dict, steps: int, data):
    X, Y, theta0, W0 = data

    def fit(theta, W, X, Y):
        def step(p, _):
            g = jax.grad(naive_loss)(p, X, Y)
            return jax.tree.map(lambda a, b: a - LR * b, p, g), None

        return jax.lax.scan(step, (theta, W), None, steps)[0]

    tic = time.perf_counter()
    compiled = jax.jit(jax.vmap(fit)).lower(theta0, W0, X, Y).compile()
    compile_s = time.perf_counter() - tic
    tic = time.perf_counter()
    jax.block_until_ready(compiled(theta0, W0, X, Y))
    return compile_s, time.perf_counter() - tic


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    return torch


def torch_loss(theta, W, X, Y):
    import torch

    scores = torch.einsum("ntd,hde,nse->nhts", X, theta, X)
    A = torch.softmax(scores, dim=-1)
    F = torch.einsum("nhts,nsd,hde->nte", A, X, W)
    return torch.mean(torch.sum((F - Y) ** 2, dim=(1, 2)))


def run_torch_loop(shape: dict, steps: int, data):
    torch = _torch()
    X, Y, theta0, W0 = (torch.from_numpy(np.array(a)) for a in data)
    tic = time.perf_counter()
    for b in range(shape["instances"]):
        theta = theta0[b].clone().requires_grad_(True)
        W = W0[b].clone().requires_grad_(True)
        for _ in range(steps):
            loss = torch_loss(theta, W, X[b], Y[b])
            g_theta, g_W = torch.autograd.grad(loss, (theta, W))
            with torch.no_grad():
                theta -= LR * g_theta
                W -= LR * g_W
    return 0.0, time.perf_counter() - tic


def run_torch_vmap(shape: dict, steps: int, data):
    torch = _torch()
    from torch.func import grad, vmap

    X, Y, theta, W = (torch.from_numpy(np.array(a)) for a in data)
    grads = vmap(grad(torch_loss, argnums=(0, 1)))
    tic = time.perf_counter()
    for _ in range(steps):
        g_theta, g_W = grads(theta, W, X, Y)
        theta, W = theta - LR * g_theta, W - LR * g_W
    return 0.0, time.perf_counter() - tic


IMPLS = {
    "mhalearn": run_mhalearn,
    "mhalearn_fit": run_mhalearn_fit,
    "jax_naive": run_jax_naive,
    "torch_loop": run_torch_loop,
    "torch_vmap": run_torch_vmap,
}
#: the precision each implementation's float32 products run in: the engine's programs at
#: MATMUL_PRECISION ("highest": true float32), jax_naive at JAX's default (TensorFloat-32 on
#: NVIDIA GPUs since Ampere), PyTorch's float32 products in float32 (allow_tf32 is off by
#: default); each row's share of the ceiling is of the ceiling in that precision
PRECISION = {
    "mhalearn": MATMUL_PRECISION,
    "mhalearn_fit": MATMUL_PRECISION,
    "jax_naive": "default",
    "torch_loop": "highest",
    "torch_vmap": "highest",
}


def memory_rows() -> list[dict]:
    """Peak RSS of the engine at 256 and 4096 instances (chunks of 256), each in a fresh
    subprocess (benchmarks/throughput.py --one, one device)."""
    from throughput import spawn

    shape = {k: v for k, v in SHAPES[0].items() if k != "instances"}
    return [spawn(**shape, instances=n, steps=5, chunk_size=256) for n in (256, 4096)]


def summary(rows: list[dict], shapes: list[dict], devices: int) -> None:
    print(
        "\nmhalearn vs each baseline (ratio of instance-steps/s): end to end (mhalearn: draw, "
        f"fit and score) and the fit alone (mhalearn_fit), each on {devices} device(s)"
    )
    for shape in shapes:
        same = {  # the engine on every device; its 1-device row is for reference
            r["impl"]: r
            for r in rows
            if all(r[k] == v for k, v in shape.items())
            and not (r["impl"] == "mhalearn" and r["engine_devices"] != devices)
        }
        for ours in ("mhalearn", "mhalearn_fit"):
            if ours not in same:
                continue
            rate = same[ours]["inst_steps_per_s"]
            ratios = ", ".join(
                f"{impl} {rate / r['inst_steps_per_s']:.2f}×"
                for impl, r in same.items()
                if impl not in ("mhalearn", "mhalearn_fit", "ceiling")
            )
            print(
                f"  {ours:>12} {shape}: {ratios}; "
                f"{same[ours]['pct_of_ceiling']:.0f}% of the {same[ours]['precision']} ceiling"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--small", action="store_true", help="the first two shapes, 10 steps")
    p.add_argument("--shapes", type=int, nargs="*", default=None, help="shape indices (0–3)")
    p.add_argument("--steps", type=int, default=None, help="GD steps (default 30; 10 small)")
    p.add_argument("--memory", action="store_true", help="also peak memory at 256 vs 4096")
    p.add_argument("--compilation-cache", default=None, help="persistent XLA cache folder")
    p.add_argument("--impls", nargs="*", default=list(IMPLS), choices=list(IMPLS))
    p.add_argument(
        "--xla-defaults",
        action="store_true",
        help="compile the engine with XLA's default options (to measure what they bring)",
    )
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help="the engine's vector width (default: its own; on CPU a group is a loop, its "
        "width changes no result, only the number of calls)",
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=os.cpu_count() or 1,
        help="split the CPU into this many devices (default: one per core)",
    )
    args = p.parse_args()
    cpu_devices = mh.split_cpu(args.cpu_devices)  # before JAX touches a device
    if args.compilation_cache:
        mh.enable_compilation_cache(args.compilation_cache)
    steps = args.steps or (10 if args.small else 30)
    shapes = SHAPES[:2] if args.small else SHAPES
    if args.shapes is not None:
        shapes = [SHAPES[i] for i in args.shapes]
    have_torch = _torch() is not None
    if not have_torch:
        print("PyTorch not installed: torch rows skipped (pip install -e '.[bench]')")
    devices = len(jax.devices())
    platform = jax.devices()[0].platform
    ceiling = ceiling_gflops()
    # on a CPU JAX's default precision is float32 too: one ceiling
    ceilings = {
        "highest": ceiling,
        "default": ceiling_gflops(precision="default") if platform == "gpu" else ceiling,
    }
    print(
        f"ceiling: {ceiling:.0f} GFLOP/s (float32 matmul at precision 'highest', "
        f"{2048 if platform == 'cpu' else 8192}², jax {jax.__version__})"
        + (
            f"; at JAX's default precision (TensorFloat-32): {ceilings['default']:.0f} GFLOP/s"
            if platform == "gpu"
            else ""
        )
    )
    print(f"devices: {devices} × {jax.devices()[0].device_kind} (CPU split {cpu_devices})")
    options = {} if args.xla_defaults else None  # {}: XLA's defaults; None: the engine's
    engine = functools.partial(run_mhalearn, options=options, width=args.width)
    ours = {"mhalearn": engine, "mhalearn_fit": run_mhalearn_fit}
    runs = [
        (impl, ours.get(impl, IMPLS[impl]), devices if impl in ours else 1)
        for impl in args.impls
        if have_torch or not impl.startswith("torch")
    ]
    if "mhalearn" in args.impls and devices > 1:
        runs.insert(1, ("mhalearn", functools.partial(engine, devices=1), 1))
    rows = []
    for shape in shapes:
        data = problems(shape)
        flops = layer_flops_per_step(*(shape[k] for k in ("heads", "dim", "tokens", "samples")))
        for impl, fn, used in runs:
            timed = [fn(shape, steps, data) for _ in range(RUNS)]
            compile_s, run_s = timed[0][0], min(run for _, run in timed)
            rate = shape["instances"] * steps / run_s
            gflops = rate * flops / 1e9
            rows.append(
                {
                    "impl": impl,
                    **shape,
                    "inst_steps_per_s": rate,
                    "gflops": gflops,
                    "precision": PRECISION[impl],
                    "pct_of_ceiling": 100 * gflops / ceilings[PRECISION[impl]],
                    "engine_devices": used,
                    "steps": steps,
                    "compile_s": compile_s,
                    "run_s": run_s,
                }
            )
            print(
                f"{impl:>10} ({used} device) {shape}: {rate:.0f} inst-steps/s, "
                f"{gflops:.1f} GFLOP/s, compile {compile_s:.1f}s",
                flush=True,
            )
        rows.append(
            {
                "impl": "ceiling",
                **shape,
                "inst_steps_per_s": ceiling * 1e9 / flops,
                "gflops": ceiling,
                "precision": "highest",
                "pct_of_ceiling": 100.0,
                "engine_devices": 1,
                "steps": steps,
                "compile_s": 0.0,
                "run_s": 0.0,
            }
        )
    print()
    cols = ["impl", "engine_devices", "heads", "dim", "tokens", "samples", "instances",
            "inst_steps_per_s", "gflops", "precision", "pct_of_ceiling", "compile_s"]  # fmt: skip
    print(table(rows, cols))
    summary(rows, shapes, devices)
    context = {
        **machine(),
        "fused_on_gpu": fused_setting(),
        "jax": jax.__version__,
        "device_kind": jax.devices()[0].device_kind,
        "engine_options": "xla defaults" if args.xla_defaults else "engine defaults",
        "vector_width": args.width or "default",
    }
    path = append_rows("compare", [{**r, **context} for r in rows])
    print(f"\nrows appended to {path}")
    if args.memory:
        mem = memory_rows()
        for r in mem:
            print(f"instances {r['instances']}: peak RSS {r['peak_rss_mb']:.0f} MB")
        ratio = mem[1]["peak_rss_mb"] / mem[0]["peak_rss_mb"]
        per = (mem[1]["peak_rss_mb"] - mem[0]["peak_rss_mb"]) * 2**20 / (4096 - 256)
        kept = mem[1]["result_bytes_per_instance"]
        print(f"peak memory 4096 / 256 instances: {ratio:.2f}× (target ≤ 1.5×); "
              f"peak growth {per:.0f} bytes per extra instance (≤ 0: none beyond noise); "
              f"results kept {kept:.0f} bytes per instance")  # fmt: skip


if __name__ == "__main__":
    main()
