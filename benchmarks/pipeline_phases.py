"""Seconds per teacher of each phase of certify-and-sculpt, against straightforward versions in
the same run.

    python benchmarks/pipeline_phases.py                        # heads 2, N 100 000, β 4
    python benchmarks/pipeline_phases.py --heads 3 --samples 10000 --teachers 4

At the ``sculpt`` study's settings (``Sculpt().learner()``: K from up to 4096 certified rows,
600 iterations per QP, every span method), float64 problems, each phase jit-compiled on its own
and timed warm (one more teacher compiles first), seconds per teacher:

- ``sum_w``: the ΣW refinement (30 rounds × 4 restarts), against ``sum_w_sorted`` — the same
  rounds with the kept share taken from a full argsort, the weighted Gram as one einsum over
  (samples, tokens) and the restarts vmapped (the implementation before the current one);
- ``certify``: the certificate and K;
- ``head bodies``: the own phase of the heads' methods (``heads``, ``heads_subsets``) — each
  head's values, its rows certified head by head and its body K_i;
- ``min_norm``, then each span method given K's min-norm point, in float32 (the default) and
  float64 (``qp_products=None``);
- ``tilt``: K's tilt at the heads (a metric the study reports);
- ``search``: the pure mode's candidates inside the span of the search's method.

Prints a table and the ratios; appends rows to benchmarks/results/pipeline_phases.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

import mhalearn as mh
from mhalearn import draws
from mhalearn.experiments.sculpt import Sculpt
from mhalearn.learners import chen_li as cl
from mhalearn.learners.chen_li.phases import (
    certify_phase,
    head_bodies_phase,
    search_phase,
    span_phase,
    sum_w_phase,
)
from mhalearn.metrics.recovery import TILT_DIRECTIONS, constraint_tilt
from mhalearn.solvers import ridge_solve

mh.set_precision("float64")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table  # noqa: E402


def sorted_share(res, share):
    """The kept rows from a stable argsort (the former ``smallest_share``)."""
    flat = res.reshape(-1)
    keep = jnp.maximum(jnp.ceil(share * flat.size), 1)
    order = jnp.argsort(flat)
    rank = jnp.zeros(flat.size, order.dtype).at[order].set(jnp.arange(flat.size))
    return (rank < keep).reshape(res.shape)


def sorted_refinement(key, X, Y, S0, config: cl.Refinement):
    """The former refinement: sorted shares, one einsum for the Gram, restarts vmapped."""
    rounds = config.rounds
    ratio = jnp.asarray(config.quantile_end / config.quantile_start)
    shares = config.quantile_start * ratio ** (jnp.arange(rounds) / max(rounds - 1, 1))

    def refine(S):
        def round_(S, share):
            found = cl.row_matches(X, Y, S)
            best, keep = found.tokens, sorted_share(found.residual, share).astype(X.dtype)
            xb = jnp.take_along_axis(X, best[..., None], axis=1)
            gram = jnp.einsum("na,nad,nae->de", keep, xb, xb)
            rhs = jnp.einsum("na,nad,nae->de", keep, xb, Y)
            return ridge_solve(gram, rhs, 1e-9), None

        return jax.lax.scan(round_, S, shares)[0]

    def score(S):
        res = cl.row_matches(X, Y, S).residual
        keep = sorted_share(res, config.quantile_end)
        return jnp.sum(jnp.where(keep, res, 0.0)) / jnp.maximum(jnp.sum(keep), 1)

    noise = draws.normal(key, (config.restarts - 1, *S0.shape), S0.dtype)
    size = jnp.linalg.norm(S0) / S0.shape[0]
    starts = jnp.concatenate([S0[None], S0 + config.noise * size * noise])
    finals = jax.vmap(refine)(starts)
    return finals[jnp.argmin(jax.vmap(score)(finals))]


@eqx.filter_jit
def certified_token(problem, S, config):
    """The token each row is certified to attend to (the tilt's input, computed untimed)."""
    return cl.certify(problem.X, problem.Y, S, config.certification).token


def phases(config: cl.ChenLiConfig, heads: int) -> dict:
    """name → (jitted function, how to call it from the teacher's state)."""
    high = dataclasses.replace(config, qp_products=None)

    @eqx.filter_jit
    def sum_w_sorted(k, p):
        return sorted_refinement(k, p.X, p.Y, cl.crude_sum_w(p.X, p.Y), config.refinement)

    @eqx.filter_jit
    def min_norm(K, c):
        return cl.k_min_norm_point(K, c.qp)

    @eqx.filter_jit
    def tilt(p, K, token, theta):
        directions = draws.normal(jax.random.key(0), (TILT_DIRECTIONS, *theta.shape[1:]))
        return constraint_tilt(p.X, K.rows, token, theta, config.delta, directions)

    out = {
        "sum_w": lambda s: sum_w_phase(s["k"], s["p"], config),
        "sum_w_sorted": lambda s: sum_w_sorted(s["k"], s["p"]),
        "certify": lambda s: certify_phase(s["k"], s["p"], s["S"], config),
        "head bodies": lambda s: head_bodies_phase(s["k"], s["p"], s["S"], heads, config),
        "min_norm float32": lambda s: min_norm(s["K"], config),
        "min_norm float64": lambda s: min_norm(s["K"], high),
    }
    for method in cl.SPAN_METHODS:
        for name, c in (("float32", config), ("float64", high)):
            c = dataclasses.replace(c, span_method=method)
            out[f"{method} {name}"] = lambda s, c=c: span_phase(
                s["k"], s["K"], heads, c, s["point"], s["bodies"]
            )
    out["tilt"] = lambda s: tilt(s["p"], s["K"], s["token"], s["theta"])
    out["search"] = lambda s: search_phase(s["k"], s["p"], s["basis"], s["point"], s["K"], config)
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--beta", type=float, default=4.0)
    p.add_argument("--teachers", type=int, default=2, help="timed teachers (after one more)")
    args = p.parse_args()
    study = Sculpt(heads=(args.heads,), samples=(args.samples,), beta=(args.beta,))
    config = study.learner()
    task = study.task({"heads": args.heads, "samples": args.samples}, args.beta)
    timed = phases(config, args.heads)
    seconds = {name: 0.0 for name in timed}
    for i in range(args.teachers + 1):  # teacher 0 compiles every phase
        k = jax.random.key(i)
        teacher, problem = task.sample(k)
        state = {"k": k, "p": problem, "theta": teacher.theta}
        state["S"] = timed["sum_w"](state)
        state["K"] = timed["certify"](state)
        state["bodies"] = timed["head bodies"](state)
        state["token"] = certified_token(problem, state["S"], config)
        state["point"] = timed["min_norm float32"](state)
        state["basis"] = timed["subsets float32"](state).basis
        for name, fn in timed.items():
            tic = time.perf_counter()
            jax.block_until_ready(fn(state))
            if i > 0:
                seconds[name] += (time.perf_counter() - tic) / args.teachers
    shape = dict(heads=args.heads, samples=args.samples, beta=args.beta, teachers=args.teachers)
    rows = [{"phase": name, **shape, "seconds": s} for name, s in seconds.items()]
    print(f"machine: {machine()}, jax {jax.__version__}; {shape}, dim 8, tokens 4")
    print(table(rows, ["phase", "seconds"]))
    # the span phase: every method's queries, the shared min-norm point and the heads' bodies
    shared = seconds["head bodies"]
    span32 = sum(seconds[f"{m} float32"] for m in cl.SPAN_METHODS) + seconds["min_norm float32"]
    span64 = sum(seconds[f"{m} float64"] for m in cl.SPAN_METHODS) + seconds["min_norm float64"]
    span32, span64 = span32 + shared, span64 + shared
    print(
        f"ΣW refinement: {seconds['sum_w_sorted'] / seconds['sum_w']:.2f}× faster than sorted; "
        f"span phase with every method (one min-norm point): {span32:.2f} s in float32, "
        f"{span64:.2f} s in float64 ({span64 / span32:.2f}×)"
    )
    path = append_rows("pipeline_phases", [{**r, **machine()} for r in rows])
    print(f"rows appended to {path}")


if __name__ == "__main__":
    main()
