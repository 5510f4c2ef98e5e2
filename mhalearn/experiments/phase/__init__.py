"""``phase``: where learners stop recovering Chen–Li teachers — sample-complexity phase diagrams.

Success vs training samples N, on a log grid in units of the counting limit
N_c = 2·heads·dim/tokens (where the N·tokens·dim equations match the 2·heads·dim² unknowns),
× heads × β (swept inside a cell) × learner × input distribution × dim. Every learner sees the
same teachers and samples (instance i of every cell draws from ``fold_in(key, i)``).

Each failed fit is classified: an **optimisation failure** when its training loss is above the
teacher's by more than ``fit_tol`` (relative to mean(Y²)) — the learner did not fit data the
truth fits — and **non-identified** when it fits the training data as well as the truth does
but its parameters are wrong (the data do not determine the teacher, or the fit found another
solution): computational against statistical failure.

Derived across instances (:meth:`Phase.derive`): the threshold N*₅₀ where the success rate
crosses one half, by a logistic fit in log N (:func:`mhalearn.stats.logistic_crossing`), with a
95% bootstrap interval over teachers (the same resampled teachers for every curve), also as
N*₅₀/N_c; and per learner × inputs × dim × β, N*₅₀/N_c vs heads fitted as a power law and as an
exponential (:func:`mhalearn.stats.growth_fits`).

Its parts: :mod:`~.presets` (grids and named sizes), :mod:`~.study` (the study: cells and
the statistics across them) and :mod:`~.variables` (what its variables mean).
"""

from mhalearn.experiments.phase import variables  # noqa: F401 (declares the variables)
from mhalearn.experiments.phase.presets import (
    DIAGRAM,
    FAMILIES,
    FULL,
    HEADS_RATIOS,
    PRESETS,
    RATIOS,
    SMALL,
)
from mhalearn.experiments.phase.study import (
    GROWTH_AXES,
    STATISTICAL_DIMS,
    THRESHOLD_DIMS,
    Phase,
    critical_samples,
    failure_kinds,
    samples_at,
)

__all__ = [
    "DIAGRAM",
    "FAMILIES",
    "FULL",
    "GROWTH_AXES",
    "HEADS_RATIOS",
    "PRESETS",
    "RATIOS",
    "SMALL",
    "STATISTICAL_DIMS",
    "THRESHOLD_DIMS",
    "Phase",
    "critical_samples",
    "failure_kinds",
    "samples_at",
]
