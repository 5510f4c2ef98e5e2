"""``regimes``: how sharp teacher attention is and how often all heads agree, vs β, heads,
tokens."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from mhalearn._validate import in_range
from mhalearn.batch import Engine
from mhalearn.data import TokenDistribution
from mhalearn.experiments.base import Study, product_grid, register_study, results_dataset
from mhalearn.simulate import InstanceKeys, measure
from mhalearn.teachers import Family, TeacherSpec, sample_teacher_with_info, teacher_diagnostics


@register_study
@dataclasses.dataclass(frozen=True)
class Regimes(Study):
    """Teacher diagnostics (mean max attention, entropy, the share of rows on which every head
    agrees, σ_min(ΣW)/‖ΣW‖, head separation, draws needed) of random teachers.
    Static grid: inputs × heads × tokens; β is swept inside each cell."""

    name = "regimes"
    summary = "teacher attention regimes and head agreement: inputs × heads × tokens, β swept"
    static_axes = ("inputs", "heads", "tokens")
    headline = "agreement"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(beta=(1.0, 4.0), heads=(1, 2), inputs=("boolean",), samples=16, instances=3),
        "small": dict(
            beta=(1.0, 4.0, 16.0),
            heads=(1, 2),
            inputs=("boolean", "gaussian"),
            samples=64,
            instances=4,
        ),
        "full": dict(
            beta=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
            heads=(1, 2, 3, 4),
            inputs=("boolean", "gaussian"),
            samples=512,
            instances=32,
        ),
    }

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
        axes = {"beta": self.beta}
        values, key_ids = product_grid(axes, self.instances)
        spec = TeacherSpec(
            heads=cell["heads"],
            dim=self.dim,
            tokens=cell["tokens"],
            family=self.family,
            inputs=cell["inputs"],
            beta=jnp.asarray(values["beta"], jnp.result_type(float)),
        )
        samples, delta = self.samples, self.delta

        def one(keys: InstanceKeys, spec: TeacherSpec):
            teacher, info = sample_teacher_with_info(keys.problem, spec)
            diag = teacher_diagnostics(keys.evaluate, teacher, spec, samples, delta)
            p = diag.parameters
            metrics = {
                "mean_max_attention": diag.mean_max_attention,
                "attention_entropy": diag.attention_entropy,
                "agreement": diag.agreement,
                "sigma_ratio": p.sigma_ratio,
                "separation": p.separation,
                "theta_sv": p.theta_sv,
                "attempts": info.attempts,
            }
            return {"metrics": metrics, "status": {"teacher_accepted": info.accepted}}

        res = measure(key, one, spec, len(key_ids), key_ids=key_ids, engine=engine)
        return results_dataset(res, axes, self.instances)
