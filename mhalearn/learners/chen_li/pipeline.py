"""The certify-and-sculpt pipeline: every phase in order (:func:`fit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from mhalearn.learners.base import Fit, Monitor
from mhalearn.learners.chen_li.body import Constraints, constraints, head_bodies, k_min_norm_point
from mhalearn.learners.chen_li.certify import Certificate, certify, certify_values
from mhalearn.learners.chen_li.search import search_in_span, search_problem
from mhalearn.learners.chen_li.span import span_estimate
from mhalearn.learners.chen_li.values import crude_sum_w, head_values, refine_sum_w_restarts
from mhalearn.learners.varpro import STALL_PATIENCE
from mhalearn.problems import GivenStart, RegressionProblem

if TYPE_CHECKING:
    from mhalearn.learners.chen_li.config import ChenLiConfig


class HeadsPhase(eqx.Module):
    """The heads' own phase: each head's values, the rows certified head by head, and the
    heads' bodies K_i."""

    values: Float[Array, "heads dim dim"]
    certificate: Certificate
    bodies: Constraints


def heads_phase(
    k_refit: PRNGKeyArray,
    k_dedup: PRNGKeyArray,
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    heads: int,
    config: ChenLiConfig,
) -> HeadsPhase:
    """The own phase of the heads' span methods, as :func:`fit` runs it: each head's values
    (:func:`~.values.head_values`, key ``fold_in(k_refit, 1)``), the rows certified head by
    head (:func:`~.certify.certify_values`) and the heads' bodies
    (:func:`~.body.head_bodies`, key ``k_dedup``)."""
    key = jax.random.fold_in(k_refit, 1)
    values = head_values(key, X, Y, S, heads, config.refinement, config.head_values).estimate
    cert = certify_values(X, Y, values, config.certification)
    return HeadsPhase(values, cert, head_bodies(k_dedup, X, cert, config.body))


def fit(
    config: ChenLiConfig,
    key: PRNGKeyArray,
    problem: RegressionProblem,
    monitor: Monitor | None = None,
) -> Fit:
    """All phases in order; diagnostics of each in ``Fit.info``, the intermediate estimates
    in ``Fit.estimates``. The pipeline derives its starts from the data: a
    :class:`~mhalearn.problems.GivenStart` is refused."""
    if isinstance(problem.start, GivenStart):
        raise ValueError(
            "start: the Chen–Li pipeline starts from its own convex phases, not from a "
            "GivenStart; give the start to variable projection or a GD learner"
        )
    X, Y, m = problem.X, problem.Y, problem.heads
    k_refit, k_dedup, k_span, k_search = jax.random.split(key, 4)
    S0 = crude_sum_w(X, Y)
    S = refine_sum_w_restarts(k_refit, X, Y, S0, config.refinement).estimate
    cert = certify(X, Y, S, config.certification)
    K = constraints(k_dedup, X, cert, config.body)
    full = k_min_norm_point(K, config.qp)  # every method's queries start from it
    methods = {name: config.span(name) for name in (config.span_method, *config.span_report)}
    own = None  # each head's values, rows and body, for the heads' methods
    if any(method.per_head for method in methods.values()):
        own = heads_phase(k_refit, k_dedup, X, Y, S, m, config)
    bodies = None if own is None else own.bodies
    spans = {
        name: span_estimate(k_span, K, m, method, config.qp, full, bodies)
        for name, method in methods.items()
    }
    chosen = spans[config.span_method]
    scale = jnp.linalg.norm(chosen.point)
    searched = search_problem(problem, config.search_samples)
    cand = search_in_span(k_search, searched, chosen.basis, scale, K, config.search)
    info = {
        "rows_certified": jnp.sum(cert.certified),
        "constraints_kept": jnp.sum(K.valid),
        "min_norm": scale,
        "span_cost": cand.span_cost,
        "candidate_cost": cand.cost,
        "candidates_accepted": cand.accepted_count,
        "accepted": cand.accepted,
    }
    estimates = {
        "crude_sum_w": S0,
        "refined_sum_w": S,
        "certified": cert.certified,
        "certified_token": cert.token,
        "certified_delta": jnp.asarray(config.delta, X.dtype),
        "in_k": K.rows,
        "min_norm_point": chosen.point,
        "span": chosen.basis,
        **{f"span_{name}": spans[name].basis for name in config.span_report},
    }
    if own is not None:
        info["rows_certified_heads"] = jnp.sum(own.certificate.certified)
        estimates.update(
            values=own.values, head_rows=own.bodies.rows, head_token=own.certificate.token
        )
    return cand.fit(monitor, info, estimates)


def describe(config: ChenLiConfig) -> str:
    """What ran: the span method, the candidates and the mode."""
    search = (
        f"certify-and-sculpt (phases 1–5), span by {config.span_method}, {config.candidates} "
        f"candidates × {config.candidate.iterations} it. inside the span"
    )
    if config.candidate.stall_tol is not None:
        search += (
            f" (each stops once {STALL_PATIENCE} iterations in a row lower the cost by < "
            f"{config.candidate.stall_tol:g} relative)"
        )
    if config.mode == "pure":
        return search + ", pure (no polish)"
    return (
        search + f", then a {config.polish.iterations}-it. VarPro polish on all of Θ (the "
        "package's hybrid, not the paper's algorithm)"
    )
