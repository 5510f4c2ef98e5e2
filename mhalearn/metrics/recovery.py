"""How well a student recovered its teacher: head matching, parameter, span and prediction errors.

Everything is for one instance and works under ``jit`` and ``vmap``. The student may have
more heads than the teacher: then each teacher head is matched to one student head and the
parameter errors are over the matched pairs.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int

from mhalearn import draws
from mhalearn.data import same_token
from mhalearn.kernels import attention_weights
from mhalearn.losses import logistic_loss, zero_one_error
from mhalearn.params import LayerParams
from mhalearn.problems import predict_layer
from mhalearn.solvers import least_squares, orthonormal_basis, spectral_norm


def _sq_norm(a: Array, axes=(-2, -1)) -> Array:
    return jnp.sum(a**2, axis=axes)


def _tiny(a: Array) -> Array:
    return jnp.finfo(a.dtype).tiny


def relative_errors(
    estimate: Float[Array, "heads dim dim"], truth: Float[Array, "heads dim dim"]
) -> Float[Array, " heads"]:
    """‖estimate_i − truth_i‖_F / ‖truth_i‖_F for each head."""
    err = _sq_norm(estimate - truth) / jnp.maximum(_sq_norm(truth), _tiny(truth))
    return jnp.sqrt(err)


def matching_cost(
    student: LayerParams, teacher: LayerParams
) -> Float[Array, "student_heads teacher_heads"]:
    """Cost of pairing student head i with teacher head j: the sum of the squared relative
    Frobenius errors of Θ and W."""
    cost = jnp.zeros((student.theta.shape[0], teacher.theta.shape[0]), student.theta.dtype)
    for est, true in ((student.theta, teacher.theta), (student.W, teacher.W)):
        diff = _sq_norm(est[:, None] - true[None, :])
        cost = cost + diff / jnp.maximum(_sq_norm(true), _tiny(true))[None, :]
    return cost


class Pairing(NamedTuple):
    """Matched heads: ``student[j]`` is paired with ``teacher[j]``, sorted by teacher head."""

    student: Int[Array, " teacher_heads"]
    teacher: Int[Array, " teacher_heads"]


class Margins(NamedTuple):
    """x_aᵀΘ(x_b − x_c) per sample, row a and token c, and whether token c's value differs
    from x_b's (the constraints a certified row gives)."""

    margins: Float[Array, "samples tokens tokens"]
    other: Bool[Array, "samples tokens tokens"]


#: most pairings :func:`match_heads` enumerates; beyond, it solves the assignment (optax)
ENUMERATED_PAIRINGS = 24


def match_heads(student: LayerParams, teacher: LayerParams) -> Pairing:
    """The pairing of teacher heads with distinct student heads of least total
    :func:`matching_cost`.

    Returns the :class:`Pairing` (student_idx, teacher_idx), sorted by teacher head; needs
    student heads >= teacher heads. Up to :data:`ENUMERATED_PAIRINGS` pairings (four heads)
    every one is scored and the first best kept — a program XLA compiles in a fifth of the
    time of the assignment solver's loop, and every recovery study compiles it; more heads
    are matched by the Hungarian algorithm (optax).
    """
    s, t = student.theta.shape[0], teacher.theta.shape[0]
    if s < t:
        raise ValueError(f"student heads must be >= teacher heads to match, received {s} < {t}")
    cost = matching_cost(student, teacher)
    if math.perm(s, t) <= ENUMERATED_PAIRINGS:
        pairings = np.array(list(itertools.permutations(range(s), t)), dtype=np.int32)
        best = jnp.argmin(jnp.sum(cost[pairings, np.arange(t)], axis=1))
        return Pairing(jnp.asarray(pairings)[best], jnp.arange(t, dtype=jnp.int32))
    rows, cols = optax.assignment.hungarian_algorithm(cost)
    order = jnp.argsort(cols)
    return Pairing(rows[order], cols[order])


def largest_principal_angle(
    basis_of: Float[Array, "k n"], within: Float[Array, "l n"]
) -> Float[Array, ""]:
    """Largest principal angle (radians) between span(rows of ``basis_of``) and its projection
    on span(rows of ``within``): 0 when the first span lies inside the second, π/2 when some
    direction of it is orthogonal to the second (always so when l < k).

    Computed from sines (‖(I − P)Q‖₂) rather than cosines, so small angles are accurate.
    """
    q_a = orthonormal_basis(basis_of.T)
    q_b = orthonormal_basis(within.T)
    residual = q_a - q_b @ (q_b.T @ q_a)
    sine = spectral_norm(residual)
    return jnp.arcsin(jnp.clip(sine, 0.0, 1.0))


class ParameterErrors(eqx.Module):
    """A student's errors against its teacher, heads matched (:func:`match_heads`); every
    error is relative, ‖X̂ − X‖_F / ‖X‖_F per head."""

    theta_error_max: Float[Array, ""]
    """The largest matched head's Θ error."""
    theta_error_mean: Float[Array, ""]
    """The mean over heads of the matched Θ errors."""
    w_error_max: Float[Array, ""]
    """The largest matched head's W error."""
    w_error_mean: Float[Array, ""]
    """The mean over heads of the matched W errors."""
    sum_w_error: Float[Array, ""]
    """‖ΣŴ − ΣW‖_F / ‖ΣW‖_F over all heads (needs no matching)."""
    span_angle: Float[Array, ""]
    """The largest principal angle (rad) between span{Θ_i} and span{Θ̂_i}."""


def parameter_errors(student: LayerParams, teacher: LayerParams) -> ParameterErrors:
    """The errors of ``student`` against ``teacher`` (same number of heads), with the heads
    matched at the least total error.

    Args:
        student: the fitted layer.
        teacher: the true layer.

    Returns:
        A :class:`ParameterErrors` of scalars.
    """
    s_idx, t_idx = match_heads(student, teacher)
    theta_err = relative_errors(student.theta[s_idx], teacher.theta[t_idx])
    w_err = relative_errors(student.W[s_idx], teacher.W[t_idx])
    sum_true = jnp.sum(teacher.W, axis=0)
    sum_err = jnp.sqrt(
        _sq_norm(jnp.sum(student.W, axis=0) - sum_true)
        / jnp.maximum(_sq_norm(sum_true), _tiny(sum_true))
    )
    flat = lambda a: a.reshape(a.shape[0], -1)  # noqa: E731
    return ParameterErrors(
        theta_error_max=jnp.max(theta_err),
        theta_error_mean=jnp.mean(theta_err),
        w_error_max=jnp.max(w_err),
        w_error_mean=jnp.mean(w_err),
        sum_w_error=sum_err,
        span_angle=largest_principal_angle(flat(teacher.theta), flat(student.theta)),
    )


def prediction_error(
    student: LayerParams, teacher: LayerParams, X: Float[Array, "n tokens dim"]
) -> Float[Array, ""]:
    """Normalised prediction error Σ_n ‖F̂(X_n) − F(X_n)‖²_F / Σ_n ‖F(X_n)‖²_F."""
    truth = predict_layer(teacher, X)
    err = jnp.sum((predict_layer(student, X) - truth) ** 2)
    return err / jnp.maximum(jnp.sum(truth**2), _tiny(truth))


def certified_soundness(
    X: Float[Array, "samples tokens dim"],
    certified: Bool[Array, "samples tokens"],
    token: Int[Array, "samples tokens"],
    theta: Float[Array, "heads dim dim"],
    delta: Float[Array, ""],
) -> Float[Array, ""]:
    """Share of certified rows (row a of sample n, certified to attend to token ``token``) on
    which every true head puts at least 1 − δ on that token's *value* (identical tokens
    merged); NaN when no row is certified."""
    A = jax.vmap(attention_weights, in_axes=(0, None))(X, theta)  # (n, heads, a, c)
    value = jnp.take_along_axis(same_token(X), token[..., None], axis=1)  # (n, a, c)
    on_value = jnp.einsum("nhac,nac->nha", A, value.astype(A.dtype))
    good = jnp.all(on_value >= 1 - delta, axis=1)
    n_cert = jnp.sum(certified)
    return jnp.where(n_cert > 0, jnp.sum(good & certified) / jnp.maximum(n_cert, 1), jnp.nan)


def constraint_margins(
    X: Float[Array, "samples tokens dim"],
    token: Int[Array, "samples tokens"],
    theta: Float[Array, "dim dim"],
) -> Margins:
    """x_aᵀΘ(x_b − x_c) for every row a (b = ``token[n, a]``) and token c of sample n, and
    whether token c's value differs from x_b's (the constraints a certified row gives)."""
    scores = jnp.einsum("nad,de,nce->nac", X, theta, X)  # x_aᵀΘ x_c
    margins = jnp.take_along_axis(scores, token[..., None], axis=-1) - scores
    other = ~jnp.take_along_axis(same_token(X), token[..., None], axis=1)  # (n, a, c)
    return Margins(margins, other)


def truth_in_constraints(
    X: Float[Array, "samples tokens dim"],
    rows: Bool[Array, "samples tokens"],
    token: Int[Array, "samples tokens"],
    theta: Float[Array, "heads dim dim"],
    delta: Float[Array, ""],
) -> Bool[Array, ""]:
    """Whether every head satisfies the constraints of every row in ``rows`` (row a of sample
    n, certified to attend to token ``token``): x_aᵀΘ_i(x_b − x_c) ≥ log((1−δ)/δ) for every
    token c whose value differs from x_b's. True when ``rows`` is empty."""
    margins, other = jax.vmap(constraint_margins, in_axes=(None, None, 0))(X, token, theta)
    ok = (margins >= jnp.log((1 - delta) / delta)) | ~other
    return jnp.all(ok | ~rows[None, :, :, None])


def constraint_tilt(
    X: Float[Array, "samples tokens dim"],
    rows: Bool[Array, "samples tokens"],
    token: Int[Array, "samples tokens"],
    theta: Float[Array, "heads dim dim"],
    delta: Float[Array, ""],
    directions: Float[Array, "directions dim dim"],
) -> Float[Array, "heads directions"]:
    """How far each head can tilt inside the polyhedron K of the rows' constraints (those of
    :func:`truth_in_constraints`): for each direction E, made orthogonal to span{Θ_i} and of
    unit norm (Ê), the angle atan(s) of the largest s ≥ 0 with Θ_i + s‖Θ_i‖Ê still satisfying
    every constraint — π/2 when none bounds it, 0 when Θ_i itself violates one. The resolution
    of K at the heads: a head tilted that far is as consistent with the certified rows as the
    head itself, so a span estimate built from K alone has nothing that places it closer."""
    heads = theta.shape[0]
    flat = theta.reshape(heads, -1)
    q = orthonormal_basis(flat.T)
    E = directions.reshape(directions.shape[0], -1)
    E = E - (E @ q) @ q.T
    E = E / jnp.maximum(jnp.linalg.norm(E, axis=1, keepdims=True), _tiny(E))
    E = E.reshape(directions.shape)
    slack, other = jax.vmap(constraint_margins, in_axes=(None, None, 0))(X, token, theta)
    slack = slack - jnp.log((1 - delta) / delta)  # (heads, n, a, c)
    valid = other[0] & rows[..., None]
    norms = jnp.linalg.norm(flat, axis=1)

    def one(direction):  # (heads,)
        rate, _ = constraint_margins(X, token, direction)
        binds = valid & (rate < 0)
        ratio = slack / jnp.where(binds, -rate, 1.0)
        s = jnp.min(jnp.where(binds, ratio, jnp.inf), axis=(1, 2, 3))
        s = jnp.where(jnp.any(valid & (slack < 0), axis=(1, 2, 3)), 0.0, s)
        return jnp.arctan(jnp.maximum(s, 0.0) / jnp.maximum(norms, _tiny(norms)))

    return jax.lax.map(one, E).T


#: random directions (fixed) along which :func:`estimate_errors` measures K's tilt at the heads
TILT_DIRECTIONS = 16


def estimate_errors(
    estimates: dict[str, Array], teacher: LayerParams, X: Float[Array, "samples tokens dim"]
) -> dict[str, Float[Array, ""]]:
    """The errors of a learner's estimates of the truth's quantities, for those it reports:

    - ``crude_sum_w``, ``refined_sum_w`` (ΣW estimates) → ``*_error``: relative Frobenius error;
    - ``span`` (rows spanning an estimate of span{Θ_i}) → ``span_angle_estimate``: the largest
      principal angle from span{Θ_i} to it; likewise ``span_<method>`` → ``span_angle_<method>``
      (further estimates reported beside the one used);
    - ``values`` (each head's W_i, in any order of the heads) → ``values_error``: the largest
      relative Frobenius error of a head's values, the heads paired by :func:`match_heads` on
      the values alone; with ``head_rows`` (each estimated head's certified rows whose
      constraints its own body K_i holds, heads first) and ``head_token`` (each row's token
      per estimated head, heads last) → ``truth_in_head_bodies``: 1 when every true head
      satisfies every constraint of the body of the estimated head it is paired with;
    - ``min_norm_point`` (a flattened Θ) → ``min_norm_in_span``: the share of its norm inside
      span{Θ_i};
    - ``certified``, ``certified_token``, ``certified_delta`` (certified rows) →
      ``certified_sound``: :func:`certified_soundness`; with ``in_k`` (the certified rows whose
      constraints a convex body K holds) → ``truth_in_k``: 1 when every true head satisfies every
      one of them, ⟨Θ_i, x_a(x_b − x_c)ᵀ⟩ ≥ log((1−δ)/δ) for every token c of another value;
      and ``k_tilt``: the median over heads and :data:`TILT_DIRECTIONS` fixed random directions
      of :func:`constraint_tilt` (K's resolution at the heads, radians).
    """
    sum_true = jnp.sum(teacher.W, axis=0)
    flat = teacher.theta.reshape(teacher.theta.shape[0], -1)
    out = {}
    for name in ("crude_sum_w", "refined_sum_w"):
        if name in estimates:
            out[f"{name}_error"] = jnp.linalg.norm(estimates[name] - sum_true) / jnp.maximum(
                jnp.linalg.norm(sum_true), _tiny(sum_true)
            )
    for name, value in estimates.items():
        if name == "span":
            out["span_angle_estimate"] = largest_principal_angle(flat, value)
        elif name.startswith("span_"):
            out[f"span_angle_{name[5:]}"] = largest_principal_angle(flat, value)
    if "values" in estimates:
        values = estimates["values"]
        alone = lambda W: LayerParams(theta=jnp.zeros_like(W), W=W)  # noqa: E731
        est, true = match_heads(alone(values), alone(teacher.W))
        out["values_error"] = jnp.max(relative_errors(values[est], teacher.W[true]))
        if "head_rows" in estimates:
            inside = jax.vmap(
                lambda rows, token, theta: truth_in_constraints(
                    X, rows, token, theta[None], estimates["certified_delta"]
                )
            )
            tokens = jnp.moveaxis(estimates["head_token"], -1, 0)
            out["truth_in_head_bodies"] = jnp.all(
                inside(estimates["head_rows"][est], tokens[est], teacher.theta[true])
            )
    if "min_norm_point" in estimates:
        point = estimates["min_norm_point"]
        inside = flat.T @ least_squares(flat.T, point)
        out["min_norm_in_span"] = jnp.linalg.norm(inside) / jnp.maximum(
            jnp.linalg.norm(point), _tiny(point)
        )
    if "certified" in estimates:
        out["certified_sound"] = certified_soundness(
            X,
            estimates["certified"],
            estimates["certified_token"],
            teacher.theta,
            estimates["certified_delta"],
        )
    if "in_k" in estimates:
        out["truth_in_k"] = truth_in_constraints(
            X,
            estimates["in_k"],
            estimates["certified_token"],
            teacher.theta,
            estimates["certified_delta"],
        )
        d = X.shape[-1]
        directions = draws.normal(jax.random.key(0), (TILT_DIRECTIONS, d, d), X.dtype)
        tilt = constraint_tilt(
            X,
            estimates["in_k"],
            estimates["certified_token"],
            teacher.theta,
            estimates["certified_delta"],
            directions,
        )
        out["k_tilt"] = jnp.median(tilt)
    return out


def success(errors: ParameterErrors, tol: float | Array) -> Bool[Array, ""]:
    """Recovered: every matched Θ_i and W_i within relative error ``tol``."""
    return jnp.maximum(errors.theta_error_max, errors.w_error_max) <= tol


class ClassificationErrors(eqx.Module):
    """A classifier's losses on labelled samples."""

    loss: Float[Array, ""]
    """The mean logistic loss."""
    error: Float[Array, ""]
    """The 0-1 error: the share of samples whose score's sign is not the label."""


def classification_errors(
    scores: Float[Array, " n"], y: Float[Array, " n"]
) -> ClassificationErrors:
    """The mean logistic loss and the 0-1 error of ``scores`` against labels ``y`` in ±1."""
    return ClassificationErrors(loss=logistic_loss(scores, y), error=zero_one_error(scores, y))
