"""``max_margin``: does W, trained alone by normalised GD, converge in direction to the
attention SVM of the tokens it selects? (Tarzanagh et al., "Transformers as Support Vector
Machines", their public experiment, and beyond it: larger sizes and several heads.)

Each instance: n sequences of T unit-norm Gaussian tokens in d dimensions with random ±1
labels; a query token per sample (``cross``: z_i unit-norm Gaussian, the classifier's
``query="given"``; ``self``: the first token, ``query="first"``); the classifier with a vector
readout fixed at unit-norm Gaussian v_h per head; W = 0 at the start, and only W trained, by
normalised GD (``normalize="field"``: the whole W moves ``lr`` per step). After training, each
head's selected token per sample is the one its attention weights most, and W_mm,h is that
head's attention SVM (:func:`~mhalearn.metrics.selection.attention_svm`); the correlation
⟨W_t,h, W_mm,h⟩/(‖W_t,h‖‖W_mm,h‖) is followed along the path.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from mhalearn import draws
from mhalearn.batch import Engine
from mhalearn.experiments.base import Study, register_study, results_dataset
from mhalearn.kernels import ClassifierSpec
from mhalearn.learners.gd import GDConfig
from mhalearn.metrics.selection import (
    attention_svm,
    direction_correlation,
    selected_tokens,
    selected_weight,
)
from mhalearn.params import ClassifierParams
from mhalearn.problems import ClassificationProblem, GivenStart
from mhalearn.simulate import InstanceKeys, measure
from mhalearn.variables import Meta, register_variables

#: the attention-SVM study's own variables (metrics.selection computes them)
register_variables(
    {
        "correlation": Meta(
            "corr(W_t, W_mm), mean over heads",
            "Mean over heads of ⟨W_t,h, W_mm,h⟩/(‖W_t,h‖_F ‖W_mm,h‖_F), W_mm,h the Frobenius "
            "attention SVM of the tokens head h selects at the end of training.",
        ),
        "correlation_min": Meta(
            "corr(W_t, W_mm), worst head",
            "Minimum over heads of ⟨W_t,h, W_mm,h⟩/(‖W_t,h‖_F ‖W_mm,h‖_F).",
        ),
        "correlation_end": Meta(
            "corr(W_T, W_mm) at the last step",
            "Mean over heads of the correlation of the trained W_h with its attention SVM.",
        ),
        "correlation_nuclear_end": Meta(
            "corr(W_T, W_mm,*) at the last step",
            "Mean over heads of the correlation of the trained W_h with the nuclear-norm "
            "attention SVM of the same selected tokens.",
        ),
        "svm_fro_nuclear_correlation": Meta(
            "corr(W_mm, W_mm,*)",
            "Mean over heads of the correlation between the Frobenius and the nuclear-norm "
            "attention SVMs (how far apart the two candidate limits are).",
        ),
        "selected_weight": Meta(
            "softmax weight on the selected token",
            "Mean over samples and heads of the attention weight on the token the head selects "
            "at the end of training.",
        ),
        "selected_weight_end": Meta(
            "softmax weight on the selected token at the last step",
            "Mean over samples and heads of the final attention weight on the selected token.",
        ),
        "w_norm": Meta("‖W_t‖_F", "Frobenius norm of the key·query matrices of all heads."),
        "svm_margin": Meta(
            "attention-SVM margin 1/‖W_mm‖_F",
            "Mean over heads of the margin 1/‖W_mm,h‖_F of the attention SVM.",
        ),
        "svm_gap": Meta(
            "attention-SVM duality gap",
            "Largest over heads of the relative duality gap of the Frobenius attention SVM's "
            "solution (0 at the optimum).",
            "relative",
        ),
        "svm_polished": Meta(
            "attention SVM solved exactly on its active set",
            "1 when every head's active-set polish was accepted (feasible, multipliers ≥ 0).",
            flag=True,
        ),
        "svm_worst_margin": Meta(
            "smallest constraint value of the attention SVM",
            "min over heads, samples and non-selected tokens of z_iᵀW(x_opt − x_j) at the "
            "solver's iterate (1: feasible as solved; W_mm is the iterate divided by it).",
        ),
        "best_token_share": Meta(
            "share of selections on the loss-optimal token",
            "Share of (sample, head) pairs whose selected token maximises y_i v_hᵀx_ij.",
        ),
        "heads_agree": Meta(
            "share of samples where all heads select the same token",
            "Share of samples whose heads all select the same token at the end of training.",
        ),
    }
)

Attention = Literal["cross", "self"]

#: the peer's checkpoints (steps at which their correlations are published)
CHECKPOINTS = (10, 100, 1000, 2000)


def unit_rows(key: PRNGKeyArray, shape: tuple[int, ...], dtype) -> Float[Array, "*shape"]:
    """Standard Gaussian vectors along the last axis, scaled to unit norm."""
    g = draws.normal(key, shape, dtype)
    return g / jnp.linalg.norm(g, axis=-1, keepdims=True)


def draw_instance(
    key: PRNGKeyArray, samples: int, tokens: int, dim: int, heads: int, attention: Attention
) -> dict[str, Array]:
    """One instance's data: tokens ``X`` (n, T, d), labels ``y`` (n,) ±1, readouts ``V``
    (heads, d) and, for cross-attention, queries ``Z`` (n, d); all unit-norm Gaussian."""
    k_x, k_y, k_v, k_z = jax.random.split(key, 4)
    dtype = jnp.zeros(()).dtype
    data = {
        "X": unit_rows(k_x, (samples, tokens, dim), dtype),
        "y": jnp.where(jax.random.bernoulli(k_y, 0.5, (samples,)), 1.0, -1.0).astype(dtype),
        "V": unit_rows(k_v, (heads, dim), dtype),
    }
    if attention == "cross":
        data["Z"] = unit_rows(k_z, (samples, dim), dtype)
    return data


def selection_problem(data: dict[str, Array]) -> ClassificationProblem:
    """The classifier on ``data``: vector readout fixed at ``V``, W = 0 at the start; queries
    ``Z`` when given (cross-attention), else the first token (self-attention)."""
    X, V = data["X"], data["V"]
    Z = data.get("Z")
    spec = ClassifierSpec(query="first" if Z is None else "given", readout="vector")
    heads, dim = V.shape
    start = ClassifierParams(W=jnp.zeros((heads, dim, dim), X.dtype), U=V)
    return ClassificationProblem(
        X=X, y=data["y"], spec=spec, heads=heads, start=GivenStart(start), Z=Z
    )


def token_selection_learner(steps: int = 2000, lr: float = 0.1, trace_at=CHECKPOINTS) -> GDConfig:
    """The peer's optimiser: W alone, normalised GD with steps of length ``lr``."""
    return GDConfig(
        optimizer="normalized_gd",
        normalize="field",
        trainable=("W",),
        lr=lr,
        steps=steps,
        trace_at=tuple(s for s in trace_at if s <= steps),
    )


def selection_path(
    key: PRNGKeyArray,
    problem: ClassificationProblem,
    learner: GDConfig,
    svm_iterations: int = 4000,
    nuclear: bool = False,
) -> dict[str, Any]:
    """Train ``problem`` with ``learner`` and score the path against each head's attention SVM
    of the tokens it selects at the end. Returns a :func:`~mhalearn.simulate.measure`
    outcome: per snapshot the correlation (mean and minimum over heads), the mean softmax
    weight on the selected tokens and ‖W‖; at the end the SVM's margin, its solver's
    certificate, where the selections fall, and (``nuclear``) the correlation with the
    nuclear-norm SVM."""
    fit = learner.fit(key, problem, monitor=lambda p: {"W": p.W})
    path = fit.trace.metrics["W"]  # (snapshots, heads, d, d)
    X = problem.X
    Z = X[:, 0] if problem.Z is None else problem.Z
    W_end = fit.params.W
    selected = jax.vmap(selected_tokens, in_axes=(0, None, None))(W_end, X, Z)  # (heads, n)
    svm = jax.vmap(lambda s: attention_svm(X, Z, s, "fro", svm_iterations))(selected)
    corr = jax.vmap(jax.vmap(direction_correlation), in_axes=(0, None))(path, svm.W)
    weight = jax.vmap(
        lambda W: jnp.mean(jax.vmap(selected_weight, in_axes=(0, None, None, 0))(W, X, Z, selected))
    )(path)
    # the token of largest y_i·v_hᵀx_ij: the one that lowers the loss most when selected
    V = fit.params.U  # (heads, d), fixed
    best = jnp.argmax(problem.y[None, :, None] * jnp.einsum("hd,ntd->hnt", V, X), axis=-1)
    metrics = {
        "correlation_end": jnp.mean(corr[-1]),
        "selected_weight_end": weight[-1],
        "svm_margin": jnp.mean(1.0 / svm.objective),
        "svm_gap": jnp.max(svm.gap),
        "svm_polished": jnp.all(svm.polished),
        "svm_worst_margin": jnp.min(svm.worst_margin),
        "best_token_share": jnp.mean(selected == best, dtype=X.dtype),
        "heads_agree": jnp.mean(jnp.all(selected == selected[:1], axis=0), dtype=X.dtype),
        "train_loss": fit.trace.loss[-1],
    }
    if nuclear:
        nuc = jax.vmap(lambda s: attention_svm(X, Z, s, "nuclear", svm_iterations // 4))(selected)
        metrics["correlation_nuclear_end"] = jnp.mean(jax.vmap(direction_correlation)(W_end, nuc.W))
        metrics["svm_fro_nuclear_correlation"] = jnp.mean(
            jax.vmap(direction_correlation)(svm.W, nuc.W)
        )
    return {
        "metrics": metrics,
        "trace": {
            "correlation": jnp.mean(corr, axis=1),
            "correlation_min": jnp.min(corr, axis=1),
            "selected_weight": weight,
            "w_norm": jnp.sqrt(jnp.sum(path**2, axis=(1, 2, 3))),
        },
        "steps": fit.trace.steps,
    }


def _shape(label: str) -> tuple[int, int, int]:
    try:
        n, T, d = (int(v) for v in label.split("x"))
    except ValueError:
        raise ValueError(
            f"shape: expected 'NxTxD' (samples x tokens x dim), received {label!r}"
        ) from None
    return n, T, d


@register_study
@dataclasses.dataclass(frozen=True)
class MaxMargin(Study):
    """The correlation of each head's W_t with its attention SVM W_mm along normalised GD,
    the softmax weight on the selected tokens, and where the selections fall, per shape
    (n×T×d), attention (cross: a query per sample; self: the first token) and head count.
    The peer's setting is the ``6x8x10`` cross-attention cell with one head, η = 0.1 and 2000
    steps."""

    name = "max_margin"
    summary = "attention SVM: correlation of W_t with W_mm, shapes × attention × heads"
    static_axes = ("shape", "attention", "heads")
    headline = "correlation_end"
    precision = "float64"
    positive = ("lr",)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            shape=("4x3x3",),
            heads=(1, 2),
            steps=100,
            instances=2,
            svm_iterations=400,
            checkpoints=(10, 100),
        ),
        "small": dict(shape=("6x8x10",), heads=(1, 2), steps=2000, instances=8),
        "full": dict(
            shape=("6x8x10", "16x8x10", "64x8x10", "6x32x10", "6x8x64", "64x32x64"),
            heads=(1,),
            instances=256,
        ),
        "heads_small": dict(shape=("6x8x10",), heads=(1, 2, 4), instances=8),
        "heads_full": dict(shape=("6x8x10",), heads=(1, 2, 4), instances=256),
    }

    shape: tuple[str, ...] = ("6x8x10",)
    """Sizes as 'NxTxD': samples n, tokens T per sequence, dimension d."""
    attention: tuple[Attention, ...] = ("cross", "self")
    """cross: a unit-norm Gaussian query token per sample; self: the first token queries."""
    heads: tuple[int, ...] = (1,)
    """Heads, each with its own fixed readout v_h (α_H = 1/√H)."""
    steps: int = 2000
    """Normalised GD steps on W."""
    lr: float = 0.1
    """Step length η (‖ΔW‖_F per step)."""
    checkpoints: tuple[int, ...] = CHECKPOINTS
    """Steps at which the path is scored (with 0 and the last, and log-spaced ones)."""
    svm_iterations: int = 4000
    """FISTA iterations of the attention SVM's dual (then the active-set polish)."""
    nuclear_max_dim: int = 16
    """Also solve the nuclear-norm SVM (ADMM, a quarter of svm_iterations) at the end, in
    cells of dimension d up to this (its SVDs and inner QPs are the costly part)."""
    instances: int = 8
    """Random problems (data, queries, labels, readouts) per cell."""
    seed: int = 0
    """Root seed: instance i of every cell draws from fold_in(key(seed), i)."""

    def __post_init__(self):
        super().__post_init__()
        for label in self.shape:
            _shape(label)
        for step in self.checkpoints:
            if step > self.steps:
                raise ValueError(f"checkpoints must be <= steps ({self.steps}), received {step}")

    def trace_steps(self) -> tuple[int, ...]:
        logged = np.unique(np.geomspace(1, self.steps, 16).round().astype(int))
        return tuple(sorted({*map(int, logged), *self.checkpoints}))

    def run_cell(self, cell: dict[str, Any], key: jax.Array, engine: Engine):
        n, T, d = _shape(cell["shape"])
        heads, attention = cell["heads"], cell["attention"]
        learner = token_selection_learner(self.steps, self.lr, self.trace_steps())
        iterations, nuclear = self.svm_iterations, d <= self.nuclear_max_dim

        def one(keys: InstanceKeys, learner):
            data = draw_instance(keys.problem, n, T, d, heads, attention)
            return selection_path(keys.fit, selection_problem(data), learner, iterations, nuclear)

        res = measure(key, one, learner, self.instances, engine=engine)
        return results_dataset(res, {}, self.instances)
