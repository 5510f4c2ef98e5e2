"""Seconds per recovered teacher: batched learners against a per-teacher scipy VarPro.

    python benchmarks/recovery_speed.py            # the four cells of issue 15
    python benchmarks/recovery_speed.py --small    # the first cell, 16 teachers
    python benchmarks/recovery_speed.py --cells 0 3  # some of the cells

Every learner sees the same teachers and training sets (root key 0, instance i). The baseline
is what a user without mhalearn would write: one teacher at a time, float64
``scipy.optimize.least_squares`` (Levenberg–Marquardt) on the reduced residual of variable
projection — the values W solved by least squares inside the residual, Kaufman's projected
Jacobian written here in numpy — from the same starts as mhalearn's variable projection
(restart r: ``problem.init(fold_in(fit key, r))``), the next start tried only when a start
does not fit the data. mhalearn's learners run through ``simulate`` as a user runs them: the
wall time of the whole call, compilation included (the first call of a shape in the
process), and the steady state apart (a second call on other teachers of the same shape,
which compiles nothing). A teacher is recovered when every matched Θ_i and W_i is within
1e-3 relative error, scored the same way for every learner. Prints a table per cell and the
ratios; appends rows to benchmarks/results/recovery_speed.csv.

Status (issue 15, open): the baseline's Jacobian was checked once against finite
differences (largest error 4e-10 on entries up to 2), but its numpy is not tuned yet (about
0.3 s per residual and Jacobian at the first cell, computed twice per LM iteration), so no
figures are recorded from it yet.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np
import scipy.optimize

import mhalearn as mh
from mhalearn.learners import make_learner
from mhalearn.simulate import instance_keys

mh.set_precision("float64")  # variable projection needs it

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table  # noqa: E402

#: (dim, tokens, heads, samples, teachers), β = 4
CELLS = [(8, 4, 2, 1000, 64), (8, 4, 3, 2000, 64), (16, 8, 2, 2000, 16), (8, 4, 2, 32, 64)]
LEARNERS = {"varpro": 0, "chen_li": 0, "adam": 3000}  # name: step budget (Adam only)
TOL = 1e-3


def softmax(S: np.ndarray) -> np.ndarray:
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=-1, keepdims=True)


def reduced(theta_flat: np.ndarray, X: np.ndarray, Y: np.ndarray, heads: int):
    """The reduced residual r(Θ) = P⊥ Y (W solved), its Kaufman Jacobian (I − P_Z) J_Θ, W."""
    n, T, d = X.shape
    theta = theta_flat.reshape(heads, d, d)
    A = softmax(np.einsum("ntp,ipq,nsq->nits", X, theta, X, optimize=True))  # (n, heads, T, T)
    Phi = np.einsum("nits,nsd->nitd", A, X)  # (n, heads, T, d)
    Z = Phi.transpose(0, 2, 1, 3).reshape(n * T, heads * d)
    Q, _ = np.linalg.qr(Z)
    W = np.linalg.lstsq(Z, Y.reshape(n * T, d), rcond=None)[0].reshape(heads, d, d)
    residual = (Z @ W.reshape(heads * d, d)).reshape(n, T, d) - Y
    # ∂F[n,t,e]/∂Θ_i[p,q] = x_t[p]·C_i[t,q,e], C_i[t,q,e] = Σ_s A[t,s](x_s[q] − x̄_t[q]) V_i[s,e]
    V = np.einsum("nsd,ide->nise", X, W)
    C = np.einsum("nits,nsq,nise->nitqe", A, X, V, optimize=True) - np.einsum(
        "nitq,nite->nitqe", Phi, np.einsum("nits,nise->nite", A, V)
    )
    J = np.einsum("ntp,nitqe->nteipq", X, C).reshape(n * T, d, -1)
    J = J - np.einsum("rk,kep->rep", Q, np.einsum("rk,rep->kep", Q, J))  # (I − P_Z) per e
    return residual.reshape(-1), J.reshape(n * T * d, -1), W


def scipy_varpro(X, Y, heads, starts, tol=1e-20):
    """LM from each start in turn until one fits (cost ≤ tol·mean(Y²)); the best one."""
    best = None
    size = np.mean(Y**2)
    for theta0 in starts:

        def fun(t):
            return reduced(t, X, Y, heads)[0]

        def jac(t):
            return reduced(t, X, Y, heads)[1]

        out = scipy.optimize.least_squares(
            fun, theta0.ravel(), jac=jac, method="lm", xtol=1e-15, ftol=1e-15, max_nfev=200
        )
        cost = np.mean(out.fun**2)
        if best is None or cost < best[0]:
            best = (cost, out.x)
        if cost <= tol * size:
            break
    theta = best[1].reshape(heads, X.shape[-1], X.shape[-1])
    return theta, reduced(best[1], X, Y, heads)[2]


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
    return {"recovered": recovered, "wall_s": seconds, "steady_s": seconds}


def run_batched(task, learner, teachers: int) -> dict:
    mh.batch.clear_programs()  # the first call compiles, as in a fresh process
    tic = time.perf_counter()
    res = mh.simulate(jax.random.key(0), task, learner, teachers)
    wall = time.perf_counter() - tic
    again = mh.simulate(jax.random.key(1), task, learner, teachers)  # compiled already
    return {
        "recovered": int(res.metrics["success"].sum()),
        "wall_s": wall,
        "steady_s": again.attrs["run_seconds"],
        "compile_s": res.attrs["compile_seconds"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="the first cell, 16 teachers")
    p.add_argument("--cells", type=int, nargs="*", default=None, help="cell indices (0–3)")
    args = p.parse_args()
    cells = [CELLS[i] for i in args.cells] if args.cells is not None else CELLS
    if args.small:
        cells = [(*CELLS[0][:4], 16)]
    restarts = make_learner("varpro", 1).restarts
    print(f"machine: {machine()}, jax {jax.__version__}, float64")
    rows = []
    for dim, tokens, heads, samples, teachers in cells:
        task = cell_task(dim, tokens, heads, samples)
        shape = {"dim": dim, "tokens": tokens, "heads": heads, "samples": samples}
        out = {"scipy_varpro": run_scipy(task, teachers, restarts)}
        for name, steps in LEARNERS.items():
            out[name] = run_batched(task, make_learner(name, steps), teachers)
        base = out["scipy_varpro"]
        per = lambda o, k: o[k] / max(o["recovered"], 1)  # noqa: E731
        cell_rows = []
        for name, o in out.items():
            row = {
                **shape,
                "teachers": teachers,
                "learner": name,
                "recovered": o["recovered"],
                "wall_s": o["wall_s"],
                "steady_s": o["steady_s"],
                "compile_s": o.get("compile_s", 0.0),
                "s_per_recovered_wall": per(o, "wall_s"),
                "s_per_recovered_steady": per(o, "steady_s"),
                "speedup_wall": per(base, "wall_s") / per(o, "wall_s") if o["recovered"] else 0.0,
                "speedup_steady": (
                    per(base, "steady_s") / per(o, "steady_s") if o["recovered"] else 0.0
                ),
            }
            cell_rows.append(row)
        print(f"\n{shape}, {teachers} teachers, β 4:")
        columns = ["learner", "recovered", "wall_s", "steady_s", "compile_s"]
        columns += ["s_per_recovered_wall", "speedup_wall", "speedup_steady"]
        print(table(cell_rows, columns))
        rows += cell_rows
    path = append_rows("recovery_speed", [{**machine(), **r} for r in rows])
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
