"""Ways of learning a Chen–Li layer or a classifier, one module each, all with the signature
``fit(key, problem, config) -> Fit``; their configs are re-exported here (and at the top
level of ``mhalearn``)."""

from mhalearn.learners.base import Fit, Status, Trace
from mhalearn.learners.baselines import AlternatingConfig, OracleConfig, UniformConfig
from mhalearn.learners.chen_li import ChenLiConfig
from mhalearn.learners.gd import GDConfig
from mhalearn.learners.varpro import VarProConfig

__all__ = [
    "AlternatingConfig",
    "ChenLiConfig",
    "Fit",
    "GDConfig",
    "OracleConfig",
    "Status",
    "Trace",
    "UniformConfig",
    "VarProConfig",
]
