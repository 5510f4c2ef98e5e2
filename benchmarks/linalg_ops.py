"""The small linear-algebra calls of drawing and scoring, as the package makes them and in
their other form.

Each call is vmapped over many instances on the default device:

    python benchmarks/linalg_ops.py                       # heads 4, dim 16, 4096 instances
    python benchmarks/linalg_ops.py --heads 2 --dim 8 --instances 1024

``benchmarks/stages.py`` found drawing and scoring an instance to cost about 2.9 ms on an
H200 on 2026-12-04 (4096 instances at heads 4, dim 16), against 0.12 ms for 20 GD steps.
Those stages call, per instance, the singular values of ΣW (dim × dim) and of the
normalised Θ rows (heads × dim²: :func:`mhalearn.teachers.parameter_diagnostics`, in every
draw of the teacher's rejection loop), and the QR factor and spectral norm of the span angle
(:func:`mhalearn.metrics.recovery.largest_principal_angle`, dim² × heads). jaxlib's cuSOLVER
kernels loop over a batch of such matrices, one library call each (the Jacobi SVD above 32
a side, every QR's Q), so :mod:`mhalearn.solvers` computes them on an accelerator from
batched pieces (a Householder QR in array operations, the SVD of its small R) and on CPU one
matrix after another with LAPACK. This script times each call as the package makes it
(form ``package``) beside its other form: on an accelerator jnp.linalg's own vmapped call
(``jnp.linalg``, what the package ran before), on CPU the accelerator form forced here
(``accelerator form``), each ``jit(vmap(op))``, best of ``--repeats``, compilation apart,
with the largest difference of the other form's result from the package's, relative to the
package's largest entry.
Rows go to benchmarks/results/linalg_ops.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import mhalearn as mh
from mhalearn import solvers
from mhalearn.metrics.recovery import largest_principal_angle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table


def ops(heads: int, dim: int, cpu: bool):
    """name: (the package's call, its other form on this platform, a function drawing one
    input). The span angle's other form is none: it is made of the calls above it."""
    flat = (heads, dim * dim)

    def rows(key):
        r = jax.random.normal(key, flat)
        return r / jnp.linalg.norm(r, axis=1, keepdims=True)

    def tall(key):
        return jax.random.normal(key, flat).T

    if cpu:  # the accelerator forms, forced
        sv, norm, basis = (
            solvers._singular_values_batched,
            solvers._spectral_norm_batched,
            solvers._orthonormal_basis_batched,
        )
    else:  # jnp.linalg's calls, vmapped as they are (under vmap on CPU they could hang)
        sv, norm, basis = (
            lambda a: jnp.linalg.svd(a, compute_uv=False),
            lambda a: jnp.linalg.norm(a, ord=2),
            lambda a: jnp.linalg.qr(a)[0],
        )

    return {
        "svd values of ΣW (dim × dim), smallest / largest": (
            lambda a: (lambda s: s[-1] / s[0])(solvers.singular_values(a)),
            lambda a: (lambda s: s[-1] / s[0])(sv(a)),
            lambda key: jax.random.normal(key, (dim, dim)),
        ),
        "smallest singular value of Θ rows (heads × dim²)": (
            lambda a: solvers.singular_values(a)[-1],
            lambda a: sv(a)[-1],
            rows,
        ),
        "QR of dim² × heads": (solvers.orthonormal_basis, basis, tall),  # both LAPACK's signs
        "spectral norm of dim² × heads": (solvers.spectral_norm, norm, tall),
        "span angle (two QRs and a spectral norm)": (
            lambda ab: largest_principal_angle(*ab),
            None,
            lambda key: (rows(key), rows(jax.random.fold_in(key, 1))),
        ),
    }


def timed(fn, x, repeats: int) -> tuple[float, float, object]:
    tic = time.perf_counter()
    compiled = jax.jit(jax.vmap(fn)).lower(x).compile()
    compile_s = time.perf_counter() - tic
    out = jax.block_until_ready(compiled(x))
    best = np.inf
    for _ in range(repeats):
        tic = time.perf_counter()
        jax.block_until_ready(compiled(x))
        best = min(best, time.perf_counter() - tic)
    return compile_s, best, out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--instances", type=int, default=None, help="default 4096 (CPU: 256)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", choices=("float32", "float64"), default="float64")
    args = p.parse_args()
    mh.set_precision(args.precision)
    device = jax.devices()[0]
    B = args.instances or (256 if device.platform == "cpu" else 4096)
    keys = jax.random.split(jax.random.key(0), B)
    rows = []
    cpu = device.platform == "cpu"
    other_form = "accelerator form" if cpu else "jnp.linalg"
    for name, (call, other, draw) in ops(args.heads, args.dim, cpu).items():
        x = jax.vmap(draw)(keys)
        compile_s, run_s, ref = timed(call, x, args.repeats)
        rows.append({"op": name, "form": "package", "compile_s": compile_s, "run_ms": 1e3 * run_s})
        if other is not None:
            compile_s, run_s, out = timed(other, x, args.repeats)
            scale = jnp.maximum(jnp.max(jnp.abs(ref)), 1e-300)
            diff = float(jnp.max(jnp.abs(out - ref)) / scale)
            rows.append(
                {
                    "op": name,
                    "form": other_form,
                    "compile_s": compile_s,
                    "run_ms": 1e3 * run_s,
                    "max_rel_diff": diff,
                }
            )
        print(f"{name}: done", flush=True)
    for r in rows:
        r["us_per_instance"] = 1e3 * r["run_ms"] / B
        r.setdefault("max_rel_diff", float("nan"))
    print(f"\n{device.device_kind}, {B} instances, heads {args.heads}, dim {args.dim}, "
          f"{args.precision}:")  # fmt: skip
    print(table(rows, ["op", "form", "compile_s", "run_ms", "us_per_instance", "max_rel_diff"]))
    context = {
        **machine(),
        "heads": args.heads,
        "dim": args.dim,
        "instances": B,
        "precision": args.precision,
        "jax": jax.__version__,
        "device_kind": device.device_kind,
    }
    path = append_rows("linalg_ops", [{**r, **context} for r in rows])
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
