"""Phase 2's certificate in the certify-and-sculpt reconstruction: an output row Y_a that
equals x_bᵀ ΣW for one token value b (identical tokens merged), with a clear gap to every other
distinct token, certifies that every head puts ≥ 1 − δ of row a on b (:func:`certify`);
:func:`certify_values` does it head by head, with each head's values (our extension)."""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, Bool, Float, Int

from mhalearn.learners.chen_li.values import row_scale, value_matches


class Certification(eqx.Module):
    """A row is certified when its residual is at most ``tol`` and its gap to every other
    assignment at least ``gap``, both relative to √dim·‖ΣW‖₂."""

    tol: float | Array = 0.01
    gap: float | Array = 0.3


class Certificate(eqx.Module):
    """The certified rows and the token each head attends to on them."""

    certified: Bool[Array, "samples tokens"]  # row a of sample n is certified
    # the token every head attends to there, or (``certify_values``) each head's token
    token: Int[Array, "samples tokens *heads"]


def certify_values(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    W: Float[Array, "heads dim dim"],
    settings: Certification,
) -> Certificate:
    """Rows whose output is Σ_i x_{b_i}ᵀW_i within ``settings.tol``·scale, with a gap of at
    least ``settings.gap``·scale to every assignment of other token values (scale =
    √dim·‖ΣW‖₂): each head i puts ≥ 1 − δ of the row on its own token b_i (``token``: the
    b_i, last axis the heads)."""
    found = value_matches(X, Y, W)
    scale = row_scale(W.sum(0))
    ok = (found.residual <= settings.tol * scale) & (found.gap >= settings.gap * scale)
    return Certificate(certified=ok, token=found.tokens)


def certify(
    X: Float[Array, "samples tokens dim"],
    Y: Float[Array, "samples tokens dim"],
    S: Float[Array, "dim dim"],
    settings: Certification,
) -> Certificate:
    """Rows whose output is x_bᵀS within ``settings.tol``·scale, with a gap of at least
    ``settings.gap``·scale to every other token value (scale = √dim·‖S‖₂): every head puts
    ≥ 1 − δ of the row on b (:func:`certify_values` with the heads taken as one)."""
    cert = certify_values(X, Y, S[None], settings)
    return Certificate(certified=cert.certified, token=cert.token[..., 0])
