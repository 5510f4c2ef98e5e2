"""One instance's learning problem: a training set and the student model that is fitted to it.

A problem (:class:`Problem`) is what every learner fits (``learner.fit(key, problem)``). It
knows:

- ``init(key)``: the student's random start (learners ask :func:`start_point`, which returns
  a :class:`GivenStart` instead when the problem's ``start`` is one);
- ``loss(params, idx=None)``: the training loss on all samples, or on the samples ``idx``;
- ``loss_and_grad(params, idx=None)``: that loss and its gradient (gradient learners call
  it; the regression problem's is derived by hand, :mod:`mhalearn.layer`);
- ``samples``: the training-set size;
- optionally ``prepared()``: the same problem made ready for many full-batch gradients (the
  regression problem lays its training set out once, :class:`~mhalearn.layer.Lanes`);
  learners that take many steps call :func:`prepared`.

Numbers (init scales) are PyTree leaves; structure (student heads, model spec) is static.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from mhalearn import draws
from mhalearn._validate import check_shapes, in_range, positive_int
from mhalearn.fused import fused_form, fused_loss_and_grad, pad_training_set
from mhalearn.instances import unwrap
from mhalearn.kernels import ClassifierSpec, classifier_score
from mhalearn.layer import (
    Lanes,
    lanes_form,
    lanes_loss_and_grad,
    lay_out,
    layer_outputs,
    squared_loss_and_grad,
)
from mhalearn.losses import logistic_loss, squared_loss
from mhalearn.params import ClassifierParams, LayerParams


@runtime_checkable
class Problem(Protocol):
    """What every learner may ask of the problem it fits."""

    @property
    def samples(self) -> int: ...

    def init(self, key: PRNGKeyArray) -> PyTree:
        """The student's starting parameters."""
        ...

    def loss(self, params: PyTree, idx: Int[Array, " batch"] | None = None) -> Float[Array, ""]:
        """The training loss on every sample, or on the samples ``idx``."""
        ...

    def loss_and_grad(
        self, params: PyTree, idx: Int[Array, " batch"] | None = None
    ) -> tuple[Float[Array, ""], PyTree]:
        """That loss and its gradient with respect to ``params``, as the pair
        ``jax.value_and_grad`` returns: a hand-written gradient is a drop-in replacement for
        it (the (value, gradient) pairs are the only results the package leaves plain tuples)."""
        ...


def prepared(problem: Problem) -> Problem:
    """``problem`` made ready for many full-batch gradients: its ``prepared()`` where it has
    one, else ``problem`` itself. Learners call it once, before their loop."""
    prepare = getattr(problem, "prepared", None)
    return problem if prepare is None else prepare()


def predict_layer(
    params: LayerParams, X: Float[Array, "n tokens dim"]
) -> Float[Array, "n tokens dim"]:
    """The Chen–Li layer ``params`` applied to each of ``n`` sequences."""
    return layer_outputs(X, params.theta, params.W)


def _take(a: Array | None, idx: Int[Array, " batch"] | None) -> Array | None:
    return a if idx is None or a is None else a[idx]


class GivenStart(eqx.Module):
    """A start point given, not drawn: ``params`` (the problem's parameter PyTree) is where
    every learner that starts from a point starts (all of a learner's restarts alike; the
    classifier's one-step initialisation is not applied). Per instance under
    :func:`~mhalearn.simulate.simulate`: wrap the stacked parameters (``jax.vmap`` of the
    parameter class builds them) in :class:`~mhalearn.instances.PerInstance`."""

    params: PyTree


def start_point(problem: Problem, key: PRNGKeyArray) -> PyTree:
    """Where a learner starts on ``problem``: its :class:`GivenStart` when its ``start`` is
    one (checked against the shapes that ``problem.init`` draws under the field's default
    law, when it has one), else ``problem.init(key)``."""
    start = getattr(problem, "start", None)
    if not isinstance(start, GivenStart):
        return problem.init(key)
    given = unwrap(start.params)
    law = {f.name: f.default for f in dataclasses.fields(problem)}.get("start")
    if law is None or law is dataclasses.MISSING:
        return given
    drawn = jax.eval_shape(dataclasses.replace(problem, start=law).init, key)
    shapes = lambda tree: jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), tree)  # noqa: E731
    if jax.tree.structure(drawn) != jax.tree.structure(given) or shapes(drawn) != shapes(given):
        raise ValueError(
            f"GivenStart: expected parameters shaped as the problem's start, {shapes(drawn)}, "
            f"received {shapes(given)}"
        )
    return given


class RegressionStart(eqx.Module):
    """The Chen–Li student's random start: Θ̂_i = (theta_init/dim)·G_i and Ŵ_i =
    w_init·H_i/√dim with G, H standard normal (the teacher's law, so ‖Θ̂_i‖_F ≈ theta_init).
    Both scales are leaves: they can be swept."""

    theta_init: float | Array = 1.0
    w_init: float | Array = 1.0

    def __check_init__(self):
        for name in ("theta_init", "w_init"):
            in_range(name, getattr(self, name), 0.0)


class ClassifierStart(eqx.Module):
    """The classifier's start: U = u_init·N(0, 1/dim) entries, W_h = (w_init/dim)·G_h (so
    ‖W_h‖_F ≈ w_init; w_init = 0 gives uniform attention), and a prompt p ~ N(0, I/dim) when the
    model has one; then, when ``one_step`` = η₀ is not 0, one full-batch gradient step of size
    η₀ on the training loss (the "one step" initialisation). Initialisations: Gaussian U with
    W = 0 (the default), Gaussian both (``w_init > 0``), zero (``u_init = w_init = 0``: the
    W-gradient then vanishes), each with or without the step; every scale is a leaf."""

    u_init: float | Array = 1.0
    w_init: float | Array = 0.0
    one_step: float | Array = 0.0

    def __check_init__(self):
        for name in ("u_init", "w_init", "one_step"):
            in_range(name, getattr(self, name), 0.0)


class RegressionProblem(eqx.Module):
    """Fit a Chen–Li layer with ``heads`` heads to pairs ``(X_n, Y_n)``.

    Loss: mean squared error over every entry of ``F̂(X_n) − Y_n``. The student starts at
    ``start`` (:class:`RegressionStart`). ``teacher`` carries the truth when the task knows
    it; only the oracle baseline may read it. ``lanes``: the training set laid out for
    repeated gradients (:meth:`prepared` sets it; full-batch ``loss_and_grad`` then uses it).
    ``fused``: full-batch ``loss_and_grad`` runs the fused kernel
    (:func:`~mhalearn.fused.fused_loss_and_grad`; :meth:`prepared` sets it where
    :func:`~mhalearn.fused.fused_form` says, with ``padded``, the training set as the kernel
    reads it, :func:`~mhalearn.fused.pad_training_set`, made once).
    """

    X: Float[Array, "samples tokens dim"]
    Y: Float[Array, "samples tokens dim"]
    heads: int = eqx.field(static=True)
    start: RegressionStart | GivenStart = RegressionStart()
    teacher: LayerParams | None = None  # the truth, for oracle baselines only
    lanes: Lanes | None = None
    fused: bool = eqx.field(static=True, default=False)
    padded: tuple[Array, Array] | None = None

    def __check_init__(self):
        positive_int("heads", self.heads)
        check_shapes(("X", self.X, "samples tokens dim"), ("Y", self.Y, "samples tokens dim"))

    @property
    def samples(self) -> int:
        return self.X.shape[0]

    def init(self, key: PRNGKeyArray) -> LayerParams:
        d = self.X.shape[-1]
        k_theta, k_w = jax.random.split(key)
        shape = (self.heads, d, d)
        theta = (self.start.theta_init / d) * draws.normal(k_theta, shape, self.X.dtype)
        W = (self.start.w_init / math.sqrt(d)) * draws.normal(k_w, shape, self.X.dtype)
        return LayerParams(theta=theta, W=W)

    def loss(
        self, params: LayerParams, idx: Int[Array, " batch"] | None = None
    ) -> Float[Array, ""]:
        return squared_loss(predict_layer(params, _take(self.X, idx)), _take(self.Y, idx))

    def prepared(self) -> RegressionProblem:
        """This problem with its full-batch gradients from the fused kernel where
        :func:`~mhalearn.fused.fused_form` says (a GPU), else with its training set laid out as
        :class:`~mhalearn.layer.Lanes` where that is faster (:func:`~mhalearn.layer.lanes_form`),
        else itself."""
        n, T, d = self.X.shape
        if self.fused or self.lanes is not None:
            return self
        if fused_form(T, d, self.X.dtype):
            return dataclasses.replace(self, fused=True, padded=pad_training_set(self.X, self.Y))
        if not lanes_form(n, self.heads, T, d, self.X.dtype.itemsize):
            return self
        return dataclasses.replace(self, lanes=lay_out(self.X, self.Y))

    def loss_and_grad(
        self, params: LayerParams, idx: Int[Array, " batch"] | None = None
    ) -> tuple[Float[Array, ""], LayerParams]:
        if idx is None and self.fused:
            loss, (g_theta, g_W) = fused_loss_and_grad(
                self.X, self.Y, params.theta, params.W, padded=self.padded
            )
        elif idx is None and self.lanes is not None:
            loss, (g_theta, g_W) = lanes_loss_and_grad(self.lanes, params.theta, params.W)
        else:
            loss, (g_theta, g_W) = squared_loss_and_grad(
                _take(self.X, idx), _take(self.Y, idx), params.theta, params.W
            )
        return loss, LayerParams(theta=g_theta, W=g_W)


class ClassificationProblem(eqx.Module):
    """Fit the classifier family (``spec``, up to ``heads`` heads) to labels ``y`` ∈ {±1}.

    Loss: mean logistic loss. ``active_heads`` (a leaf, so it can vary under ``vmap``) masks
    the heads beyond it; α_H uses the active count. ``Z`` holds each sample's query token when
    ``spec.query == "given"`` (cross-attention). The student starts at ``start``
    (:class:`ClassifierStart`, or a :class:`GivenStart`).
    """

    X: Float[Array, "samples tokens dim"]
    y: Float[Array, " samples"]
    spec: ClassifierSpec = eqx.field(static=True)
    heads: int = eqx.field(static=True)
    active_heads: int | Array | None = None
    start: ClassifierStart | GivenStart = ClassifierStart()
    Z: Float[Array, "samples dim"] | None = None

    def __check_init__(self):
        positive_int("heads", self.heads)
        if (self.spec.query == "given") != (self.Z is not None):
            raise ValueError(
                "Z: a query token per sample, shape (samples, dim), is needed exactly when "
                f"spec.query == 'given' (query={self.spec.query!r}, Z given: {self.Z is not None})"
            )
        queries = () if self.Z is None else (("Z", self.Z, "samples dim"),)
        check_shapes(("X", self.X, "samples tokens dim"), ("y", self.y, "samples"), *queries)

    @property
    def samples(self) -> int:
        return self.X.shape[0]

    def head_mask(self) -> Float[Array, " heads"]:
        active = self.heads if self.active_heads is None else self.active_heads
        return (jnp.arange(self.heads) < active).astype(self.X.dtype)

    def init(self, key: PRNGKeyArray) -> ClassifierParams:
        _, T, d = self.X.shape
        k_w, k_u, k_p = jax.random.split(key, 3)
        dtype = self.X.dtype
        u_shape = (
            (self.heads, self.spec.queries(T), d)
            if self.spec.readout == "matrix"
            else (self.heads, d)
        )
        W = (self.start.w_init / d) * draws.normal(k_w, (self.heads, d, d), dtype)
        U = (self.start.u_init / math.sqrt(d)) * draws.normal(k_u, u_shape, dtype)
        prompt = None
        if self.spec.query == "prompt":
            prompt = draws.normal(k_p, (d,), dtype) / math.sqrt(d)
        params = ClassifierParams(W=W, U=U, prompt=prompt)
        grads = jax.grad(self.loss)(params)
        return jax.tree.map(lambda p, g: p - self.start.one_step * g, params, grads)

    def scores(
        self,
        params: ClassifierParams,
        X: Float[Array, "n tokens dim"],
        Z: Float[Array, "n dim"] | None = None,
    ) -> Float[Array, " n"]:
        """The scores of sequences ``X`` (with their query tokens ``Z`` when the queries are
        given)."""
        mask = self.head_mask()

        def score(x, z):
            return classifier_score(x, params.W, params.U, self.spec, params.prompt, mask, z)

        return jax.vmap(score)(X, Z)

    def loss(
        self, params: ClassifierParams, idx: Int[Array, " batch"] | None = None
    ) -> Float[Array, ""]:
        scores = self.scores(params, _take(self.X, idx), _take(self.Z, idx))
        return logistic_loss(scores, _take(self.y, idx))

    def loss_and_grad(
        self, params: ClassifierParams, idx: Int[Array, " batch"] | None = None
    ) -> tuple[Float[Array, ""], ClassifierParams]:
        return jax.value_and_grad(self.loss)(params, idx)
