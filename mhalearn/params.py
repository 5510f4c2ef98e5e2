"""Parameter PyTrees (equinox Modules) for one instance, shapes checked on construction.

Construct them for one instance; stacks over instances come out of ``jax.vmap`` (which
rebuilds the PyTree without re-running the checks).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from mhalearn._validate import check_shapes


class LayerParams(eqx.Module):
    """Parameters of the Chen–Li layer: ``theta`` (Θ_i) and ``W`` (W_i), one per head."""

    theta: Float[Array, "heads dim dim"]
    W: Float[Array, "heads dim dim"]

    def __check_init__(self):
        check_shapes(("theta", self.theta, "heads dim dim"), ("W", self.W, "heads dim dim"))

    @property
    def heads(self) -> int:
        return self.theta.shape[-3]

    @property
    def dim(self) -> int:
        return self.theta.shape[-1]


class ClassifierParams(eqx.Module):
    """Parameters of the classifier family: ``W`` (merged key·query per head), ``U``
    (readout: ``(heads, queries, dim)`` for a matrix readout, ``(heads, dim)`` for a vector
    readout) and an optional trainable ``prompt`` of shape ``(dim,)``."""

    W: Float[Array, "heads dim dim"]
    U: Float[Array, "heads queries dim"] | Float[Array, "heads dim"]
    prompt: Float[Array, " dim"] | None = None

    def __check_init__(self):
        sizes = check_shapes(("W", self.W, "heads dim dim"))
        u_axes = "heads queries dim" if self.U.ndim == 3 else "heads dim"
        check_shapes(("U", self.U, u_axes), **sizes)
        if self.prompt is not None:
            check_shapes(("prompt", self.prompt, "dim"), **sizes)

    @property
    def heads(self) -> int:
        return self.W.shape[-3]

    @property
    def dim(self) -> int:
        return self.W.shape[-1]


def movement(params: PyTree, start: PyTree) -> dict[str, Float[Array, ""]]:
    """‖θ − θ₀‖_F per parameter field (``movement_W``, ``movement_U``, …), absolute and
    relative to ‖θ₀‖_F (``inf`` when the field started at zero and moved)."""
    out = {}
    pairs = zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(start), strict=True)
    for (path, new), old in pairs:
        name = jax.tree_util.keystr(path, simple=True, separator="_")
        moved = jnp.linalg.norm((new - old).ravel())
        out[f"movement_{name}"] = moved
        out[f"movement_{name}_relative"] = moved / jnp.linalg.norm(old.ravel())
    return out
