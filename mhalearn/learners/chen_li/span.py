"""Phase 4 of the certify-and-sculpt reconstruction: span{Θ_i} from queries to K.

In place of the paper's membership-oracle queries, a span method (:class:`SpanMethod`, one
class per method, :data:`SPAN_METHODS` by name) queries the convex body K of phase 3 — or, for
the heads' methods (:data:`HEAD_QUERIES`, our extension of the outline), each head's own body
K_i — and :func:`span_estimate` returns the top principal directions of the points it gets;
the ``sculpt`` study measures each method's angle to the truth.

Why these might find the span (our reconstruction, a heuristic): every Θ_i satisfies every
constraint with margin, and as constraints accumulate the directions far from every head are
cut away, so K and its recession cone gather around cone{Θ_i}, up to K's resolution at the
heads; a query built from K alone (a min-norm point, a projection averaged over directions,
the walk's second moments) lands near that cone. Nothing forces it into the span beyond that:
rotating the inputs, x → Ux, turns the K of heads Θ_i into the K of heads UᵀΘ_iU, so the
inputs' symmetry fixes span{Θ_i} only for the U with UᵀΘ_iU = Θ_i (for generic heads, ±I
alone). K need not be symmetric about the span, and a point such as p can sit off it by a bias
that more constraints do not remove.

A single point of K can sit as far off the span as K's own resolution at the heads — how far
a head can turn away from the span and still satisfy every constraint
(:func:`~mhalearn.metrics.recovery.constraint_tilt`, reported as ``k_tilt``); only a method
that averages over many points of K can do better (at one head ``peel`` and ``subsets`` reach
0.4–0.7 times it, notebook 03). Certified rows are those where every head's attention is
nearly one-hot, so their margins in units of ‖Θ_i‖ shrink like 1/β: the span phase needs
sharp attention (measured in notebook 03).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from mhalearn import draws
from mhalearn.learners.chen_li.body import (
    QP,
    Constraints,
    _dual,
    k_min_norm_point,
    min_norm_point,
    project_on_recession_cone,
    qp_body,
)
from mhalearn.solvers import svd


class Query(eqx.Module):
    """What a span method queries: K and its min-norm point p in the queries' precision, the
    problem's precision, the number of heads, the QP settings and the heads' own bodies (for
    the methods of :data:`HEAD_QUERIES`; ``None`` otherwise)."""

    K: Constraints
    point: Float[Array, " params"]
    dtype: Any = eqx.field(static=True)
    heads: int = eqx.field(static=True)
    qp: QP
    bodies: Constraints | None


class SpanEstimate(eqx.Module):
    """An estimate of span{Θ_i} (orthonormal rows) and K's min-norm point p."""

    basis: Float[Array, "heads params"]
    point: Float[Array, " params"]


class SpanMethod(eqx.Module):
    """A way of querying K for span{Θ_i}: :meth:`points` returns the points its ``queries``
    queries reach, and :meth:`basis` their top ``heads`` principal directions (the directions
    of largest second moment about the origin). ``per_head``: the method queries each head's
    own body K_i (:func:`~mhalearn.learners.chen_li.body.head_bodies`)."""

    queries: eqx.AbstractVar[int]
    per_head: ClassVar[bool] = False

    @abc.abstractmethod
    def points(self, key: PRNGKeyArray, query: Query) -> Float[Array, "points params"]:
        """The points the queries reach."""

    def basis(self, key: PRNGKeyArray, query: Query) -> Float[Array, "heads params"]:
        """Orthonormal rows spanning the estimate, in the problem's precision."""
        return principal_directions(self.points(key, query).astype(query.dtype), query.heads)


class Subsets(SpanMethod):
    """The min-norm points of K and of ``queries`` random sub-polyhedra (each constraint kept
    with probability ``fraction``)."""

    queries: int = eqx.field(static=True, default=4)
    fraction: float | Array = 0.5

    def points(self, key, query):
        K, its = query.K, query.qp.iterations
        keep = draws.bernoulli(key, self.fraction, (self.queries, K.valid.shape[0]))
        subsets = jax.vmap(lambda m: min_norm_point(K.G, K.valid & m, K.bound, its))(keep)
        return jnp.concatenate([query.point[None], subsets])


class Recession(SpanMethod):
    """The projections of ``queries`` uniform random directions onto K's recession cone
    {v : G_c·v ≥ 0}, which holds every Θ_i (each satisfies every constraint with margin, so
    does every multiple of it) and, as constraints accumulate, little else."""

    queries: int = eqx.field(static=True, default=64)

    def points(self, key, query):
        K, p = query.K, query.point
        u = draws.normal(key, (self.queries, p.shape[0]), query.dtype)  # alike in every precision
        u = (u / jnp.linalg.norm(u, axis=1, keepdims=True)).astype(p.dtype)
        return jax.vmap(lambda v: project_on_recession_cone(K.G, K.valid, v, query.qp.iterations))(
            u
        )


class Peel(SpanMethod):
    """p, then the min-norm point of K without the constraints active at the last point, and
    so on, ``queries`` times (each round peels the face the last point sat on)."""

    queries: int = eqx.field(static=True, default=8)

    def points(self, key, query):
        K, its = query.K, query.qp.iterations

        def peel(valid, _):
            lam, _ = _dual(K.G, valid, jnp.full(valid.shape, K.bound, K.G.dtype), its)
            point = jnp.where(valid[:, None], K.G, 0.0).T @ lam
            active = lam > 1e-6 * jnp.max(lam)
            return valid & ~active, point

        return jax.lax.scan(peel, K.valid, None, self.queries)[1]


class Samples(SpanMethod):
    """A hit-and-run walk of ``queries`` steps on K ∩ {‖θ‖ ≤ ``radius``·‖p‖} from 2p (the second
    half of its steps): the body's directions of largest extent."""

    queries: int = eqx.field(static=True, default=4096)
    radius: float | Array = 4.0

    def points(self, key, query):
        p = query.point
        walk = hit_and_run(key, query.K, 2 * p, self.radius * jnp.linalg.norm(p), self.queries)
        return walk[self.queries // 2 :]


class Slice(SpanMethod):
    """p itself, and the top ``heads − 1`` principal directions (about their mean) of the points
    of the cross-section of K's recession cone through p/‖p‖ nearest to ``queries`` points at
    distance ``radius`` in uniform random directions (:func:`slice_points`, with the
    ``constraints`` nearest constraints).

    As constraints accumulate the recession cone shrinks towards cone{Θ_i} (a consensus row's
    constraint holds with margin for every head, and for a direction far outside the span
    some certified row violates it), so its cross-section shrinks towards the polytope of the
    heads' directions, widened in every direction by how far a head can turn before some
    certified row's score difference reaches 0 (a width that more rows do not remove:
    certified margins are at least about log((1−δ)/δ), of order 1/β in units of ‖Θ_i‖): that
    polytope's own extent is what principal directions about the mean see first. The angle of
    p itself to the span then bounds the estimate's."""

    queries: int = eqx.field(static=True, default=256)
    radius: float | Array = 30.0
    constraints: int = eqx.field(static=True, default=1024)

    def cross_section(self, key, query) -> tuple[Float[Array, " params"], SlicePoints]:
        """The unit normal p/‖p‖ and the cross-section's points nearest to the targets."""
        p = query.point
        normal = p / jnp.maximum(jnp.linalg.norm(p), jnp.finfo(p.dtype).tiny)
        c = draws.normal(key, (self.queries, normal.shape[0] - 1), query.dtype)
        c = (self.radius * c / jnp.linalg.norm(c, axis=1, keepdims=True)).astype(p.dtype)
        return normal, slice_points(query.K, normal, c, self.constraints, query.qp.iterations)

    def points(self, key, query):
        normal, found = self.cross_section(key, query)
        return normal + found.points @ found.basis.T  # in Θ's coordinates

    def basis(self, key, query):
        normal, found = self.cross_section(key, query)
        w = found.points
        inside = principal_directions(w - w.mean(0), query.heads - 1) @ found.basis.T
        return jnp.concatenate([normal[None], inside]).astype(query.dtype)


class Heads(SpanMethod):
    """The min-norm points p_i of the heads' own bodies K_i (our extension of the outline).

    A row on which the heads attend sharply to *different* tokens (Y_a = Σ_i x_{b_i}ᵀW_i) is no
    consensus row, so K never sees it; with each head's values known it certifies every head's
    own token, and K_i, which holds Θ_i alone, has no other head to stretch towards: each p_i
    is a one-head problem's min-norm point, and span{p_i} the estimate. At two heads and β 4
    split rows are as common as consensus ones or more (``rows_certified_heads`` against
    ``rows_certified``), and K_i's min-norm point need not share the bias by which K's sits
    off the span (the ``sculpt`` study measures both)."""

    queries: int = eqx.field(static=True, default=1)
    per_head: ClassVar[bool] = True

    def points(self, key, query):
        return jax.vmap(lambda B: k_min_norm_point(B, query.qp))(query.bodies)


class HeadsSubsets(SpanMethod):
    """:class:`Heads` with each K_i queried by :class:`Subsets` (its min-norm point and those
    of ``queries`` random sub-polyhedra of it, from a key per head) instead of its min-norm
    point alone: one direction per head, the top principal direction of that head's points
    (our extension). At one head the methods that combine several points of K average some
    of p's error away (0.4–0.7 times K's tilt, notebook 03); each K_i is a one-head body."""

    queries: int = eqx.field(static=True, default=16)
    fraction: float | Array = 0.5
    per_head: ClassVar[bool] = True

    def points(self, key, query):
        one = Subsets(queries=self.queries, fraction=self.fraction)
        keys = jax.random.split(key, query.bodies.bound.shape[0])
        estimate = lambda k, B: span_estimate(k, B, 1, one, query.qp).basis[0]  # noqa: E731
        return jax.vmap(estimate)(keys, query.bodies)


#: the span methods by name
SPAN_METHODS: dict[str, type[SpanMethod]] = {
    "subsets": Subsets,
    "recession": Recession,
    "peel": Peel,
    "samples": Samples,
    "slice": Slice,
    "heads": Heads,
    "heads_subsets": HeadsSubsets,
}
#: the methods that query each head's own body K_i
HEAD_QUERIES = tuple(name for name, method in SPAN_METHODS.items() if method.per_head)


def span_estimate(
    key: PRNGKeyArray,
    K: Constraints,
    heads: int,
    method: SpanMethod,
    qp: QP,
    point: Float[Array, " params"] | None = None,
    bodies: Constraints | None = None,
) -> SpanEstimate:
    """An estimate of span{Θ_i} by ``method``'s queries to K, run in ``qp.products`` and
    returned in K's precision with K's min-norm point p. ``point``: p when already known
    (:func:`~mhalearn.learners.chen_li.body.k_min_norm_point`; several methods on one K share
    it). ``bodies``: the heads' own bodies, which the methods of :data:`HEAD_QUERIES` need."""
    if method.per_head and bodies is None:
        raise ValueError(
            f"span method {type(method).__name__}: give the heads' own bodies (head_bodies)"
        )
    dtype = K.G.dtype
    full = (k_min_norm_point(K, qp) if point is None else point).astype(dtype)
    low = qp_body(K, qp)
    query = Query(
        K=low, point=full.astype(low.G.dtype), dtype=dtype, heads=heads, qp=qp, bodies=bodies
    )
    return SpanEstimate(basis=method.basis(key, query), point=full)


class SlicePoints(eqx.Module):
    """Points w of a cross-section, in the coordinates of v = normal + B w, and B."""

    points: Float[Array, "queries rest"]
    basis: Float[Array, "params rest"]


def hit_and_run(
    key: PRNGKeyArray,
    K: Constraints,
    start: Float[Array, " params"],
    radius: Float[Array, ""],
    steps: int,
) -> Float[Array, "steps params"]:
    """``steps`` points of a hit-and-run walk on K ∩ {‖θ‖ ≤ radius} from ``start``: a uniform
    direction, then a uniform point of the chord through the current point (the chord's ends
    from K's constraints and the ball, in closed form). From a start outside the body (K's
    min-norm point p comes from a finite number of QP iterations, so 2p can miss some
    constraints) the chord is cut to the moves that worsen no violated constraint nor the
    distance outside the ball, so the walk stays where it is or moves towards the body; a
    chord with no such moves keeps the point. (Without the cut, a walk from outside K grew
    without bound, to infinities and NaN: seen in 1–8 of 192 teachers per one-head cell of
    the sculpt study.)"""
    G = jnp.where(K.valid[:, None], K.G, 0.0)

    def step(x, k):
        k_dir, k_pos = jax.random.split(k)
        u = draws.normal(k_dir, x.shape, x.dtype)
        u = u / jnp.linalg.norm(u)
        slack, rate = G @ x - K.bound, G @ u  # slack ≥ 0 on valid rows; invalid rows: rate 0
        ahead = jnp.min(jnp.where(rate < 0, slack / jnp.where(rate < 0, -rate, 1.0), jnp.inf))
        behind = jnp.min(jnp.where(rate > 0, slack / jnp.where(rate > 0, rate, 1.0), jnp.inf))
        xu = x @ u
        half = jnp.sqrt(jnp.maximum(xu**2 - (x @ x - radius**2), 0.0))
        ahead, behind = jnp.minimum(ahead, half - xu), jnp.minimum(behind, half + xu)
        ahead, behind = jnp.maximum(ahead, 0.0), jnp.maximum(behind, 0.0)  # see above
        x = x + (draws.uniform(k_pos, (), x.dtype) * (ahead + behind) - behind) * u
        return x, x

    _, points = jax.lax.scan(step, start, jax.random.split(key, steps))
    return points


def complement_basis(p: Float[Array, " params"]) -> Float[Array, "params rest"]:
    """Orthonormal columns spanning the complement of the unit vector ``p`` (the columns of a
    Householder reflection that maps e₁ to ±p, less the first)."""
    e1 = jnp.zeros_like(p).at[0].set(1.0)
    v = p + jnp.where(p[0] >= 0, 1.0, -1.0) * e1
    H = jnp.eye(p.shape[0], dtype=p.dtype) - 2 * jnp.outer(v, v) / (v @ v)
    return H[:, 1:]


def slice_points(
    K: Constraints,
    normal: Float[Array, " params"],
    targets: Float[Array, "queries rest"],
    keep: int,
    iterations: int,
) -> SlicePoints:
    """The points of the cross-section {v : ⟨v, normal⟩ = 1, G_c·v ≥ 0} of K's recession cone
    nearest to each of ``targets``, in the coordinates w of v = normal + B w (B:
    :func:`complement_basis`); far targets land on its far boundary (near its extreme points
    in their directions). Only the ``keep`` valid constraints with the least normalised slack
    at ``normal`` enter (those that can bind nearby)."""
    B = complement_basis(normal)
    slack = K.G @ normal
    score = jnp.where(K.valid, slack / jnp.linalg.norm(K.G, axis=1).clip(1e-30), jnp.inf)
    near = jnp.argsort(score)[: min(keep, score.shape[0])]
    GB, offset, valid = K.G[near] @ B, slack[near], K.valid[near]

    def project(c):  # nearest w to c with GB·w + offset ≥ 0
        lam, Gt = _dual(GB, valid, -offset - GB @ c, iterations)
        return c + Gt.T @ lam

    return SlicePoints(points=jax.vmap(project)(targets), basis=B)


def principal_directions(points: Float[Array, "points params"], k: int):
    """The top ``k`` right singular vectors of ``points`` (orthonormal rows): the directions
    of largest second moment about the origin."""
    _, _, vt = svd(points)
    return vt[:k]
