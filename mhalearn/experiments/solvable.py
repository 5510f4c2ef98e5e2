"""What the studies of the literature's solvable models share (:mod:`mhalearn.solvable`):
each cell is one task, fitted by the authors' own learner, one instance per teacher."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax

from mhalearn._validate import in_range
from mhalearn.batch import Engine
from mhalearn.experiments.base import Study, results_dataset
from mhalearn.learners.gd import GDConfig
from mhalearn.simulate import simulate


@dataclasses.dataclass(frozen=True)
class SolvableStudy(Study):
    """A study whose cell is :meth:`task` fitted by :meth:`learner` (the authors' training);
    subclasses declare ``lr`` and ``steps`` with the authors' values."""

    def __post_init__(self):
        super().__post_init__()
        in_range("lr", self.lr, 0.0, open_low=True)
        for cell in self.cells():  # every cell's task is checked before any work
            self.task(cell)

    @abc.abstractmethod
    def task(self, cell: dict[str, Any]):
        """The task of one cell."""

    @abc.abstractmethod
    def learner(self) -> GDConfig:
        """The authors' learner."""

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        res = simulate(key, self.task(cell), self.learner(), self.instances, engine=engine)
        return results_dataset(res, {}, self.instances)
