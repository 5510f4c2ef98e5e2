"""The certify-and-sculpt pipeline in the spirit of Chen & Li — a RECONSTRUCTION.

The paper's algorithm is known here only from its published outline (docs: The science, "What is
sourced and what is reconstructed"); every phase below is our reading of it, one module per
phase so that each can be studied alone, each taking only its own settings, and
:func:`~.pipeline.fit` (:meth:`ChenLiConfig.fit`) chains them:

1. :mod:`~.values` — ΣW ≈ M₀ = mean_n X_nᵀ Y_n (:func:`crude_sum_w`, exact in expectation when
   attention is uniform; poor otherwise), refitted by least squares on the rows that match one
   token best (:func:`refine_sum_w_restarts`); each head's values for the heads' span methods
   (:func:`head_values`).
2. :mod:`~.certify` — an output row Y_a that equals x_bᵀ ΣW for one token value b, with a clear
   gap to every other distinct token, certifies that every head puts ≥ 1 − δ of row a on b.
3. :mod:`~.body` — each certified (row a, token b) gives, for every distinct other token c,
   ⟨Θ, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ), valid for every head: a polyhedron K holding every
   Θ_i, whose minimum-norm point (a QP on the dual, in JAX) lies mostly in span{Θ_i}.
4. :mod:`~.span` — an estimate of span{Θ_i} from queries to K, by one of seven methods
   (:class:`SpanMethod` strategies, :data:`SPAN_METHODS`); the ``sculpt`` study measures each
   one's angle to the truth.
5. :mod:`~.search` — random restarts of variable projection restricted to that span, W by least
   squares, and — in the default ``"polished"`` mode — a joint polish of all of Θ;
   ``mode="pure"`` keeps the search's result. A candidate is accepted only when every head
   satisfies K's constraints and the data are fitted (the certificate).

Every phase reports diagnostics (``Fit.info``); failures are data (``accepted = False``), never
exceptions. The pipeline never reads the teacher: its intermediate estimates (the ΣW estimates,
the certified rows, K's min-norm point, the span) are returned in ``Fit.estimates`` and scored
against the truth by the task (:func:`mhalearn.metrics.recovery.estimate_errors`).
"""

from mhalearn.learners.chen_li.body import (
    QP,
    Body,
    Constraints,
    constraints,
    head_bodies,
    k_min_norm_point,
    min_norm_point,
    project_on_recession_cone,
)
from mhalearn.learners.chen_li.certify import Certificate, Certification, certify, certify_values
from mhalearn.learners.chen_li.config import ChenLiConfig
from mhalearn.learners.chen_li.pipeline import HeadsPhase, describe, fit, heads_phase
from mhalearn.learners.chen_li.search import (
    MODES,
    PURE_STALL,
    Candidate,
    Search,
    satisfies,
    search_in_span,
    search_problem,
)
from mhalearn.learners.chen_li.span import (
    HEAD_QUERIES,
    SPAN_METHODS,
    Heads,
    HeadsSubsets,
    Peel,
    Recession,
    Samples,
    Slice,
    SpanEstimate,
    SpanMethod,
    Subsets,
    complement_basis,
    hit_and_run,
    principal_directions,
    slice_points,
    span_estimate,
)
from mhalearn.learners.chen_li.values import (
    Best,
    HeadValues,
    Matches,
    Refined,
    Refinement,
    crude_sum_w,
    head_values,
    refine_sum_w,
    refine_sum_w_restarts,
    refine_values,
    refine_values_restarts,
    row_matches,
    row_scale,
    smallest_share,
    trimmed_residual,
    value_matches,
)
from mhalearn.learners.registry import register_learner
from mhalearn.learners.varpro import VarProConfig

register_learner("chen_li", lambda steps: ChenLiConfig(), describe)
register_learner(
    "chen_li_pure",
    lambda steps: ChenLiConfig(
        mode="pure",
        candidates=4,
        candidate=VarProConfig(iterations=20, restarts=1, stall_tol=PURE_STALL),
    ),
    describe,
)

__all__ = [
    "HEAD_QUERIES",
    "MODES",
    "PURE_STALL",
    "QP",
    "SPAN_METHODS",
    "Best",
    "Body",
    "Candidate",
    "Certificate",
    "Certification",
    "ChenLiConfig",
    "Constraints",
    "HeadValues",
    "Heads",
    "HeadsPhase",
    "HeadsSubsets",
    "Matches",
    "Peel",
    "Recession",
    "Refined",
    "Refinement",
    "Samples",
    "Search",
    "Slice",
    "SpanEstimate",
    "SpanMethod",
    "Subsets",
    "certify",
    "certify_values",
    "complement_basis",
    "constraints",
    "crude_sum_w",
    "describe",
    "fit",
    "head_bodies",
    "head_values",
    "heads_phase",
    "hit_and_run",
    "k_min_norm_point",
    "min_norm_point",
    "principal_directions",
    "project_on_recession_cone",
    "refine_sum_w",
    "refine_sum_w_restarts",
    "refine_values",
    "refine_values_restarts",
    "row_matches",
    "row_scale",
    "satisfies",
    "search_in_span",
    "search_problem",
    "slice_points",
    "smallest_share",
    "span_estimate",
    "trimmed_residual",
    "value_matches",
]
