"""``regimes``: how sharp teacher attention is and how often all heads agree, vs β, heads,
tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from mhalearn._validate import in_range
from mhalearn.data import TokenDistribution
from mhalearn.experiments.base import Engine, Study, grid_dataset, product_grid
from mhalearn.teachers import Family, TeacherSpec, sample_teacher_with_info, teacher_diagnostics


@dataclasses.dataclass(frozen=True)
class Regimes(Study):
    """Teacher diagnostics (mean max attention, entropy, the share of rows on which every head
    agrees, σ_min(ΣW)/‖ΣW‖, head separation, draws needed) of random teachers.
    Static grid: inputs × heads × tokens; β is swept inside each cell."""

    name = "regimes"
    summary = "teacher attention regimes and head agreement: inputs × heads × tokens, β swept"
    static_axes = ("inputs", "heads", "tokens")
    headline = "agreement"

    beta: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    """Teacher attention scales ‖Θ_i‖_F ≈ beta, swept inside each cell."""
    heads: tuple[int, ...] = (1, 2, 3)
    """Heads m of the teachers (one cell each)."""
    tokens: tuple[int, ...] = (4,)
    """Sequence lengths k (one cell each)."""
    inputs: tuple[TokenDistribution, ...] = ("boolean", "gaussian")
    """Token distributions (one cell each): uniform on {±1}^d, or standard Gaussian."""
    dim: int = 8
    """Token dimension d."""
    family: Family = "random"
    """Teacher family: random draws, or a stress family that breaks a non-degeneracy check."""
    samples: int = 512
    """Fresh sequences per teacher for the attention statistics."""
    delta: float = 0.1
    """A row agrees when every head puts >= 1 − delta on one token value."""
    instances: int = 32
    """Random teachers per grid point."""
    seed: int = 0
    """Root seed: instance i of every grid point draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
        in_range("delta", self.delta, 0.0, 0.5, open_low=True)
        for h in self.heads:
            for t in self.tokens:
                for b in self.beta:
                    TeacherSpec(heads=h, dim=self.dim, tokens=t, beta=b, family=self.family)

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        spec = TeacherSpec(
            heads=cell["heads"],
            dim=self.dim,
            tokens=cell["tokens"],
            family=self.family,
            inputs=cell["inputs"],
        )
        axes = {"beta": self.beta}
        values, key_ids = product_grid(axes, self.instances)

        def one(key, beta, spec):
            spec = eqx.tree_at(lambda s: s.beta, spec, beta)
            k_teacher, k_stats = jax.random.split(key)
            teacher, info = sample_teacher_with_info(k_teacher, spec)
            diag = teacher_diagnostics(k_stats, teacher, spec, self.samples, self.delta)
            p = diag.parameters
            return {
                "mean_max_attention": diag.mean_max_attention,
                "attention_entropy": diag.attention_entropy,
                "agreement": diag.agreement,
                "sigma_ratio": p.sigma_ratio,
                "separation": p.separation,
                "theta_sv": p.theta_sv,
                "attempts": info.attempts,
                "teacher_accepted": info.accepted,
            }

        beta = jnp.asarray(values["beta"], jnp.result_type(float))
        out = engine.map(one, key, key_ids, beta, spec)
        return grid_dataset(out, axes, self.instances)
