"""The learners a study can name: one entry per name, registered next to each learner.

An entry makes the learner's config at a study's step budget and says what it runs (for
legends and captions). Built-in learners register themselves in their modules; your own learner
is registered the same way, and every study that takes learner names (``recovery``) and the
command then accept it::

    register_learner("mine", lambda steps: MyConfig(steps=steps), lambda c: f"mine, {c.steps}")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mhalearn._validate import choice
from mhalearn.learners.base import Learner


@dataclasses.dataclass(frozen=True)
class LearnerEntry:
    make: Callable[[int], Learner]  # the config at a study's step budget (steps)
    describe: Callable[[Learner], str]  # what that config runs, with its budget


LEARNERS: dict[str, LearnerEntry] = {}
"""Every registered learner by name: the built-in ones and any registered since."""


def register_learner(
    name: str,
    make: Callable[[int], Learner],
    describe: Callable[[Learner], str],
    replace: bool = False,
) -> None:
    """Make ``name`` a learner studies can run: ``make(steps)`` builds its config (``steps``:
    the study's budget for step-based learners) and ``describe(config)`` says what it runs.
    Registering a taken name again raises unless ``replace``."""
    if not name.isidentifier():
        raise ValueError(f"a learner name must be an identifier, received {name!r}")
    if name in LEARNERS and not replace:
        raise ValueError(f"a learner named {name!r} is registered already (pass replace=True)")
    config = make(1)
    if not isinstance(config, Learner):
        raise ValueError(
            f"learner {name!r}: make(steps) must return a config with fit(key, problem, "
            f"monitor=None) and problems, received {type(config).__name__}"
        )
    LEARNERS[name] = LearnerEntry(make=make, describe=describe)


def make_learner(name: str, steps: int) -> Learner:
    """The config of learner ``name`` at a step budget of ``steps``."""
    choice("learner", name, tuple(LEARNERS))
    return LEARNERS[name].make(steps)


def describe(name: str, config: Learner) -> str:
    """What ``config``, a config of learner ``name``, runs (its entry's ``describe``)."""
    choice("learner", name, tuple(LEARNERS))
    return LEARNERS[name].describe(config)


def learner_label(name: str, steps: int) -> str:
    """``name: what it runs`` at a step budget of ``steps``."""
    return f"{name}: {describe(name, make_learner(name, steps))}"
