"""Built-in studies: frozen specs that run a grid into an ``xarray.Dataset``.

Each study is one module that defines its spec (grid, presets, variables) and registers it
with :func:`register_study`; ``STUDIES`` maps every registered name to its class, ``DEFAULT``
is what ``mhalearn run`` runs without a name. :func:`run_study` runs one (resuming from a
store); an :class:`Executor` runs its cells as SLURM jobs or local processes. Studies compute
and never plot: :func:`mhalearn.experiments.figures.plot` draws any study's results with its
figure module.
"""

from mhalearn.experiments.aim import AIM
from mhalearn.experiments.attention_phase import AttentionPhase
from mhalearn.experiments.base import STUDIES, Study, register_study, run_study
from mhalearn.experiments.executors import Executor
from mhalearn.experiments.heads import Heads
from mhalearn.experiments.margin import Margin
from mhalearn.experiments.max_margin import MaxMargin
from mhalearn.experiments.phase import Phase
from mhalearn.experiments.recovery import Recovery
from mhalearn.experiments.regimes import Regimes
from mhalearn.experiments.samples import Samples
from mhalearn.experiments.sculpt import Sculpt
from mhalearn.experiments.stepsize import StepSize

DEFAULT = "phase"
"""The study ``mhalearn run`` runs without a name."""

__all__ = [
    "AIM",
    "DEFAULT",
    "STUDIES",
    "AttentionPhase",
    "Executor",
    "Heads",
    "Margin",
    "MaxMargin",
    "Phase",
    "Recovery",
    "Regimes",
    "Samples",
    "Sculpt",
    "StepSize",
    "Study",
    "register_study",
    "run_study",
]
