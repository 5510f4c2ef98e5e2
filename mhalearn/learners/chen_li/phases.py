"""The pipeline's phases, each compiled on its own, for timing them one by one (the ``sculpt``
study and ``benchmarks/pipeline_phases.py``; :func:`~.pipeline.fit` compiles them as one)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from mhalearn.learners.chen_li.body import constraints
from mhalearn.learners.chen_li.certify import certify
from mhalearn.learners.chen_li.pipeline import heads_phase
from mhalearn.learners.chen_li.search import search_in_span, search_problem
from mhalearn.learners.chen_li.span import span_estimate
from mhalearn.learners.chen_li.values import crude_sum_w, refine_sum_w_restarts


@eqx.filter_jit
def sum_w_phase(key, problem, config):
    """Phases 1–2: the refined ΣW."""
    X, Y = problem.X, problem.Y
    return refine_sum_w_restarts(key, X, Y, crude_sum_w(X, Y), config.refinement).estimate


@eqx.filter_jit
def certify_phase(key, problem, S, config):
    """Phase 3: the certificate and K."""
    cert = certify(problem.X, problem.Y, S, config.certification)
    return constraints(key, problem.X, cert, config.body)


@eqx.filter_jit
def span_phase(key, K, heads, config, point=None, bodies=None):
    """Phase 4: the span estimate of ``config.span_method`` (basis, K's min-norm point), the
    point computed when not given (``bodies``: the heads' own bodies, for the methods of
    ``HEAD_QUERIES``)."""
    return span_estimate(key, K, heads, config.span(), config.qp, point, bodies)


@eqx.filter_jit
def head_bodies_phase(key, problem, S, heads, config):
    """The heads' methods' own phase: each head's values, its certified rows and its
    body K_i (as :meth:`~mhalearn.learners.chen_li.ChenLiConfig.fit` draws them)."""
    return heads_phase(key, key, problem.X, problem.Y, S, heads, config).bodies


@eqx.filter_jit
def search_phase(key, problem, basis, point, K, config):
    """Phase 5: the search inside the span."""
    problem = search_problem(problem, config.search_samples)
    return search_in_span(key, problem, basis, jnp.linalg.norm(point), K, config.search)
