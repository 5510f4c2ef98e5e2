"""The layer is linear in W: the exact least-squares W for given Θ's (variable projection).

For fixed Θ, F(X) = Σ_i Φ_i(X) W_i with Φ_i(X) = A_i(X) X, so stacking the per-head features of
every (sample, token) row gives one least-squares problem ``Z·[W_1; …; W_m] ≈ Y`` for all
heads at once (the design Z: :func:`mhalearn.layer.design`). Shared by variable projection,
alternating minimisation, the baselines and the last phase of the certify-and-sculpt pipeline.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxtyping import Array, Float

from mhalearn.layer import design
from mhalearn.solvers import ridge_solve

__all__ = ["design", "solve_values", "values_and_residual"]


def solve_values(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    theta: Float[Array, "heads dim dim"],
    ridge: float | Array = 1e-10,
) -> Float[Array, "heads dim dim"]:
    """argmin_W Σ_n ‖Σ_i Φ_i(X_n) W_i − Y_n‖²_F + ridge·scale·‖W‖², by Cholesky.

    The (relative) ridge keeps the solve defined when features coincide (identical heads,
    Θ = 0); ``scale`` is the mean diagonal of ZᵀZ.
    """
    return values_and_residual(X, Y, theta, ridge).W


class ValuesFit(NamedTuple):
    """Least-squares values W for fixed attention, and the residual Z·W − Y they leave (rows
    (sample, token))."""

    W: Float[Array, "heads dim dim"]
    residual: Float[Array, "rows dim"]


def values_and_residual(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    theta: Float[Array, "heads dim dim"],
    ridge: float | Array = 1e-10,
) -> ValuesFit:
    """:func:`solve_values` and the residual Z·W − Y it leaves (rows (sample, token)), from
    the same design Z: the layer's outputs without computing the attention again."""
    Z = design(X, theta)
    Y = Y.reshape(-1, Y.shape[-1])
    W = ridge_solve(Z.T @ Z, Z.T @ Y, ridge)
    return ValuesFit(W.reshape(theta.shape[0], theta.shape[1], Y.shape[-1]), Z @ W - Y)
