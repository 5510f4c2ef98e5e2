"""Phase 5 of the certify-and-sculpt reconstruction: the search inside the estimated span.

Random restarts of variable projection restricted to the span (in place of the paper's net
over m×m coefficients), W by least squares, and — in the default ``"polished"`` mode — a
joint polish of all of Θ, which does the fitting at m ≥ 2 when the span is poor; ``"pure"``
keeps the search's result. A candidate is accepted only when every head satisfies K's
constraints (within ``constraint_slack``) and the data are fitted within ``accept_tol`` (the
certificate).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import choice, positive_int
from mhalearn.learners.base import Fit, Monitor, nan_last
from mhalearn.learners.chen_li.body import Constraints
from mhalearn.learners.varpro import Solve, VarProConfig, levenberg_marquardt
from mhalearn.problems import RegressionProblem

#: what follows the search inside the span (:func:`search_in_span`)
MODES = ("polished", "pure")
#: the pure mode's candidates stop once stalled (``VarProConfig.stall_tol``): inside an
#: inexact span the restricted minimum is no fit, and the rest of the budget would not move it
PURE_STALL = 1e-6


class Search(eqx.Module):
    """Phase 5's settings: ``candidates`` random starts, each a ``candidate`` solve inside the
    span, then (``mode="polished"``) a ``polish`` on all of Θ; a candidate is accepted at cost
    ``<= accept_tol``·mean(Y²) with every head within ``constraint_slack`` of K; the search
    sees the first ``samples`` samples (``None``: all)."""

    candidates: int = eqx.field(static=True, default=2)
    candidate: VarProConfig = VarProConfig(iterations=10, restarts=1)
    polish: VarProConfig = VarProConfig(iterations=20, restarts=1)
    mode: str = eqx.field(static=True, default="polished")
    accept_tol: float | Array = 1e-6
    constraint_slack: float | Array = 0.5
    samples: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        positive_int("candidates", self.candidates)
        choice("mode", self.mode, MODES)
        if self.samples is not None:
            positive_int("search_samples", self.samples)


def satisfies(K: Constraints, theta: Float[Array, "heads dim dim"], slack) -> Bool[Array, ""]:
    """Every head within ``slack`` of every valid constraint of K."""
    margins = theta.reshape(theta.shape[0], -1) @ K.G.T - K.bound  # (heads, constraints)
    return jnp.all(jnp.where(K.valid[None, :], margins >= -slack, True))


def search_problem(problem: RegressionProblem, samples: int | None) -> RegressionProblem:
    """The samples phase 5 sees: the first ``samples`` (all when ``None``)."""
    if samples is None or samples >= problem.samples:
        return problem
    return eqx.tree_at(lambda p: (p.X, p.Y), problem, (problem.X[:samples], problem.Y[:samples]))


class Candidate(eqx.Module):
    """The search's chosen candidate: its last solve (the polish in the polished mode), its
    cost at the end of the search inside the span, whether some candidate carries the
    certificate, and how many do."""

    solve: Solve
    span_cost: Float[Array, ""]
    accepted: Bool[Array, ""]
    accepted_count: Int[Array, ""]

    @property
    def theta(self) -> Float[Array, "heads dim dim"]:
        return self.solve.theta

    @property
    def W(self) -> Float[Array, "heads dim dim"]:
        return self.solve.W

    @property
    def cost(self) -> Float[Array, ""]:
        """Its final cost (after the polish in the polished mode)."""
        return self.solve.cost

    def fit(self, monitor: Monitor | None = None, info=None, estimates=None) -> Fit:
        return self.solve.fit(monitor, info, estimates)


def search_in_span(
    key: PRNGKeyArray,
    problem: RegressionProblem,
    basis: Float[Array, "heads params"],
    scale: Float[Array, ""],
    K: Constraints,
    settings: Search,
) -> Candidate:
    """``candidates`` random restarts: variable projection with Θ_i = Σ_j C_ij V_j (V:
    ``basis``) from C ~ N(0, scale²/heads) (W by least squares at every step), then — in the
    polished mode only — a joint polish of all of Θ. A candidate is accepted when its cost is
    ``<= accept_tol``·mean(Y²) and every head lies in K (within ``constraint_slack``); the
    accepted one with the lowest cost is returned (or, if none is accepted, the lowest-cost
    one, flagged)."""
    m = problem.heads
    d = problem.X.shape[-1]
    lift = jnp.kron(jnp.eye(m, dtype=basis.dtype), basis.T)  # vec(C) → vec(Θ)

    def one(k):
        C = scale / math.sqrt(m) * draws.normal(k, (m, m), basis.dtype)
        theta0 = (C @ basis).reshape(m, d, d)
        found = levenberg_marquardt(problem, theta0, settings.candidate, lift)
        if settings.mode == "pure":
            return found, found.cost
        return levenberg_marquardt(problem, found.theta, settings.polish), found.cost

    # one after another, so that each candidate stops on its own (vmapped, all ran as long as
    # the slowest, and both branches of every step's conditionals ran)
    solves, span_costs = jax.lax.map(one, jax.random.split(key, settings.candidates))
    costs = solves.history[:, -1]  # (candidates,)
    fits = costs <= settings.accept_tol * jnp.mean(problem.Y**2)
    inside = jax.vmap(lambda t: satisfies(K, t, settings.constraint_slack))(solves.theta)
    accepted = fits & inside
    pick = jnp.where(
        jnp.any(accepted),
        jnp.argmin(jnp.where(accepted, costs, jnp.inf)),
        jnp.argmin(nan_last(costs)),
    )
    return Candidate(
        solve=jax.tree.map(lambda a: a[pick], solves),
        span_cost=span_costs[pick],
        accepted=jnp.any(accepted),
        accepted_count=jnp.sum(accepted),
    )
