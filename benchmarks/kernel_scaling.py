"""Where the time of a tiny problem goes: the GD kernel alone, vs samples and vmap width.

    python benchmarks/kernel_scaling.py
    python benchmarks/kernel_scaling.py --products   # the kernel's three forms
    python benchmarks/kernel_scaling.py --products --pair   # ... with both cores busy
    python benchmarks/kernel_scaling.py --products --float64   # ... in float64

One CPU device, float32, heads 2, dim 8, tokens 4 (the recovery studies' shape): 300 steps of
full-batch GD in one ``fori_loop`` through the kernel GD runs (the problem's
``loss_and_grad`` once :func:`mhalearn.prepared`: at this shape the training set laid out as
lanes, ``mhalearn.layer.lanes_loss_and_grad``), compiled with the engine's options. Prints µs
per step at 32 … 1024 samples (a fixed per-call cost would show as an intercept; a
compute-bound kernel is linear in the samples) and µs per instance-step for groups of 1 … 16
instances vmapped at 256 samples (whether carrying instances together pays). ``--products``
instead times the kernel's forms — the samples-major kernel with either form of its
per-sample products (``squared_loss_and_grad(products="batched")`` and ``"broadcast"``) and the
lanes kernel — at shapes on both sides of ``BROADCAST_MAX`` and ``LANES_MAX``, and the form GD
takes (``mhalearn.layer.lanes_form``). With ``--pair`` the comparison runs in two processes at
once, each held to one core, as the engine runs one program per core: the kernels then share
the caches and the memory bus, which changes which form wins where the arrays are large.
``--float64`` runs the comparison in float64 (where GD never takes lanes: ``lanes_form``).
Best of 5 runs; appends rows to benchmarks/results/kernel_scaling.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LR, append_rows, layer_flops_per_step, machine

import mhalearn as mh
from mhalearn.batch import compiler_options
from mhalearn.layer import broadcast_form, lanes_form, squared_loss_and_grad

HEADS, DIM, TOKENS, STEPS = 2, 8, 4, 300
#: --products: (heads, dim, tokens, samples) on both sides of BROADCAST_MAX and LANES_MAX
PRODUCT_SHAPES = [
    (2, 8, 4, 32),
    (2, 8, 4, 256),
    (1, 8, 4, 256),
    (4, 8, 4, 256),
    (2, 8, 8, 256),
    (2, 8, 4, 1000),
    (3, 8, 4, 2000),
    (4, 8, 4, 2000),
    (2, 8, 4, 10000),
    (1, 8, 16, 256),
    (2, 8, 16, 256),
    (1, 16, 8, 512),
    (2, 16, 4, 256),
    (2, 16, 8, 256),
    (4, 16, 8, 512),
    (8, 8, 8, 512),
    (2, 16, 8, 2000),
    (1, 8, 16, 2000),
    (2, 32, 8, 256),
    (2, 8, 32, 128),
]
FORMS = ("batched", "broadcast", "lanes")


def fit(theta, W, X, Y, products="gd"):
    """300 GD steps through the kernel ``products`` names: ``"gd"`` the one GD runs (the
    prepared problem's), ``"lanes"`` the lanes kernel, else ``squared_loss_and_grad``'s form.
    Each step's loss is summed, as GD uses it (its finiteness check, its trace): without it
    XLA would leave the loss out of the kernel."""
    if products in ("gd", "lanes"):
        problem = mh.RegressionProblem(X=X, Y=Y, heads=theta.shape[0])
        problem = mh.prepared(problem)
        if products == "lanes" and problem.lanes is None:
            problem = dataclasses.replace(problem, lanes=mh.lay_out(X, Y))

        def loss_and_grad(params):
            loss, g = problem.loss_and_grad(mh.LayerParams(theta=params[0], W=params[1]))
            return loss, (g.theta, g.W)
    else:

        def loss_and_grad(params):
            return squared_loss_and_grad(X, Y, *params, products=products)

    def step(_, carry):
        params, total = carry
        loss, grads = loss_and_grad(params)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), total + loss

    return jax.lax.fori_loop(0, STEPS, step, ((theta, W), jnp.zeros((), X.dtype)))


def _dtype() -> np.dtype:
    """float32, or float64 once ``--float64`` has set the precision."""
    return np.dtype(np.float64 if jax.config.jax_enable_x64 else np.float32)


def seconds_per_step(
    samples: int, width: int, shape=(HEADS, DIM, TOKENS), products: str = "gd"
) -> float:
    heads, dim, tokens = shape
    rng = np.random.default_rng(0)
    dtype = _dtype()
    X = rng.choice([-1.0, 1.0], (width, samples, tokens, dim)).astype(dtype)
    Y = rng.normal(size=(width, samples, tokens, dim)).astype(dtype)
    theta = (rng.normal(size=(width, heads, dim, dim)) / dim).astype(dtype)
    W = (rng.normal(size=(width, heads, dim, dim)) / np.sqrt(dim)).astype(dtype)
    args = (theta, W, X, Y)
    if width == 1:
        args = tuple(a[0] for a in args)
    one = functools.partial(fit, products=products)
    program = one if width == 1 else jax.vmap(one)
    compiled = jax.jit(program).lower(*args).compile(compiler_options(jax.devices()))
    jax.block_until_ready(compiled(*args))
    best = np.inf
    for _ in range(5):
        tic = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - tic)
    return best / STEPS


def compare_products(core: int | None = None) -> None:
    """The kernel's three forms, µs per GD step, and the form GD takes; on ``core`` alone
    when one is given (``--pair``)."""
    if core is not None:
        os.sched_setaffinity(0, {core})  # before JAX starts its threads: they inherit it
    rows = []
    where = "one CPU device" if core is None else f"core {core}, the other core busy alike"
    print(f"µs per GD step ({_dtype()}, {where}, {STEPS} steps, best of 5)")
    print("(heads, dim, tokens, samples) | batched | broadcast | lanes | lanes / best other | GD")
    for heads, dim, tokens, samples in PRODUCT_SHAPES:
        us = {
            form: 1e6 * seconds_per_step(samples, 1, (heads, dim, tokens), form) for form in FORMS
        }
        auto = "broadcast" if broadcast_form("auto", tokens, dim) else "batched"
        auto = "lanes" if lanes_form(samples, heads, tokens, dim, _dtype().itemsize) else auto
        ratio = us["lanes"] / min(us["batched"], us["broadcast"])
        print(
            f"({heads}, {dim}, {tokens}, {samples}) | {us['batched']:.1f} | "
            f"{us['broadcast']:.1f} | {us['lanes']:.1f} | {ratio:.2f} | {auto}"
        )
        shape = {"heads": heads, "dim": dim, "tokens": tokens, "samples": samples, "width": 1}
        rows += [{**shape, "products": form, "us_per_inst_step": us[form]} for form in us]
    context = {
        **machine(),
        "jax": jax.__version__,
        "busy_cores": 1 if core is None else 2,
        "dtype": str(_dtype()),
    }
    path = append_rows("kernel_scaling", [{**r, **context} for r in rows])
    print(f"rows appended to {path}")


def pair(float64: bool) -> None:
    """``--products`` in two processes at once, one on each of the first two cores."""
    cmd = [sys.executable, __file__, "--products", *(["--float64"] if float64 else []), "--core"]
    children = [subprocess.Popen([*cmd, str(c)], stdout=subprocess.PIPE, text=True) for c in (0, 1)]
    for child in children:
        out, _ = child.communicate()
        print(out, end="")
        if child.returncode:
            raise SystemExit(child.returncode)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--products", action="store_true", help="compare the kernel's forms")
    p.add_argument("--pair", action="store_true", help="with --products: both cores busy")
    p.add_argument("--float64", action="store_true", help="with --products: in float64")
    p.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.float64:
        if not args.products:
            p.error("--float64 goes with --products")
        mh.set_precision("float64")
    if args.products and args.pair:
        pair(args.float64)
        return
    if args.products:
        compare_products(args.core)
        return
    rows = []
    print(f"heads {HEADS}, dim {DIM}, tokens {TOKENS}, float32, one CPU device, {STEPS} steps")
    for samples in (32, 64, 128, 256, 512, 1024):
        s = seconds_per_step(samples, 1)
        gflops = layer_flops_per_step(HEADS, DIM, TOKENS, samples) / s / 1e9
        rows.append({"samples": samples, "width": 1, "us_per_inst_step": 1e6 * s,
                     "gflops": gflops})  # fmt: skip
        print(f"  samples {samples:5d}: {1e6 * s:7.1f} µs per step, {gflops:5.1f} GFLOP/s")
    slope, intercept = np.polyfit(
        [r["samples"] for r in rows], [r["us_per_inst_step"] for r in rows], 1
    )
    print(f"  fit: {slope:.3f} µs per sample + {intercept:.1f} µs per step")
    for width in (2, 4, 8, 16):
        s = seconds_per_step(256, width) / width
        gflops = layer_flops_per_step(HEADS, DIM, TOKENS, 256) / s / 1e9
        rows.append({"samples": 256, "width": width, "us_per_inst_step": 1e6 * s,
                     "gflops": gflops})  # fmt: skip
        print(f"  256 samples, {width:2d} vmapped: {1e6 * s:7.1f} µs per instance-step")
    context = {**machine(), "jax": jax.__version__, "heads": HEADS, "dim": DIM, "tokens": TOKENS}
    path = append_rows("kernel_scaling", [{**r, **context} for r in rows])
    print(f"rows appended to {path}")


if __name__ == "__main__":
    main()
