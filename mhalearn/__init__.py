"""mhalearn: simulate how multi-head attention layers are learned, many instances at once.

The public functional API is re-exported here; everything is written for one sequence or
one instance and batched with ``jax.vmap``. Library code never enables float64: call
``set_precision("float64")`` in your own entry point to opt in.
"""

from mhalearn._version import __version__
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
from mhalearn.layer import Lanes, lanes_loss_and_grad, lay_out, layer_outputs, squared_loss_and_grad
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
    "split_cpu",
    "squared_loss_and_grad",
    "start_point",
    "teacher_diagnostics",
    "tokenized_mixture",
]
