"""Built-in studies: frozen specs that run a grid into an ``xarray.Dataset``.

``STUDIES`` maps each study's name to its spec class; ``DEFAULT`` is what ``mhalearn run``
runs without a name. :func:`run_study` runs one (resuming from a store).
"""

from mhalearn.experiments.base import Engine, Study, run_study
from mhalearn.experiments.heads import Heads
from mhalearn.experiments.margin import Margin
from mhalearn.experiments.recovery import Recovery, learner_configs
from mhalearn.experiments.regimes import Regimes
from mhalearn.experiments.samples import Samples
from mhalearn.experiments.stepsize import StepSize

STUDIES: dict[str, type[Study]] = {
    s.name: s for s in (Recovery, Regimes, Heads, StepSize, Samples, Margin)
}
DEFAULT = "recovery"

__all__ = [
    "DEFAULT",
    "STUDIES",
    "Engine",
    "Heads",
    "Margin",
    "Recovery",
    "Regimes",
    "Samples",
    "StepSize",
    "Study",
    "learner_configs",
    "run_study",
]
