"""mhalearn: simulate how multi-head attention layers are learned, many instances at once.

The public functional API is re-exported here; everything is written for one sequence or
one instance and batched with ``jax.vmap``. Library code never enables float64: call
``set_precision("float64")`` in your own entry point to opt in.

The names are bound on first use (``mhalearn.mha`` imports ``mhalearn.kernels`` then), so
that ``import mhalearn`` and the command's parsing do not import JAX.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhalearn._version import __version__

if TYPE_CHECKING:  # the exports, bound on first use by __getattr__ below
    from mhalearn.batch import (
        Engine,
        enable_compilation_cache,
        map_instances,
        set_precision,
        split_cpu,
    )
    from mhalearn.data import (
        Mixture,
        MixtureSpec,
        boolean_tokens,
        gaussian_tokens,
        sample_tokens,
        tokenized_mixture,
    )
    from mhalearn.instances import PerInstance
    from mhalearn.kernels import (
        ClassifierSpec,
        attention_weights,
        classifier_attention,
        classifier_score,
        head_features,
        head_scale,
        mha,
    )
    from mhalearn.layer import (
        Lanes,
        lanes_loss_and_grad,
        lay_out,
        layer_outputs,
        squared_loss_and_grad,
    )
    from mhalearn.learners import (
        AlternatingConfig,
        ChenLiConfig,
        Fit,
        GDConfig,
        Learner,
        OracleConfig,
        UniformConfig,
        VarProConfig,
    )
    from mhalearn.metrics.recovery import (
        ParameterErrors,
        match_heads,
        parameter_errors,
        prediction_error,
    )
    from mhalearn.params import ClassifierParams, LayerParams
    from mhalearn.problems import (
        ClassificationProblem,
        ClassifierStart,
        GivenStart,
        Problem,
        RegressionProblem,
        RegressionStart,
        prepared,
        start_point,
    )
    from mhalearn.restarts import simulate_starts
    from mhalearn.simulate import InstanceKeys, Results, measure, simulate
    from mhalearn.tasks import ClassificationTask, RegressionTask, Task, UserTask
    from mhalearn.teachers import (
        FAMILIES,
        ParameterDiagnostics,
        TeacherDiagnostics,
        TeacherInfo,
        TeacherSpec,
        attention_statistics,
        draw_teacher,
        parameter_diagnostics,
        passes_checks,
        sample_teacher,
        sample_teacher_with_info,
        teacher_diagnostics,
    )

__all__ = [
    "FAMILIES",
    "AlternatingConfig",
    "ChenLiConfig",
    "ClassificationProblem",
    "ClassificationTask",
    "ClassifierParams",
    "ClassifierSpec",
    "ClassifierStart",
    "Engine",
    "Fit",
    "GDConfig",
    "GivenStart",
    "InstanceKeys",
    "Lanes",
    "LayerParams",
    "Learner",
    "Mixture",
    "MixtureSpec",
    "OracleConfig",
    "ParameterDiagnostics",
    "ParameterErrors",
    "PerInstance",
    "Problem",
    "RegressionProblem",
    "RegressionStart",
    "RegressionTask",
    "Results",
    "Task",
    "TeacherDiagnostics",
    "TeacherInfo",
    "TeacherSpec",
    "UniformConfig",
    "UserTask",
    "VarProConfig",
    "__version__",
    "attention_statistics",
    "attention_weights",
    "boolean_tokens",
    "classifier_attention",
    "classifier_score",
    "draw_teacher",
    "enable_compilation_cache",
    "gaussian_tokens",
    "head_features",
    "head_scale",
    "lanes_loss_and_grad",
    "lay_out",
    "layer_outputs",
    "map_instances",
    "match_heads",
    "measure",
    "mha",
    "parameter_diagnostics",
    "parameter_errors",
    "passes_checks",
    "prediction_error",
    "prepared",
    "sample_teacher",
    "sample_teacher_with_info",
    "sample_tokens",
    "set_precision",
    "simulate",
    "simulate_starts",
    "split_cpu",
    "squared_loss_and_grad",
    "start_point",
    "teacher_diagnostics",
    "tokenized_mixture",
]


@functools.cache
def _homes() -> dict[str, str]:
    """Each export's module, read from the imports under ``TYPE_CHECKING`` above."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


class _Package(types.ModuleType):
    """The package module: an export's name is never shadowed by a submodule of the same
    name (``mhalearn.simulate`` is the function, as ``from mhalearn import simulate``)."""

    def __getattr__(self, name: str) -> Any:
        home = _homes().get(name)
        if home is None:
            raise AttributeError(f"module 'mhalearn' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        types.ModuleType.__setattr__(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _homes():
            self.__dict__.pop(name, None)  # the import system binding the submodule
            return
        types.ModuleType.__setattr__(self, name, value)

    def __dir__(self) -> list[str]:
        return sorted({*globals(), *__all__})


sys.modules[__name__].__class__ = _Package
