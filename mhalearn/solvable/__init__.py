"""Solvable attention models of the literature, as tasks like the package's own (batched, any
learner that fits their problems applies), each defined exactly as its authors' code defines
it: :mod:`~.aim` (the attention-indexed model) and :mod:`~.positional` (the positional–semantic
transition)."""

from mhalearn.solvable.aim import AIMParams, AIMProblem, AIMTask, aim_matrix, aim_mse, aim_outputs
from mhalearn.solvable.positional import (
    POSITIONAL_MAPS,
    STARTS,
    PositionalSemanticProblem,
    PositionalSemanticTask,
    QueryParams,
    dot_attention,
    linear_baseline,
    overlaps,
    positions,
    teacher_outputs,
)

__all__ = [
    "POSITIONAL_MAPS",
    "STARTS",
    "AIMParams",
    "AIMProblem",
    "AIMTask",
    "PositionalSemanticProblem",
    "PositionalSemanticTask",
    "QueryParams",
    "aim_matrix",
    "aim_mse",
    "aim_outputs",
    "dot_attention",
    "linear_baseline",
    "overlaps",
    "positions",
    "teacher_outputs",
]
