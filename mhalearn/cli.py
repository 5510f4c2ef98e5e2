"""The ``mhalearn`` command.

``mhalearn run`` samples random Chen–Li teachers in one vmapped call and prints their
diagnostics as a table. Bad arguments and invalid configs end with a one-line message and
exit code 2.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Literal

import tyro

from mhalearn.data import TokenDistribution
from mhalearn.teachers import Family


@dataclasses.dataclass(frozen=True)
class Run:
    """Sample random Chen–Li teachers and print their diagnostics."""

    heads: int = 2
    dim: int = 8
    tokens: int = 4
    beta: float = 4.0
    family: Family = "random"
    inputs: TokenDistribution = "boolean"
    teachers: int = 8
    """Number of teachers, sampled side by side in one vmapped call."""
    samples: int = 512
    """Fresh input sequences per teacher for the attention statistics."""
    delta: float = 0.1
    """A row agrees when every head puts >= 1 - delta on one token value."""
    seed: int = 0
    precision: Literal["float32", "float64"] = "float32"


_COLUMNS = (
    ("attempts", "{:>8d}"),
    ("w_norm", "{:>8.3f}"),
    ("separation", "{:>10.3f}"),
    ("sigma_ratio", "{:>11.4f}"),
    ("theta_sv", "{:>8.3f}"),
    ("sum_w_norm", "{:>10.3f}"),
    ("max_attn", "{:>8.3f}"),
    ("entropy", "{:>8.3f}"),
    ("agreement", "{:>9.4f}"),
)


def run(cfg: Run) -> None:
    import jax

    if cfg.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import numpy as np

    from mhalearn._validate import positive_int
    from mhalearn.teachers import TeacherSpec, sample_teacher_with_info, teacher_diagnostics

    positive_int("teachers", cfg.teachers)
    spec = TeacherSpec(
        heads=cfg.heads,
        dim=cfg.dim,
        tokens=cfg.tokens,
        beta=cfg.beta,
        family=cfg.family,
        inputs=cfg.inputs,
    )

    @jax.jit
    def one(key):
        teacher, info = sample_teacher_with_info(jax.random.fold_in(key, 0), spec)
        diag = teacher_diagnostics(
            jax.random.fold_in(key, 1), teacher, spec, cfg.samples, cfg.delta
        )
        return info, diag

    root = jax.random.key(cfg.seed)
    start = time.perf_counter()
    keys = jax.vmap(lambda i: jax.random.fold_in(root, i))(np.arange(cfg.teachers))
    info, diag = jax.block_until_ready(jax.vmap(one)(keys))
    elapsed = time.perf_counter() - start

    p = diag.parameters
    table = {
        "attempts": info.attempts,
        "w_norm": p.w_norm,
        "separation": p.separation,
        "sigma_ratio": p.sigma_ratio,
        "theta_sv": p.theta_sv,
        "sum_w_norm": p.sum_w_norm,
        "max_attn": diag.mean_max_attention,
        "entropy": diag.attention_entropy,
        "agreement": diag.agreement,
    }
    table = {k: np.asarray(v) for k, v in table.items()}
    print(
        f"{cfg.teachers} teachers: heads={cfg.heads} dim={cfg.dim} tokens={cfg.tokens} "
        f"beta={cfg.beta} family={cfg.family} inputs={cfg.inputs} seed={cfg.seed} "
        f"({cfg.precision}, {jax.devices()[0].platform}, {elapsed:.2f}s)"
    )
    header = " ".join(f"{name:>{len(fmt.format(0))}}" for name, fmt in _COLUMNS)
    print(f"{'teacher':>7} {header}")
    for i in range(cfg.teachers):
        cells = " ".join(fmt.format(table[name][i].item()) for name, fmt in _COLUMNS)
        print(f"{i:>7d} {cells}")
    medians = " ".join(
        fmt.format(np.median(table[name]).item()) if name != "attempts" else f"{'':>8}"
        for name, fmt in _COLUMNS
    )
    print(f"{'median':>7} {medians}")
    rejected = int(np.sum(~np.asarray(info.accepted)))
    if rejected:
        print(f"warning: {rejected} teacher(s) failed the checks in {spec.max_attempts} draws")


def main(argv: Sequence[str] | None = None) -> int:
    command = tyro.extras.subcommand_cli_from_dict(
        {"run": Run}, prog="mhalearn", description=__doc__.splitlines()[0], args=argv
    )
    try:
        run(command)
    except ValueError as err:
        print(f"mhalearn: error: {err}", file=sys.stderr)
        return 2
    return 0
