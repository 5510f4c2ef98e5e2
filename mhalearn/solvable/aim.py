"""The attention-indexed model (AIM) of Boncoraglio, Troiani, Erba & Zdeborová, "Bayes optimal
learning of attention-indexed models" (arXiv 2506.01582; code: the repository
``FabrizioBoncoraglio/BO_ExtensiveRankAttention``, ``GD_softmax_averaged.py``), defined as the
authors' code defines it:

- tokens x ∈ ℝ^{T×D} with i.i.d. N(0, 1) entries, n = ⌊α·D²⌋ training sequences;
- a tied attention matrix of extensive rank, S = WᵀW/√(R·D) with W ∈ ℝ^{R×D}, R = ⌊ρ·D⌋, the
  teacher's entries i.i.d. N(0, 1);
- the target is the T×T attention matrix itself, softmax over b of β·(x_aᵀSx_b − δ_ab·Tr S)/√D
  (the authors compute it as x Wᵀ/√D, its Gram matrix over √R, less ‖W‖²_F/√(R·D²) on the
  diagonal; β = 1);
- the student has the same form, W ∈ ℝ^{R×D} from N(0, ``init_scale``²);
- the training loss is the sum over sequences and matrix entries of the squared error, over D
  (a *sum*, not a mean); the authors train it by full-batch Adam (lr 0.1, 1000 steps);
- the error is ``mse`` = ‖S_student − S_teacher‖²_F / D.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import in_range, positive_int
from mhalearn.learners.base import Fit
from mhalearn.tasks import Instance


class AIMParams(eqx.Module):
    """The AIM's weights W (rank × dim); the attention matrix is S = WᵀW/√(rank·dim)."""

    W: Float[Array, "rank dim"]


def aim_matrix(W: Float[Array, "rank dim"]) -> Float[Array, "dim dim"]:
    """S = WᵀW/√(R·D)."""
    R, D = W.shape
    return W.T @ W / math.sqrt(R * D)


def aim_outputs(
    W: Float[Array, "rank dim"], X: Float[Array, "n tokens dim"], beta: float | Array = 1.0
) -> Float[Array, "n tokens tokens"]:
    """The model's T×T attention matrix of every sequence, as the authors compute it: h = x Wᵀ/√D,
    logits hhᵀ/√R − ‖W‖²_F/√(R·D²)·I, softmax over the last axis at inverse temperature β."""
    R, D = W.shape
    h = X @ W.T / math.sqrt(D)
    logits = jnp.einsum("nap,nbp->nab", h, h) / math.sqrt(R)
    trace = jnp.sum(W**2) / math.sqrt(R * D**2)
    return jax.nn.softmax(beta * (logits - trace * jnp.eye(X.shape[1], dtype=X.dtype)), axis=-1)


class AIMProblem(eqx.Module):
    """One AIM training set and its student: the loss Σ(ŷ − y)²/D over every sequence and
    matrix entry (the authors' sum), the start W ~ N(0, ``init_scale``²)."""

    X: Float[Array, "n tokens dim"]
    Y: Float[Array, "n tokens tokens"]
    rank: int = eqx.field(static=True)
    beta: float | Array = 1.0
    init_scale: float | Array = 1.0

    @property
    def samples(self) -> int:
        return self.X.shape[0]

    def init(self, key: PRNGKeyArray) -> AIMParams:
        shape = (self.rank, self.X.shape[-1])
        return AIMParams(W=self.init_scale * draws.normal(key, shape, self.X.dtype))

    def loss(self, params: AIMParams, idx: Int[Array, " batch"] | None = None) -> Float[Array, ""]:
        X, Y = (self.X, self.Y) if idx is None else (self.X[idx], self.Y[idx])
        return jnp.sum((aim_outputs(params.W, X, self.beta) - Y) ** 2) / X.shape[-1]

    def loss_and_grad(self, params: AIMParams, idx: Int[Array, " batch"] | None = None):
        return jax.value_and_grad(self.loss)(params, idx)


class AIMTask(eqx.Module):
    """Learn the AIM's attention matrix from n = ⌊``alpha``·dim²⌋ sequences of ``tokens``
    Gaussian tokens (the teacher of rank ⌊``rho``·dim⌋). Metrics: ``mse`` (the authors'
    ‖S − S*‖²_F/D) and ``train_loss``."""

    dim: int = eqx.field(static=True, default=200)
    tokens: int = eqx.field(static=True, default=2)
    alpha: float = eqx.field(static=True, default=0.1)
    rho: float = eqx.field(static=True, default=0.5)
    beta: float | Array = 1.0
    init_scale: float | Array = 1.0

    def __check_init__(self):
        positive_int("dim", self.dim)
        positive_int("tokens", self.tokens)
        in_range("alpha", self.alpha, 0.0, open_low=True)
        in_range("rho", self.rho, 0.0, open_low=True)
        positive_int("samples (⌊alpha·dim²⌋)", self.samples)
        positive_int("rank (⌊rho·dim⌋)", self.rank)
        in_range("init_scale", self.init_scale, 0.0, open_low=True)

    @property
    def samples(self) -> int:
        """n = ⌊α·D²⌋, as the authors round it."""
        return int(self.alpha * self.dim**2)

    @property
    def rank(self) -> int:
        """R = ⌊ρ·D⌋."""
        return int(self.rho * self.dim)

    def sample(self, key: PRNGKeyArray) -> Instance:
        """The teacher W* and its :class:`AIMProblem`."""
        k_teacher, k_x = jax.random.split(key)
        teacher = AIMParams(W=draws.normal(k_teacher, (self.rank, self.dim)))
        X = draws.normal(k_x, (self.samples, self.tokens, self.dim))
        Y = aim_outputs(teacher.W, X, self.beta)
        problem = AIMProblem(X=X, Y=Y, rank=self.rank, beta=self.beta, init_scale=self.init_scale)
        return Instance(teacher, problem)

    def checks(self, teacher: AIMParams) -> dict[str, Bool[Array, ""]]:
        del teacher
        return {}

    def monitor(self, teacher: AIMParams, problem: AIMProblem, params: AIMParams):
        del problem
        return {"mse": aim_mse(params, teacher)}

    def evaluate(
        self, key: PRNGKeyArray, teacher: AIMParams, problem: AIMProblem, fit: Fit
    ) -> dict[str, Float[Array, ""]]:
        del key
        return {"mse": aim_mse(fit.params, teacher), "train_loss": problem.loss(fit.params)}


def aim_mse(params: AIMParams, teacher: AIMParams) -> Float[Array, ""]:
    """‖S − S*‖²_F / D, the authors' error."""
    return jnp.sum((aim_matrix(params.W) - aim_matrix(teacher.W)) ** 2) / teacher.W.shape[1]
