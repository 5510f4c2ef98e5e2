"""Ways of learning a Chen–Li layer or a classifier, one module each, every one a config with
``fit(key, problem, monitor=None) -> Fit`` (:class:`~mhalearn.learners.base.Learner`) and a
registry entry (:mod:`~mhalearn.learners.registry`); their configs are re-exported here (and
at the top level of ``mhalearn``)."""

from mhalearn.learners.base import Fit, Learner, Monitor, Status, Trace, fit_from_history
from mhalearn.learners.baselines import AlternatingConfig, OracleConfig, UniformConfig
from mhalearn.learners.chen_li import ChenLiConfig
from mhalearn.learners.gd import GDConfig, StepCost, step_cost
from mhalearn.learners.registry import LEARNERS, learner_label, make_learner, register_learner
from mhalearn.learners.varpro import VarProConfig

__all__ = [
    "LEARNERS",
    "AlternatingConfig",
    "ChenLiConfig",
    "Fit",
    "GDConfig",
    "Learner",
    "Monitor",
    "OracleConfig",
    "Status",
    "StepCost",
    "Trace",
    "UniformConfig",
    "VarProConfig",
    "fit_from_history",
    "learner_label",
    "make_learner",
    "register_learner",
    "step_cost",
]
