"""The positional–semantic model of dot-product attention of Cui, Behrens, Krzakala &
Zdeborová, "A phase transition between positional and semantic learning in a solvable model
of dot-product attention" (NeurIPS 2024; code: the repository
``SPOC-group/positional-and-semantic-attention``, ``src/empirics_mixed_teacher_softmax.py``),
defined as the authors' code defines it:

- two tokens x_l = p_l + z_l: positional encodings p_1 = −p_2 = 1/√d (every entry), semantic
  parts z_l with i.i.d. N(0, σ²) entries; n = round(α·d) training sequences;
- the teacher acts on the semantic parts only: y = (1 − ω)·softmax(z Q*/√d (z Q*/√d)ᵀ) z
  + ω·A z, with Q* ~ N(0, I_d) (rank one) and the fixed positional map
  A = [[0.6, 0.4], [0.4, 0.6]] (the authors' "standard" A);
- the student is a tied attention layer on the whole tokens, ŷ = softmax(x Q/√d (x Q/√d)ᵀ) x,
  Q ∈ ℝ^{d×r};
- the training loss is Σ(ŷ − y)²/(2d) over sequences and tokens (a *sum*), plus the weight
  decay λ/2·‖Q‖²_F (the authors' SGD ``weight_decay`` λ, lr 0.15, 5000 full-batch steps);
- the starts: ``"positional"`` Q = 1/√d (every entry, r = 1), ``"semantic"`` Q = Q* (r = 1,
  the informed start), ``"random"`` Q ~ 0.1·N(0, 1);
- what is measured: ``test_error`` = Σ(ŷ − y)²/(2d) over fresh sequences, per sequence;
  ``train_loss`` = the training loss with its penalty; ``m`` = |1ᵀQ|/d (the positional
  overlap) and ``theta`` = |Q*ᵀQ|/d (the semantic one);
- the linear baseline: ŷ = B z, a 2 × 2 mixing of the *semantic* parts (the authors' linear
  model sees z, not x), trained on the same sequences with the loss above plus
  ``linear_lmbda``/2·‖B‖²_F (their 1e-4). The authors run 200 Adam steps (lr 0.5) from a
  random B; :func:`linear_baseline` is that objective's minimiser in closed form (a 2 × 2
  ridge solve), which those steps approach; its ``linear_test_error`` is normalised as
  ``test_error``.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import choice, in_range, positive_int
from mhalearn.learners.base import Fit
from mhalearn.tasks import Instance

#: the authors' fixed positional maps (``which_A``)
POSITIONAL_MAPS = {"standard": ((0.6, 0.4), (0.4, 0.6)), "2ndexample": ((0.3, 0.7), (0.8, 0.2))}
#: the starts the authors train from
STARTS = ("positional", "semantic", "random")


class QueryParams(eqx.Module):
    """The tied student's query matrix Q (dim × rank)."""

    Q: Float[Array, "dim rank"]


def dot_attention(
    Q: Float[Array, "dim rank"], X: Float[Array, "n tokens dim"]
) -> Float[Array, "n tokens dim"]:
    """softmax(x Q/√d (x Q/√d)ᵀ) x for every sequence: the tied dot-product attention layer."""
    h = X @ Q / math.sqrt(X.shape[-1])
    weights = jax.nn.softmax(jnp.einsum("iml,inl->imn", h, h), axis=-1)
    return jnp.einsum("imn,inj->imj", weights, X)


def positions(dim: int, dtype=None) -> Float[Array, "2 dim"]:
    """The positional encodings p_1 = −p_2 = 1/√d (every entry)."""
    ones = jnp.ones(dim, dtype or jnp.result_type(float))
    return jnp.stack([ones, -ones]) / math.sqrt(dim)


def linear_baseline(
    Z: Float[Array, "n 2 dim"], Y: Float[Array, "n 2 dim"], lmbda: float | Array
) -> Float[Array, "2 2"]:
    """The B minimising Σ_n ‖B z_n − y_n‖²_F/(2d) + λ/2·‖B‖²_F:
    B = (Σ_n y_n z_nᵀ)(Σ_n z_n z_nᵀ + λ·d·I)⁻¹ (tokens as rows)."""
    d = Z.shape[-1]
    gram = jnp.einsum("nld,nkd->lk", Z, Z) + lmbda * d * jnp.eye(2, dtype=Z.dtype)
    cross = jnp.einsum("nfd,nld->fl", Y, Z)
    return jnp.linalg.solve(gram, cross.T).T  # gram is symmetric: B = cross·gram⁻¹


def teacher_outputs(
    Q_star: Float[Array, " dim"],
    Z: Float[Array, "n 2 dim"],
    omega: float | Array,
    A: Float[Array, "2 2"],
) -> Float[Array, "n 2 dim"]:
    """(1 − ω)·softmax(z Q*/√d (z Q*/√d)ᵀ) z + ω·A z."""
    attention = dot_attention(Q_star[:, None], Z)
    return (1 - omega) * attention + omega * jnp.einsum("fl,nld->nfd", A, Z)


class PositionalSemanticProblem(eqx.Module):
    """One training set of the positional–semantic model and its tied student: the loss
    Σ(ŷ − y)²/(2d) + λ/2·‖Q‖²_F, the start named by ``start`` (``Q_star`` is the teacher's
    semantic direction, which the informed start uses)."""

    X: Float[Array, "n 2 dim"]
    Y: Float[Array, "n 2 dim"]
    Q_star: Float[Array, " dim"]
    lmbda: float | Array = 0.01
    start: str = eqx.field(static=True, default="positional")
    rank: int = eqx.field(static=True, default=1)

    @property
    def samples(self) -> int:
        return self.X.shape[0]

    def init(self, key: PRNGKeyArray) -> QueryParams:
        d = self.X.shape[-1]
        if self.start == "positional":
            return QueryParams(Q=jnp.ones((d, 1), self.X.dtype) / math.sqrt(d))
        if self.start == "semantic":
            return QueryParams(Q=self.Q_star[:, None].astype(self.X.dtype))
        return QueryParams(Q=0.1 * draws.normal(key, (d, self.rank), self.X.dtype))

    def fit_loss(self, params: QueryParams, idx: Int[Array, " batch"] | None = None):
        """Σ(ŷ − y)²/(2d) over the samples (all, or ``idx``), without the penalty."""
        X, Y = (self.X, self.Y) if idx is None else (self.X[idx], self.Y[idx])
        return jnp.sum((dot_attention(params.Q, X) - Y) ** 2) / (2 * X.shape[-1])

    def loss(self, params: QueryParams, idx: Int[Array, " batch"] | None = None):
        return self.fit_loss(params, idx) + self.lmbda / 2 * jnp.sum(params.Q**2)

    def loss_and_grad(self, params: QueryParams, idx: Int[Array, " batch"] | None = None):
        return jax.value_and_grad(self.loss)(params, idx)


class PositionalSemanticTask(eqx.Module):
    """Learn the positional–semantic teacher from n = round(``alpha``·dim) sequences of two
    tokens, from the start ``start``. Metrics: ``test_error`` (on ``test_samples`` fresh
    sequences, per sequence), ``train_loss``, ``m``, ``theta`` and the linear baseline's
    ``linear_test_error`` (on the same sequences, ridge ``linear_lmbda``)."""

    dim: int = eqx.field(static=True, default=1000)
    alpha: float = eqx.field(static=True, default=1.0)
    omega: float | Array = 0.3
    sigma: float | Array = 0.5
    lmbda: float | Array = 0.01
    start: str = eqx.field(static=True, default="positional")
    rank: int = eqx.field(static=True, default=1)
    positional_map: str = eqx.field(static=True, default="standard")
    test_samples: int = eqx.field(static=True, default=10_000)
    linear_lmbda: float | Array = 1e-4

    def __check_init__(self):
        positive_int("dim", self.dim)
        in_range("alpha", self.alpha, 0.0, open_low=True)
        positive_int("samples (round(alpha·dim))", self.samples)
        in_range("omega", self.omega, 0.0, 1.0)
        in_range("sigma", self.sigma, 0.0, open_low=True)
        in_range("lmbda", self.lmbda, 0.0)
        choice("start", self.start, STARTS)
        choice("positional_map", self.positional_map, tuple(POSITIONAL_MAPS))
        positive_int("rank", self.rank)
        if self.start != "random" and self.rank != 1:
            raise ValueError(f"the {self.start} start is of rank 1, received rank {self.rank}")
        positive_int("test_samples", self.test_samples)
        in_range("linear_lmbda", self.linear_lmbda, 0.0)

    @property
    def samples(self) -> int:
        """n = round(α·d), as the authors round it."""
        return round(self.alpha * self.dim)  # half to even, as numpy's round

    def _draw(self, key: PRNGKeyArray, n: int, Q_star: Float[Array, " dim"]):
        Z = self.sigma * draws.normal(key, (n, 2, self.dim))
        A = jnp.asarray(POSITIONAL_MAPS[self.positional_map], Z.dtype)
        return positions(self.dim, Z.dtype) + Z, teacher_outputs(Q_star, Z, self.omega, A)

    def _semantic(self, X: Float[Array, "n 2 dim"]) -> Float[Array, "n 2 dim"]:
        return X - positions(self.dim, X.dtype)

    def sample(self, key: PRNGKeyArray) -> Instance:
        """The teacher's Q* and its :class:`PositionalSemanticProblem`."""
        k_teacher, k_x = jax.random.split(key)
        Q_star = draws.normal(k_teacher, (self.dim,))
        X, Y = self._draw(k_x, self.samples, Q_star)
        problem = PositionalSemanticProblem(
            X=X, Y=Y, Q_star=Q_star, lmbda=self.lmbda, start=self.start, rank=self.rank
        )
        return Instance(Q_star, problem)

    def checks(self, Q_star) -> dict[str, Bool[Array, ""]]:
        del Q_star
        return {}

    def monitor(self, Q_star, problem: PositionalSemanticProblem, params: QueryParams):
        return overlaps(params, Q_star)

    def evaluate(
        self, key: PRNGKeyArray, Q_star, problem: PositionalSemanticProblem, fit: Fit
    ) -> dict[str, Float[Array, ""]]:
        X, Y = self._draw(key, self.test_samples, Q_star)
        test = PositionalSemanticProblem(X=X, Y=Y, Q_star=Q_star, lmbda=0.0, rank=self.rank)
        B = linear_baseline(self._semantic(problem.X), problem.Y, self.linear_lmbda)
        linear = jnp.einsum("fl,nld->nfd", B, self._semantic(X)) - Y
        return {
            "test_error": test.fit_loss(fit.params) / self.test_samples,
            "train_loss": problem.loss(fit.params),
            **overlaps(fit.params, Q_star),
            "linear_test_error": jnp.sum(linear**2) / (2 * self.dim * self.test_samples),
        }


def overlaps(params: QueryParams, Q_star: Float[Array, " dim"]) -> dict[str, Float[Array, ""]]:
    """``m`` = |1ᵀQ|/d and ``theta`` = |Q*ᵀQ|/d, of Q's first column (the authors' rank one)."""
    q = params.Q[:, 0]
    d = q.shape[0]
    return {"m": jnp.abs(jnp.sum(q)) / d, "theta": jnp.abs(Q_star @ q) / d}
