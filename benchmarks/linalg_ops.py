"""The small linear-algebra calls of drawing and scoring, timed beside k × k Gram forms.

Each call is vmapped over many instances on the default device, beside a formulation that
uses only products and k × k factorisations (k = heads) where there is one.

    python benchmarks/linalg_ops.py                       # heads 4, dim 16, 4096 instances
    python benchmarks/linalg_ops.py --heads 2 --dim 8 --instances 1024

``benchmarks/stages.py`` found drawing and scoring an instance to cost about 2.9 ms on an
H200 (4096 instances at heads 4, dim 16), against 0.12 ms for 20 GD steps. Those stages
call, per instance, the singular values of ΣW (dim × dim) and of the normalised Θ rows
(heads × dim²: :func:`mhalearn.teachers.parameter_diagnostics`, in every draw of the
teacher's rejection loop), and the QR factors and spectral norm of the span angle
(:func:`mhalearn.metrics.recovery.largest_principal_angle`, dim² × heads). A GPU solver may
run such calls one instance at a time above some size. This script times each call as the
package makes it — through :mod:`mhalearn.solvers`: jnp.linalg's, batched on an accelerator,
one matrix after another under ``vmap`` on CPU, where a batched call could wait for good —
and each candidate replacement (``jit(vmap(op))``, best of ``--repeats``, compilation
apart), and the largest difference of the candidate's result from the call's, so that one
run on an accelerator says which call costs and what replacing it would change.
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
from mhalearn.solvers import eigenvalues, orthonormal_basis, singular_values, spectral_norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table


def sv_min_gram(rows):
    """The smallest singular value of a wide k × n matrix from its k × k Gram matrix."""
    return jnp.sqrt(jnp.maximum(eigenvalues(rows @ rows.T)[0], 0.0))


def spectral_norm_gram(a):
    """‖a‖₂ of a tall n × k matrix from its k × k Gram matrix (accurate for the largest
    singular value: the Gram matrix's relative error bounds it)."""
    return jnp.sqrt(jnp.maximum(eigenvalues(a.T @ a)[-1], 0.0))


def ops(heads: int, dim: int):
    """name: (the package's call, a candidate or None, a function drawing one input)."""
    flat = (heads, dim * dim)

    def rows(key):
        r = jax.random.normal(key, flat)
        return r / jnp.linalg.norm(r, axis=1, keepdims=True)

    def tall(key):
        return jax.random.normal(key, flat).T

    return {
        "svd values of ΣW (dim × dim), smallest / largest": (
            lambda a: (lambda s: s[-1] / s[0])(singular_values(a)),
            None,
            lambda key: jax.random.normal(key, (dim, dim)),
        ),
        "smallest singular value of Θ rows (heads × dim²)": (
            lambda a: singular_values(a)[-1],
            sv_min_gram,
            rows,
        ),
        "QR of dim² × heads": (orthonormal_basis, None, tall),
        "spectral norm of dim² × heads": (
            spectral_norm,
            spectral_norm_gram,
            tall,
        ),
        "span angle (two QRs and a spectral norm)": (
            lambda ab: mh.metrics.recovery.largest_principal_angle(*ab),
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
    for name, (call, candidate, draw) in ops(args.heads, args.dim).items():
        x = jax.vmap(draw)(keys)
        compile_s, run_s, ref = timed(call, x, args.repeats)
        rows.append({"op": name, "form": "package", "compile_s": compile_s, "run_ms": 1e3 * run_s})
        if candidate is not None:
            compile_s, run_s, out = timed(candidate, x, args.repeats)
            diff = float(jnp.max(jnp.abs(out - ref) / jnp.maximum(jnp.abs(ref), 1e-300)))
            rows.append(
                {
                    "op": name,
                    "form": "candidate (k × k Gram)",
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
