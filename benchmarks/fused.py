"""The fused Pallas loss-and-gradient kernel against the XLA kernels, on the default device.

    python benchmarks/fused.py                   # standard shape; GPU 4096 instances, CPU 8
    python benchmarks/fused.py --instances 16384 --warps 4 8

Times one full-batch loss-and-gradient of the Chen–Li layer per instance, ``jit(vmap(...))``
over the instances, float32, for: ``fused_pairs``, ``fused_blocks``, ``fused_pairs_recompute``
and ``fused_blocks_recompute`` (``mhalearn.fused.fused_loss_and_grad`` in each of its forms,
keeping every head's attention for the backward pass or forming it again: one Pallas kernel
per instance on Triton, tiles of ``--tile-rows`` rows on each of ``--warps`` warps; on a CPU
it runs in Pallas' interpret mode, which says nothing of its speed), ``xla``
(``mhalearn.layer.squared_loss_and_grad``, products at 'highest') and, where the shape
allows, ``lanes`` (the samples-minor layout the CPU takes). Prints microseconds per
instance-gradient, the rate against the float32 ceiling ('highest') measured in the same run,
and each kernel's largest relative difference from ``xla``; appends each row to
benchmarks/results/fused.csv as its kernel finishes (a fused variant that fails is recorded
with its error, the others still run, and the exit status is 1). Where a fused variant is
faster on a GPU at the standard shape, ``mhalearn.fused`` may name it (``FORM``,
``RECOMPUTE``, ``TILE_ROWS``, ``WARPS``) and turn on ``FUSED_ON_GPU`` (``gpu_targets.py``
prints the fastest).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STANDARD, append_rows, ceiling_gflops, layer_flops_per_step, machine, table

from mhalearn.fused import FORMS, TILE_ROWS, WARPS, fused_loss_and_grad
from mhalearn.layer import lanes_form, lanes_loss_and_grad, lay_out, squared_loss_and_grad


def best_seconds(fn, args, repeats: int) -> tuple[float, float, object]:
    """(compile seconds, best run seconds, its results) of ``jit(fn)(*args)``, products at
    'highest'."""
    tic = time.perf_counter()
    with jax.default_matmul_precision("highest"):
        compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - tic
    out = jax.block_until_ready(compiled(*args))
    best = np.inf
    for _ in range(repeats):
        tic = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - tic)
    return compile_s, best, out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--instances", type=int, default=None, help="default GPU 4096, CPU 8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tile-rows", type=int, default=TILE_ROWS, help="rows of a fused tile")
    p.add_argument(
        "--warps", type=int, nargs="+", default=[WARPS], help="of a fused program, each timed"
    )
    for k, v in STANDARD.items():
        p.add_argument(f"--{k}", type=int, default=v)
    args = p.parse_args()
    device = jax.devices()[0]
    B = args.instances or (8 if device.platform == "cpu" else 4096)
    m, d, T, n = args.heads, args.dim, args.tokens, args.samples
    k = jax.random.split(jax.random.key(0), 4)
    X = jax.random.normal(k[0], (B, n, T, d), jnp.float32)
    Y = jax.random.normal(k[1], (B, n, T, d), jnp.float32)
    theta = 4.0 * jax.random.normal(k[2], (B, m, d, d), jnp.float32) / d
    W = jax.random.normal(k[3], (B, m, d, d), jnp.float32) / np.sqrt(d)
    # the XLA kernel first (the reference of every other), then each row appended as its
    # kernel finishes, so that a run cut short by its time limit keeps what it measured
    kernels = {("xla", None): (jax.vmap(squared_loss_and_grad), (X, Y, theta, W))}
    if lanes_form(n, m, T, d, 4):
        lanes = (jax.vmap(lanes_loss_and_grad), (jax.vmap(lay_out)(X, Y), theta, W))
        kernels["lanes", None] = lanes
    for recompute, form, warps in itertools.product((True, False), FORMS, args.warps):
        fn = functools.partial(
            fused_loss_and_grad,
            form=form,
            recompute=recompute,
            tile_rows=args.tile_rows,
            warps=warps,
        )
        name = f"fused_{form}" + ("_recompute" if recompute else "")
        kernels[name, warps] = (jax.vmap(fn), (X, Y, theta, W))
    flops = layer_flops_per_step(m, d, T, n)
    ceiling = ceiling_gflops()
    context = {**machine(), "heads": m, "dim": d, "tokens": T, "samples": n}
    context.update(device_kind=device.device_kind, jax=jax.__version__)
    rows, want, failed = [], None, []
    for (name, warps), (fn, fn_args) in kernels.items():
        on = f" on {warps} warps" if warps else ""
        row = dict(kernel=name, tile_rows=args.tile_rows if warps else None, warps=warps)
        row.update(instances=B, interpret=name.startswith("fused") and device.platform == "cpu")
        try:
            compile_s, run_s, out = best_seconds(fn, fn_args, args.repeats)
        except Exception as e:  # a variant that fails is reported, and the others still run
            if want is None:
                raise  # the XLA kernel: nothing to compare against
            failed.append(f"{name}{on}")
            first = (str(e).strip().splitlines() or [""])[0]
            error = f"{type(e).__name__}: {first[:300]}"
            print(f"{name}{on} failed: {error}")
            rows.append({**row, "error": error})
            path = append_rows("fused", [{**rows[-1], **context}])
            continue
        want = want or jax.tree.leaves(out)
        pairs = zip(jax.tree.leaves(out), want, strict=True)
        row.update(
            compile_s=compile_s,
            us_per_instance=1e6 * run_s / B,
            gflops=B * flops / run_s / 1e9,
            pct_of_ceiling=100 * B * flops / run_s / 1e9 / ceiling,
            # the largest difference from the XLA kernel's results
            max_rel_diff=max(
                float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in pairs
            ),
        )
        rows.append(row)
        path = append_rows("fused", [{**rows[-1], **context}])
        print(f"{name}{on}: {1e6 * run_s / B:.1f} µs per instance (compile {compile_s:.1f} s)")
    print(f"\n{device.device_kind}, shape {dict(heads=m, dim=d, tokens=T, samples=n)}:")
    columns = ["kernel", "tile_rows", "warps", "instances", "compile_s", "us_per_instance"]
    columns.append("pct_of_ceiling")
    print(table([r for r in rows if "error" not in r], [*columns, "max_rel_diff"]))
    print(f"rows appended to {path}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
