"""Tasks: random instance generators paired with the metrics that score a fit.

A task (:class:`Task`) draws one instance — the truth (a teacher, or a held-out draw for the
mixture) and a :mod:`~mhalearn.problems` problem — from a key, and scores a learner's
:class:`~mhalearn.learners.base.Fit` against it with :mod:`mhalearn.metrics`: the one place
where anything is compared with the truth. Structure is static; numbers (β, label noise, init
scales, tolerances, the active head count) are PyTree leaves, so they can be swept per
instance under ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import in_range, positive_int
from mhalearn.data import Mixture, MixtureSpec, sample_tokens, tokenized_mixture
from mhalearn.instances import Shared, unwrap
from mhalearn.kernels import ClassifierSpec
from mhalearn.learners.base import Fit
from mhalearn.metrics.recovery import (
    classification_errors,
    estimate_errors,
    parameter_errors,
    prediction_error,
    success,
)
from mhalearn.metrics.theory import relevant_attention
from mhalearn.params import ClassifierParams, LayerParams
from mhalearn.problems import (
    ClassificationProblem,
    ClassifierStart,
    GivenStart,
    Problem,
    RegressionProblem,
    RegressionStart,
    predict_layer,
)
from mhalearn.teachers import (
    TeacherSpec,
    parameter_diagnostics,
    passes_checks,
    sample_teacher_with_info,
)

_OTHER = {"boolean": "gaussian", "gaussian": "boolean"}


class Instance(NamedTuple):
    """One random instance of a task: the truth the scores compare with, and the problem the
    learner fits (a :class:`~mhalearn.problems.Problem`)."""

    truth: Any
    problem: Any


@runtime_checkable
class Task(Protocol):
    """What every task is: a random instance, the checks of its truth, and its scores."""

    def sample(self, key: PRNGKeyArray) -> Instance:
        """One :class:`Instance` ``(truth, problem)``: what the scores compare with, and what
        the learner fits (a :class:`~mhalearn.problems.Problem`)."""
        ...

    def checks(self, truth: Any) -> dict[str, Bool[Array, ""]]:
        """Flags on the truth drawn (e.g. ``teacher_accepted``), reported as status."""
        ...

    def monitor(self, truth: Any, problem: Any, params: Any) -> dict[str, Float[Array, ""]]:
        """Metrics a learner records along its trace."""
        ...

    def evaluate(
        self, key: PRNGKeyArray, truth: Any, problem: Any, fit: Fit
    ) -> dict[str, Float[Array, ""]]:
        """The scores of ``fit`` (its parameters and estimates) against the truth."""
        ...


class RegressionTask(eqx.Module):
    """Recover a random Chen–Li teacher from ``samples`` noisy examples.

    Labels are ``Y = F(X) + label_noise·N(0, 1)`` entrywise (``label_noise = 0``: the
    realizable setting of Chen & Li; noise is our extension). The student has
    ``student_heads`` heads (default: the teacher's). Metrics: matched parameter errors,
    ΣW error, span angle, normalised prediction error on ``test_samples`` fresh inputs of the
    training distribution and of the other one (Boolean ↔ Gaussian), and ``success`` when
    every matched parameter is within ``success_tol`` (relative Frobenius error). The student
    starts at ``start`` (a random law, or a :class:`~mhalearn.problems.GivenStart`).
    """

    teacher: TeacherSpec
    samples: int = eqx.field(static=True, default=1000)
    student_heads: int | None = eqx.field(static=True, default=None)
    test_samples: int = eqx.field(static=True, default=512)
    label_noise: float | Array = 0.0
    start: RegressionStart | GivenStart = RegressionStart()
    success_tol: float | Array = 1e-3

    def __check_init__(self):
        positive_int("samples", self.samples)
        positive_int("test_samples", self.test_samples)
        if self.student_heads is not None:
            positive_int("student_heads", self.student_heads)
            if self.student_heads < self.teacher.heads:
                raise ValueError(
                    f"student_heads must be >= teacher heads ({self.teacher.heads}), "
                    f"received {self.student_heads}"
                )
        in_range("label_noise", self.label_noise, 0.0)
        in_range("success_tol", self.success_tol, 0.0, open_low=True)

    def _inputs(self, key: PRNGKeyArray, distribution: str, n: int) -> Float[Array, "n tokens dim"]:
        return sample_tokens(key, distribution, (n, self.teacher.tokens, self.teacher.dim))

    def _noise(
        self, key: PRNGKeyArray, truth: Float[Array, "n tokens dim"]
    ) -> Float[Array, "n tokens dim"]:
        """``label_noise·N(0, 1)``; not drawn at all when the level is 0 (it would add 0)."""

        def draw():
            noise = self.label_noise * draws.normal(key, truth.shape, truth.dtype)
            return noise.astype(truth.dtype)

        return jax.lax.cond(jnp.asarray(self.label_noise) > 0, draw, lambda: jnp.zeros_like(truth))

    def sample(self, key: PRNGKeyArray) -> Instance:
        """The teacher and its :class:`~mhalearn.problems.RegressionProblem`."""
        k_teacher, k_x, k_noise = jax.random.split(key, 3)
        teacher = sample_teacher_with_info(k_teacher, self.teacher).teacher
        X = self._inputs(k_x, self.teacher.inputs, self.samples)
        truth = predict_layer(teacher, X)
        Y = truth + self._noise(k_noise, truth)
        heads = self.student_heads or self.teacher.heads
        problem = RegressionProblem(X=X, Y=Y, heads=heads, start=self.start, teacher=teacher)
        return Instance(teacher, problem)

    def checks(self, teacher: LayerParams) -> dict[str, Bool[Array, ""]]:
        """``teacher_accepted``: whether the teacher drawn passed its family's checks (False:
        ``max_attempts`` draws all failed and the last one is used)."""
        diag = parameter_diagnostics(teacher.theta, teacher.W)
        return {"teacher_accepted": passes_checks(self.teacher, diag)}

    def monitor(self, teacher: LayerParams, problem: RegressionProblem, params: LayerParams):
        errors = parameter_errors(params, teacher)
        return {"theta_error_max": errors.theta_error_max, "w_error_max": errors.w_error_max}

    def evaluate(
        self,
        key: PRNGKeyArray,
        teacher: LayerParams,
        problem: RegressionProblem,
        fit: Fit,
    ) -> dict[str, Float[Array, ""]]:
        """Matched parameter errors, prediction errors, the training loss and its excess over
        the teacher's (relative to the labels' mean square: ≤ ~0 when the fit explains the
        training data as well as the truth does), success, and the errors of the learner's
        estimates (:func:`~mhalearn.metrics.recovery.estimate_errors`)."""
        params = fit.params
        k_same, k_other = jax.random.split(key)
        errors = parameter_errors(params, teacher)
        train_loss = problem.loss(params)
        same = self._inputs(k_same, self.teacher.inputs, self.test_samples)
        other = self._inputs(k_other, _OTHER[self.teacher.inputs], self.test_samples)
        return {
            **{f: getattr(errors, f) for f in errors.__dataclass_fields__},
            "prediction_error": prediction_error(params, teacher, same),
            "prediction_error_other": prediction_error(params, teacher, other),
            "train_loss": train_loss,
            "train_excess": (train_loss - problem.loss(teacher)) / jnp.mean(problem.Y**2),
            "success": success(errors, self.success_tol),
            **estimate_errors(fit.estimates, teacher, problem.X),
        }


class ClassificationTask(eqx.Module):
    """Train the classifier family on the tokenized mixture (Deora et al., reconstructed).

    ``heads`` is the model's head count; ``active_heads`` (a leaf, default all) masks the rest,
    so head counts can be swept in one compilation. ``start`` sets the initialisation
    (:class:`~mhalearn.problems.ClassifierStart`, or a
    :class:`~mhalearn.problems.GivenStart`). Metrics: train
    and test logistic loss and 0-1 error (``test_samples`` fresh draws of the mixture); the
    trace follows the training 0-1 error, and the test loss, test error and attention mass on
    relevant positions (:func:`~mhalearn.metrics.theory.relevant_attention`) on another
    held-out draw.
    """

    mixture: MixtureSpec
    model: ClassifierSpec = eqx.field(static=True, default=ClassifierSpec())
    heads: int = eqx.field(static=True, default=4)
    samples: int = eqx.field(static=True, default=256)
    test_samples: int = eqx.field(static=True, default=1024)
    active_heads: int | Array | None = None
    start: ClassifierStart | GivenStart = ClassifierStart()

    def __check_init__(self):
        if self.model.query == "given":
            raise ValueError(
                "model: the tokenized mixture has no query token per sample (query='given'); "
                "use UserTask with your own queries"
            )
        positive_int("heads", self.heads)
        positive_int("samples", self.samples)
        positive_int("test_samples", self.test_samples)
        if isinstance(self.active_heads, int):
            in_range("active_heads", self.active_heads, 1, self.heads)

    def sample(self, key: PRNGKeyArray) -> Instance:
        """The training :class:`~mhalearn.problems.ClassificationProblem`, and (as the
        "truth") a held-out :class:`~mhalearn.data.Mixture` draw on which the test loss
        is monitored during training."""
        data = tokenized_mixture(key, self.mixture, self.samples)
        held_out = tokenized_mixture(jax.random.fold_in(key, 1), self.mixture, self.test_samples)
        problem = ClassificationProblem(
            X=data.X,
            y=data.y,
            spec=self.model,
            heads=self.heads,
            active_heads=self.active_heads,
            start=self.start,
        )
        return Instance(held_out, problem)

    def checks(self, held_out: Mixture) -> dict[str, Bool[Array, ""]]:
        """Nothing to check: the mixture has no teacher."""
        del held_out
        return {}

    def monitor(self, held_out: Mixture, problem: ClassificationProblem, params: ClassifierParams):
        test = classification_errors(problem.scores(params, held_out.X), held_out.y)
        return {
            "train_error": classification_errors(
                problem.scores(params, problem.X), problem.y
            ).error,
            "test_loss": test.loss,
            "test_error": test.error,
            "relevant_attention": relevant_attention(
                params, held_out.X, held_out.relevant, problem.spec, problem.head_mask()
            ),
        }

    def evaluate(
        self,
        key: PRNGKeyArray,
        truth: Mixture,
        problem: ClassificationProblem,
        fit: Fit,
    ) -> dict[str, Float[Array, ""]]:
        """Train and test logistic loss and 0-1 error, the generalisation gap (test − train
        loss) and the active head count."""
        del truth  # the final scores use a fresh draw, independent of the monitored one
        test = tokenized_mixture(key, self.mixture, self.test_samples)
        train = classification_errors(problem.scores(fit.params, problem.X), problem.y)
        held_out = classification_errors(problem.scores(fit.params, test.X), test.y)
        return {
            "train_loss": train.loss,
            "train_error": train.error,
            "test_loss": held_out.loss,
            "test_error": held_out.error,
            "gap": held_out.loss - train.loss,
            "active_heads": jnp.sum(problem.head_mask()),
        }


class UserTask(eqx.Module):
    """A task from the user's own data and model, batched like the built-in ones.

    - ``data``: the instances' data, a PyTree of arrays every instance sees whole; wrap what
      differs per instance in :class:`~mhalearn.instances.PerInstance` (arrays with a leading
      instance axis; instance i sees slice i). Or ``draw(key) -> data``: a function drawing
      one instance's data from its problem key (then ``data`` is ``None``).
    - ``problem(data) -> Problem``: the model to fit on that data (a built-in problem, or the
      user's own class with ``init``/``loss``/``loss_and_grad``/``samples``; give it a
      ``start`` field to accept a :class:`~mhalearn.problems.GivenStart`).
    - ``metrics(data, problem, params) -> {name: scalar}`` (optional): the user's scores; they
      are recorded at the learner's snapshots too unless ``trace_metrics`` is False.

    The instance's "truth" (what the metrics see) is its data. Reported beside the user's
    metrics: ``train_loss``, the problem's loss at the fit.
    """

    problem: Callable[[Any], Problem] = eqx.field(static=True)
    data: Any = eqx.field(default=None, converter=lambda v: v if v is None else Shared(v))
    draw: Callable[[PRNGKeyArray], Any] | None = eqx.field(static=True, default=None)
    metrics: Callable[[Any, Any, Any], dict[str, Array]] | None = eqx.field(
        static=True, default=None
    )
    trace_metrics: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        if (self.data is None) == (self.draw is None):
            raise ValueError("UserTask: give exactly one of data (arrays) and draw (a function)")

    def sample(self, key: PRNGKeyArray) -> Instance:
        """The user's data (as the truth) and the problem made of it."""
        data = self.data if self.draw is None else self.draw(key)
        data = unwrap(data)
        return Instance(data, self.problem(data))

    def checks(self, data: Any) -> dict[str, Bool[Array, ""]]:
        del data
        return {}

    def _scores(self, data: Any, problem: Problem, params: Any) -> dict[str, Array]:
        return {} if self.metrics is None else dict(self.metrics(data, problem, params))

    def monitor(self, data: Any, problem: Problem, params: Any) -> dict[str, Array]:
        return self._scores(data, problem, params) if self.trace_metrics else {}

    def evaluate(self, key: PRNGKeyArray, data: Any, problem: Problem, fit: Fit):
        del key
        return {"train_loss": problem.loss(fit.params), **self._scores(data, problem, fit.params)}
