"""The certify-and-sculpt pipeline's settings: one flat Module (the learner, as the registry,
the studies and the command build it), grouped by phase, that hands each phase only its own
settings (:attr:`ChenLiConfig.refinement`, :attr:`~ChenLiConfig.certification`, …)."""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, PRNGKeyArray

from mhalearn._validate import choice, in_range, positive_int
from mhalearn.learners.base import Fit, Monitor
from mhalearn.learners.chen_li.body import QP, Body
from mhalearn.learners.chen_li.certify import Certification
from mhalearn.learners.chen_li.pipeline import fit
from mhalearn.learners.chen_li.search import MODES, Search
from mhalearn.learners.chen_li.span import SPAN_METHODS, SpanMethod
from mhalearn.learners.chen_li.values import HeadValues, Refinement
from mhalearn.learners.varpro import VarProConfig
from mhalearn.problems import RegressionProblem


class ChenLiConfig(eqx.Module):
    """The pipeline's settings. ``span_method`` (one of :data:`~.span.SPAN_METHODS`, with
    ``span_queries`` queries, ``None``: the method's own default) chooses how phase 4 queries
    K. ``mode="polished"`` (the default) follows each candidate of the search inside the span
    by a ``polish`` — variable projection on all of Θ — which does the fitting at two heads and
    more; ``mode="pure"`` keeps the search's own result (Θ inside the span, W by least
    squares), so that the convex phases must do the work. ``span_report`` names further span
    methods whose estimates are computed from the same K and returned (``span_<method>`` in
    ``Fit.estimates``, for the ``sculpt`` study); they do not change the fit.
    ``qp_products="float32"`` (the default; ``None``: the problem's precision) runs phase 4 —
    its QPs, projections and walks on K — in float32, 1.5–1.9× faster
    (``benchmarks/pipeline_phases.py``); the points move by ~1e-5 relative, far below what an
    angle to the span resolves.
    ``search_samples`` (``None``: all) limits phase 5 — the search, its least squares and the
    certificate's fit check — to the first that many samples: the convex phases need many
    samples, a local search few, and its cost grows with them.
    ``values_restarts``, ``values_samples`` (``None``: all) and ``values_rounds`` set the
    per-head values' fit of the heads' span methods (:data:`~.span.HEAD_QUERIES`,
    :func:`~.values.head_values`)."""

    # phase 2: ΣW's refinement (and the heads' values)
    refit_rounds: int = eqx.field(static=True, default=30)
    refit_restarts: int = eqx.field(static=True, default=4)
    refit_noise: float | Array = 0.5
    quantile_start: float | Array = 0.5
    quantile_end: float | Array = 0.005
    values_restarts: int = eqx.field(static=True, default=4)
    values_samples: int | None = eqx.field(static=True, default=30_000)
    values_rounds: int = eqx.field(static=True, default=60)
    # phase 2: the certificate
    certify_tol: float | Array = 0.01
    certify_gap: float | Array = 0.3
    # phase 3: the body K and its QPs
    delta: float | Array = 0.1
    max_rows: int = eqx.field(static=True, default=256)
    qp_iterations: int = eqx.field(static=True, default=600)
    qp_products: str | None = eqx.field(static=True, default="float32")
    # phase 4: the span
    span_method: str = eqx.field(static=True, default="subsets")
    span_queries: int | None = eqx.field(static=True, default=None)
    subset_fraction: float | Array = 0.5
    sample_radius: float | Array = 4.0
    slice_radius: float | Array = 30.0
    slice_constraints: int = eqx.field(static=True, default=1024)
    span_report: tuple[str, ...] = eqx.field(static=True, default=())
    # phase 5: the search inside the span
    candidates: int = eqx.field(static=True, default=2)
    candidate: VarProConfig = VarProConfig(iterations=10, restarts=1)
    accept_tol: float | Array = 1e-6
    constraint_slack: float | Array = 0.5
    polish: VarProConfig = VarProConfig(iterations=20, restarts=1)
    mode: str = eqx.field(static=True, default="polished")
    search_samples: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        in_range("delta", self.delta, 0.0, 0.5, open_low=True)
        names = (
            "refit_rounds",
            "refit_restarts",
            "max_rows",
            "qp_iterations",
            "candidates",
            "slice_constraints",
            "values_restarts",
            "values_rounds",
        )
        for name in names:
            positive_int(name, getattr(self, name))
        choice("span_method", self.span_method, tuple(SPAN_METHODS))
        choice("mode", self.mode, MODES)
        if self.qp_products is not None:
            choice("qp_products", self.qp_products, ("float32",))
        if self.span_queries is not None:
            positive_int("span_queries", self.span_queries)
        for name in ("search_samples", "values_samples"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        in_range("sample_radius", self.sample_radius, 2.0, open_low=True)
        in_range("slice_radius", self.slice_radius, 0.0, open_low=True)
        for method in self.span_report:
            choice("span_report", method, tuple(SPAN_METHODS))
        for name in ("quantile_start", "quantile_end", "subset_fraction"):
            in_range(name, getattr(self, name), 0.0, 1.0, open_low=True)

    problems = (RegressionProblem,)

    @property
    def refinement(self) -> Refinement:
        return Refinement(
            rounds=self.refit_rounds,
            restarts=self.refit_restarts,
            noise=self.refit_noise,
            quantile_start=self.quantile_start,
            quantile_end=self.quantile_end,
        )

    @property
    def head_values(self) -> HeadValues:
        return HeadValues(
            restarts=self.values_restarts, samples=self.values_samples, rounds=self.values_rounds
        )

    @property
    def certification(self) -> Certification:
        return Certification(tol=self.certify_tol, gap=self.certify_gap)

    @property
    def body(self) -> Body:
        return Body(delta=self.delta, max_rows=self.max_rows)

    @property
    def qp(self) -> QP:
        return QP(iterations=self.qp_iterations, products=self.qp_products)

    def span(self, name: str | None = None) -> SpanMethod:
        """The span method ``name`` (``None``: ``span_method``) with this config's settings."""
        name = self.span_method if name is None else name
        own = {
            "subsets": dict(fraction=self.subset_fraction),
            "heads_subsets": dict(fraction=self.subset_fraction),
            "samples": dict(radius=self.sample_radius),
            "slice": dict(radius=self.slice_radius, constraints=self.slice_constraints),
        }.get(name, {})
        queries = {} if self.span_queries is None else {"queries": self.span_queries}
        return SPAN_METHODS[name](**queries, **own)

    @property
    def search(self) -> Search:
        return Search(
            candidates=self.candidates,
            candidate=self.candidate,
            polish=self.polish,
            mode=self.mode,
            accept_tol=self.accept_tol,
            constraint_slack=self.constraint_slack,
            samples=self.search_samples,
        )

    def fit(
        self, key: PRNGKeyArray, problem: RegressionProblem, monitor: Monitor | None = None
    ) -> Fit:
        """All phases in order (:func:`~.pipeline.fit`)."""
        return fit(self, key, problem, monitor)
