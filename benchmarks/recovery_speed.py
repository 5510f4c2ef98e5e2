"""Seconds per recovered teacher: batched learners against a per-teacher scipy VarPro.

    python benchmarks/recovery_speed.py            # the four cells (CELLS below)
    python benchmarks/recovery_speed.py --small    # the first cell, 16 teachers
    python benchmarks/recovery_speed.py --cells 0 3  # some of the cells
    python benchmarks/recovery_speed.py --learners varpro  # the baseline and some learners
    python benchmarks/recovery_speed.py --small --teachers 256 --no-baseline  # the GPU check
    python benchmarks/recovery_speed.py --memory   # peak memory at 64 and 4096 teachers
    python benchmarks/recovery_speed.py --learners varpro --no-baseline --chunk-rows 4096

Every learner sees the same teachers and training sets (root key 0, instance i). The
baseline is what a user without mhalearn would write: one teacher at a time, float64
``scipy.optimize.least_squares`` (trust region ``trf``, LSMR subproblems) on the reduced
residual of variable projection — the values W solved by least squares inside the residual,
Kaufman's projected Jacobian written here in numpy — from the same starts as mhalearn's
variable projection (restart r: ``problem.init(fold_in(fit key, r))``), the next start tried
only when a start does not fit the data. mhalearn's learners run through ``simulate`` as a
user runs them: the wall time of the whole call, compilation included (the first call of a
shape in the process; nothing is kept from an earlier cell), the steady state apart (the
same call after its compilation), and for variable projection the wall time of a second run
of the study (``wall_warm_s``: the call again in a process that has forgotten its programs,
which it reads from the persistent compilation cache of ``mh.enable_compilation_cache``,
empty at the start of the script; on a split CPU only the first device's program is in it —
the others were loaded from it, not compiled — so the warm call compiles theirs). The CPU is
split into ``--cpu-devices`` devices (default one per core) for the batched learners; the
scipy baseline runs in numpy, on the same cores. A teacher is recovered when every matched
Θ_i and W_i is within 1e-3 relative error, scored the same way for every learner. Prints a
table per cell and the ratios; appends rows to benchmarks/results/recovery_speed.csv.

The scipy set-up is the fastest of those we tried at the first cell (seconds per teacher,
two starts at most): ``method="lm"`` (MINPACK) with a dense J 5.2, ``trf`` with a dense J 5.1
(its SVD of the 32 000 × 128 J takes 0.34 s per iteration), ``dogbox`` with a dense J 2.7,
``trf`` with LSMR on J as a linear operator 1.2 (used here). ``--check`` holds the Jacobian
products against central differences of the residual at the teacher (largest relative error
7e-10 over the four cells) and against each other (⟨u, Jv⟩ = ⟨Jᵀu, v⟩).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import scipy.optimize
import scipy.sparse.linalg

import mhalearn as mh
from mhalearn.learners import make_learner
from mhalearn.learners import reduced as engine_reduced
from mhalearn.simulate import instance_keys

mh.set_precision("float64")  # variable projection needs it

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, fused_setting, machine, peak_rss_mb, table  # noqa: E402

#: (dim, tokens, heads, samples, teachers), β = 4
CELLS = [(8, 4, 2, 1000, 64), (8, 4, 3, 2000, 64), (16, 8, 2, 2000, 16), (8, 4, 2, 32, 64)]
#: name: step budget (Adam only); chen_li is the polished pipeline, chen_li_pure its pure mode
LEARNERS = {"varpro": 0, "chen_li": 0, "chen_li_pure": 0, "adam": 3000}
TOL = 1e-3


def softmax(S: np.ndarray) -> np.ndarray:
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=-1, keepdims=True)


def reduced(theta_flat: np.ndarray, X: np.ndarray, Y: np.ndarray, heads: int):
    """The reduced residual r(Θ) = P⊥ Y (W solved), its Kaufman Jacobian (I − P_Z) J_Θ as a
    linear operator, and W.

    ∂F[n,t,e]/∂Θ_i[p,q] = x_t[p]·C_i[t,q,e] with C_i[t,q,e] = Σ_s A_i[t,s](x_s[q] − x̄_t[q])
    V_i[s,e], so products with J cost O(n·heads·tokens·dim²) each, and J (rows n·tokens·dim)
    is never formed — the fastest of the scipy set-ups we tried (a dense J through MINPACK's
    ``lm`` or ``trf``'s SVD spends ~0.35 s per iteration at the first cell)."""
    n, T, d = X.shape
    theta = theta_flat.reshape(heads, d, d)
    A = softmax(np.einsum("ntp,ipq,nsq->nits", X, theta, X, optimize=True))  # (n, heads, T, T)
    Phi = A @ X[:, None]  # (n, heads, T, d)
    Z = Phi.transpose(0, 2, 1, 3).reshape(n * T, heads * d)
    Q, _ = np.linalg.qr(Z)
    W = np.linalg.lstsq(Z, Y.reshape(n * T, d), rcond=None)[0].reshape(heads, d, d)
    residual = (Z @ W.reshape(heads * d, d)).reshape(n, T, d) - Y
    V = X[:, None] @ W[None]  # (n, heads, T, d)
    C = (
        np.einsum("nits,nsq,nise->nitqe", A, X, V, optimize=True)
        - Phi[..., None] * (A @ V)[..., None, :]
    )

    def project(u):  # (I − P_Z) for each output coordinate e
        U = u.reshape(n * T, d)
        return U - Q @ (Q.T @ U)

    def matvec(v):
        xv = X[:, None] @ v.reshape(heads, d, d)[None]  # (n, heads, T, d)
        return project(np.einsum("nitq,nitqe->nte", xv, C)).ravel()

    def rmatvec(u):
        U = project(u).reshape(n, T, d)
        cu = np.einsum("nitqe,nte->nitq", C, U)
        return np.einsum("ntp,nitq->ipq", X, cu).ravel()

    P = heads * d * d
    J = scipy.sparse.linalg.LinearOperator(
        (n * T * d, P), matvec=matvec, rmatvec=rmatvec, dtype=X.dtype
    )
    return residual.ravel(), J, W


class Memo:
    """The residual and its Jacobian from one evaluation per Θ (scipy asks for them apart)."""

    def __init__(self, X, Y, heads):
        self.args, self.theta, self.out = (X, Y, heads), None, None

    def __call__(self, theta):
        if self.theta is None or not np.array_equal(theta, self.theta):
            self.theta, self.out = theta.copy(), reduced(theta, *self.args)
        return self.out


def scipy_varpro(X, Y, heads, starts, tol=1e-20):
    """Trust-region LM (``trf``, subproblems by LSMR) from each start in turn until one fits
    (cost ≤ tol·mean(Y²)); the best one."""
    best = None
    size = np.mean(Y**2)
    for theta0 in starts:
        memo = Memo(X, Y, heads)
        out = scipy.optimize.least_squares(
            lambda t, memo=memo: memo(t)[0],
            theta0.ravel(),
            jac=lambda t, memo=memo: memo(t)[1],
            method="trf",
            tr_solver="lsmr",
            xtol=1e-15,
            ftol=1e-15,
            gtol=1e-15,
            max_nfev=200,
        )
        cost = np.mean(out.fun**2)
        if best is None or cost < best[0]:
            best = (cost, out.x)
        if cost <= tol * size:
            break
    theta = best[1].reshape(heads, X.shape[-1], X.shape[-1])
    return theta, reduced(best[1], X, Y, heads)[2]


def check_jacobian(task) -> float:
    """Largest error of J·v against central differences of the residual, and of ⟨u, J v⟩
    against ⟨Jᵀu, v⟩, over a few random directions (relative to the largest entry). At the
    teacher, where the residual vanishes: there Kaufman's J is the exact derivative (away
    from it, it drops a term of the size of the residual, by design)."""
    keys = instance_keys(jax.random.fold_in(jax.random.key(0), 0))
    teacher, problem = task.sample(keys.problem)
    X, Y = np.asarray(problem.X), np.asarray(problem.Y)
    heads = task.teacher.heads
    theta = np.asarray(teacher.theta).ravel()
    r, J, _ = reduced(theta, X, Y, heads)
    rng, worst, h = np.random.default_rng(0), 0.0, 1e-6
    for _ in range(3):
        v, u = rng.standard_normal(theta.size), rng.standard_normal(r.size)
        fd = (reduced(theta + h * v, X, Y, heads)[0] - reduced(theta - h * v, X, Y, heads)[0]) / (
            2 * h
        )
        Jv = J.matvec(v)
        worst = max(worst, np.max(np.abs(Jv - fd)) / np.max(np.abs(fd)))
        worst = max(worst, abs(u @ Jv - J.rmatvec(u) @ v) / abs(u @ Jv))
    return worst


def cell_task(dim, tokens, heads, samples) -> mh.RegressionTask:
    spec = mh.TeacherSpec(heads=heads, dim=dim, tokens=tokens, beta=4.0)
    return mh.RegressionTask(teacher=spec, samples=samples, test_samples=256, success_tol=TOL)


def run_scipy(task, teachers: int, restarts: int) -> dict:
    recovered, seconds = 0, 0.0
    root = jax.random.key(0)
    for i in range(teachers):
        keys = instance_keys(jax.random.fold_in(root, i))
        teacher, problem = task.sample(keys.problem)
        X, Y = np.asarray(problem.X), np.asarray(problem.Y)
        starts = [
            np.asarray(problem.init(jax.random.fold_in(keys.fit, r)).theta) for r in range(restarts)
        ]
        tic = time.perf_counter()
        theta, W = scipy_varpro(X, Y, task.teacher.heads, starts)
        seconds += time.perf_counter() - tic
        errors = mh.parameter_errors(mh.LayerParams(theta=theta, W=W), teacher)
        recovered += bool(max(errors.theta_error_max, errors.w_error_max) <= TOL)
    return {"recovered": recovered, "wall_s": seconds, "steady_s": seconds, "compile_s": 0.0}


def run_batched(task, learner, teachers: int, warm: bool) -> dict:
    """The whole ``simulate`` call, compiling first as in a fresh process (the programs kept
    from earlier cells are forgotten); its run time after compilation is the steady state.
    ``warm``: the same call again as a second run of the study would make it, its programs
    read from the persistent compilation cache (forgotten in the process first)."""
    mh.batch.clear_programs()
    tic = time.perf_counter()
    res = mh.simulate(jax.random.key(0), task, learner, teachers)
    out = {
        "recovered": int(res.metrics["success"].sum()),
        "wall_s": time.perf_counter() - tic,
        "steady_s": res.attrs["run_seconds"],
        "compile_s": res.attrs["compile_seconds"],
    }
    if warm:
        mh.batch.clear_programs()
        tic = time.perf_counter()
        mh.simulate(jax.random.key(0), task, learner, teachers)
        out["wall_warm_s"] = time.perf_counter() - tic
    return out


#: --memory: the last cell's shape, budgets cut short (the solvers' loops carry fixed-size
#: state, so memory does not depend on the iteration counts), chunks of 64 teachers
MEMORY_LEARNERS = {
    "varpro": lambda: mh.VarProConfig(iterations=3, restarts=1),
    "chen_li": lambda: mh.ChenLiConfig(
        refit_rounds=3,
        refit_restarts=2,
        qp_iterations=20,
        candidate=mh.VarProConfig(iterations=2, restarts=1),
        polish=mh.VarProConfig(iterations=2, restarts=1),
    ),
}


def memory_one(learner: str, teachers: int) -> dict:
    """One run in this process (a fresh subprocess of ``--memory``): its peak memory."""
    task = cell_task(*CELLS[-1][:4])
    tic = time.perf_counter()
    res = mh.simulate(jax.random.key(0), task, MEMORY_LEARNERS[learner](), teachers, chunk_size=64)
    kept = sum(a.nbytes for a in res.arrays().values()) / teachers
    return {
        "learner": learner,
        "teachers": teachers,
        "chunk_size": 64,
        "wall_s": time.perf_counter() - tic,
        "peak_rss_mb": peak_rss_mb(),
        "result_bytes_per_teacher": kept,
    }


def memory_rows() -> list[dict]:
    rows = []
    for learner in MEMORY_LEARNERS:
        for teachers in (64, 4096):
            cmd = [sys.executable, __file__, "--memory-one", learner, str(teachers)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="the first cell, 16 teachers")
    p.add_argument("--cells", type=int, nargs="*", default=None, help="cell indices (0–3)")
    p.add_argument(
        "--learners",
        nargs="*",
        choices=list(LEARNERS),
        default=list(LEARNERS),
        help="batched learners run beside the scipy baseline (default: all)",
    )
    p.add_argument(
        "--teachers", type=int, default=None, help="teachers per cell (default: each cell's own)"
    )
    p.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the scipy baseline (without it the speedups are not computed)",
    )
    p.add_argument("--check", action="store_true", help="check the baseline's Jacobian only")
    p.add_argument("--memory", action="store_true", help="peak memory at 64 and 4096 teachers")
    p.add_argument("--memory-one", nargs=2, help=argparse.SUPPRESS)
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=os.cpu_count() or 1,
        help="split the CPU into this many devices for the batched learners (default: one "
        "per core; the program is compiled once and runs on each)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="variable projection's (sample, token) rows per chunk of its Gauss–Newton sums "
        "(default: the engine's for the platform, reduced.CHUNK_ROWS)",
    )
    args = p.parse_args()
    if args.chunk_rows is not None and args.chunk_rows < 1:
        p.error(f"--chunk-rows must be at least 1, received {args.chunk_rows}")
    cpu_devices = mh.split_cpu(args.cpu_devices)  # before JAX touches a device
    if args.memory_one:
        print(json.dumps(memory_one(args.memory_one[0], int(args.memory_one[1]))))
        return
    if args.memory:
        rows = memory_rows()
        print(f"shape {CELLS[-1][:4]}, chunks of 64 teachers, short budgets:")
        print(table(rows, ["learner", "teachers", "wall_s", "peak_rss_mb"]))
        for a, b in zip(rows[::2], rows[1::2], strict=True):
            ratio = b["peak_rss_mb"] / a["peak_rss_mb"]
            print(f"{a['learner']}: peak memory 4096 / 64 teachers {ratio:.2f}×")
        path = append_rows("recovery_memory", [{**machine(), **r} for r in rows])
        print(f"rows appended to {path}")
        return
    if args.check:
        for dim, tokens, heads, samples, _ in CELLS:
            worst = check_jacobian(cell_task(dim, tokens, heads, samples))
            cell = (dim, tokens, heads, samples)
            print(f"cell {cell}: largest relative Jacobian error {worst:.1e}")
        return
    cells = [CELLS[i] for i in args.cells] if args.cells is not None else CELLS
    if args.small:
        cells = [(*CELLS[0][:4], 16)]
    if not (args.baseline or args.learners):
        p.error("nothing to run: no learner and --no-baseline")
    if args.teachers is not None:
        if args.teachers < 1:
            p.error(f"--teachers must be at least 1, received {args.teachers}")
        cells = [(*cell[:4], args.teachers) for cell in cells]
    restarts = make_learner("varpro", 1).restarts
    platform = jax.devices()[0].platform
    if args.chunk_rows is not None:
        engine_reduced.CHUNK_ROWS[platform] = args.chunk_rows
    chunk_rows = engine_reduced.chunk_rows(platform)
    print(
        f"machine: {machine()}, jax {jax.__version__}, float64, CPU split {cpu_devices}, "
        f"variable projection's chunks of {chunk_rows} rows"
    )
    # an empty persistent cache: the first call of a cell compiles (and stores), the warm one
    # reads what it stored — a second run of the same study
    mh.enable_compilation_cache(tempfile.mkdtemp(prefix="mhalearn-xla-"))
    rows = []
    for dim, tokens, heads, samples, teachers in cells:
        task = cell_task(dim, tokens, heads, samples)
        shape = {"dim": dim, "tokens": tokens, "heads": heads, "samples": samples}
        out = {"scipy_varpro": run_scipy(task, teachers, restarts)} if args.baseline else {}
        for name in args.learners:
            steps = LEARNERS[name]
            out[name] = run_batched(task, make_learner(name, steps), teachers, name == "varpro")
        base = out.get("scipy_varpro")
        per = lambda o, k: o[k] / max(o["recovered"], 1)  # noqa: E731
        cell_rows = []
        for name, o in out.items():
            o.setdefault("wall_warm_s", o["wall_s"] if name == "scipy_varpro" else float("nan"))
            row = {**shape, "teachers": teachers, "learner": name, **o}
            row["cpu_devices"] = cpu_devices  # the JAX learners'; the baseline is numpy's
            for kind in ("wall", "wall_warm", "steady"):
                row[f"s_per_recovered_{kind}"] = per(o, f"{kind}_s")
                if base is None:
                    ratio = float("nan")
                elif o["recovered"]:
                    ratio = per(base, f"{kind}_s") / per(o, f"{kind}_s")
                else:
                    ratio = 0.0
                row[f"speedup_{kind}"] = ratio
            cell_rows.append(row)
        print(f"\n{shape}, {teachers} teachers, β 4:")
        columns = ["learner", "recovered", "wall_s", "compile_s", "steady_s", "wall_warm_s"]
        columns += ["s_per_recovered_wall", "speedup_wall", "speedup_wall_warm", "speedup_steady"]
        print(table(cell_rows, columns), flush=True)
        if "varpro" in out:  # cost per teacher, recovered or not, against variable projection
            for name in [n for n in out if n not in ("varpro", "scipy_varpro")]:
                wall, steady = (out[name][k] / out["varpro"][k] for k in ("wall_s", "steady_s"))
                print(f"{name} ÷ varpro per teacher: wall {wall:.2f}×, steady {steady:.2f}×")
        rows += cell_rows
    context = {
        **machine(),
        "fused_on_gpu": fused_setting(),
        "chunk_rows": chunk_rows,
        "jax": jax.__version__,
        "device_kind": jax.devices()[0].device_kind,
    }
    path = append_rows("recovery_speed", [{**context, **r} for r in rows])
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
