"""Random Chen–Li teachers: sampling with non-degeneracy checks, diagnostics, stress families.

The non-degeneracy conditions of Chen & Li are not public in full; the checks below are
our reconstruction (docs: The science, "What is sourced and what is reconstructed"). Every threshold
is a field of :class:`TeacherSpec` and is scale-free:

- ``min_w_norm``: min_i ‖W_i‖_F / rms_j ‖W_j‖_F (no vanishing value matrix);
- ``min_separation``: min_{i≠j} ‖Θ_i − Θ_j‖_F / rms_j ‖Θ_j‖_F (heads separated);
- ``min_sigma_ratio``: σ_min(ΣW) / ‖ΣW‖₂ ≥ min_sigma_ratio / dim. The ratio of a square
  Gaussian matrix is of order 1/dim, so a fixed threshold would reject almost every draw at
  dim 16; scaled by 1/dim it accepts a dimension-independent share (about 1 − 2c);
- ``min_theta_sv``: the smallest singular value of the matrix whose rows are
  vec(Θ_i)/‖Θ_i‖_F (the Θ's robustly linearly independent; 1 when orthogonal).

Each ratio has a ceiling (1, 2, dim and 1 in that order) and a threshold above it could never
pass, so it is refused; ``max_attempts`` is at most :data:`MAX_ATTEMPTS`. A teacher whose
draws all fail is still returned (the last draw), flagged: ``TeacherInfo.accepted``,
``teacher_accepted`` in :func:`~mhalearn.simulate` results.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from mhalearn import draws
from mhalearn._validate import arrays, check_shapes, choice, in_range, positive_int
from mhalearn.data import TOKEN_DISTRIBUTIONS, TokenDistribution, sample_tokens
from mhalearn.kernels import attention_weights
from mhalearn.params import LayerParams
from mhalearn.platforms import platform
from mhalearn.solvers import singular_values

Family = Literal["random", "near_duplicate", "ill_conditioned", "rank_one", "two_tokens"]
FAMILIES: tuple[str, ...] = (
    "random",
    "near_duplicate",
    "ill_conditioned",
    "rank_one",
    "two_tokens",
)
"""The teacher families of :class:`TeacherSpec` (``family``): random draws, and the stress
families that each break a non-degeneracy check on purpose."""

# Which non-degeneracy checks a family must pass (the stress families deliberately break some).
CHECKS = ("w_norm", "separation", "sigma_ratio", "theta_sv")
_ENFORCED: dict[str, tuple[str, ...]] = {
    "random": CHECKS,
    "rank_one": CHECKS,
    "two_tokens": CHECKS,
    "near_duplicate": ("w_norm", "sigma_ratio"),
    "ill_conditioned": ("w_norm", "separation", "theta_sv"),
}


#: the most draws a teacher may take (a bound: a spec whose draws cannot pass ends, flagged)
MAX_ATTEMPTS = 100_000


class TeacherSpec(eqx.Module):
    """A random Chen–Li teacher and its inputs.

    Θ_i = (beta/dim)·G_i and W_i = w_scale·H_i/√dim with G, H i.i.d. standard normal, so
    ‖Θ_i‖_F ≈ beta sets the sharpness of attention (beta ≲ 1 near-uniform, ≳ 8 near-hard).

    Structural fields (static): ``heads``, ``dim``, ``tokens``, ``family``, ``inputs``
    (the token distribution, ``"boolean"`` or ``"gaussian"``) and ``max_attempts``. Numbers
    (``beta``, ``w_scale``, thresholds, ``stress_eps``) are PyTree leaves: pass arrays and
    ``vmap`` to sweep them in one compilation.

    Families (stress tests, reconstructed from RESEARCH.md §1):

    - ``"random"``: the draw above, resampled until every check passes.
    - ``"near_duplicate"``: Θ_2 = Θ_1 + stress_eps·(beta/dim)·G (heads nearly coincide; the
      separation and independence checks are not applied). Needs heads >= 2.
    - ``"ill_conditioned"``: W_m = −Σ_{i<m} W_i + stress_eps·w_scale·H/√dim, so ΣW is
      ``stress_eps`` times smaller than each W_i (the "W_2 ≈ −W_1" case; the ΣW check is not
      applied). Needs heads >= 2.
    - ``"rank_one"``: Θ_i = beta·u_i v_iᵀ with u_i, v_i uniform unit vectors.
    - ``"two_tokens"``: the random draw with tokens = 2, where each head is a sigmoid unit
      of the score difference (the regime of the lower bounds). Needs tokens == 2.
    """

    heads: int = eqx.field(static=True)
    dim: int = eqx.field(static=True)
    tokens: int = eqx.field(static=True)
    beta: float | Array = 4.0
    w_scale: float | Array = 1.0
    family: Family = eqx.field(static=True, default="random")
    inputs: TokenDistribution = eqx.field(static=True, default="boolean")
    min_w_norm: float | Array = 0.5
    min_separation: float | Array = 0.5
    min_sigma_ratio: float | Array = 0.1
    min_theta_sv: float | Array = 0.3
    stress_eps: float | Array = 0.05
    max_attempts: int = eqx.field(static=True, default=100)

    def __check_init__(self):
        positive_int("heads", self.heads)
        positive_int("dim", self.dim)
        positive_int("tokens", self.tokens)
        in_range("max_attempts", positive_int("max_attempts", self.max_attempts), 1, MAX_ATTEMPTS)
        choice("family", self.family, FAMILIES)
        choice("inputs", self.inputs, TOKEN_DISTRIBUTIONS)
        in_range("beta", self.beta, 0.0)
        in_range("w_scale", self.w_scale, 0.0, open_low=True)
        # each check compares a ratio that cannot exceed its bound: a larger threshold could
        # never pass (min_sigma_ratio is c in σ_min/σ_max >= c/dim)
        bounds = {"min_w_norm": 1, "min_separation": 2, "min_sigma_ratio": self.dim}
        for name, high in {**bounds, "min_theta_sv": 1}.items():
            in_range(name, getattr(self, name), 0.0, high)
        in_range("stress_eps", self.stress_eps, 0.0)
        if self.family in ("near_duplicate", "ill_conditioned") and self.heads < 2:
            raise ValueError(
                f"family={self.family!r} needs heads >= 2, received heads={self.heads}"
            )
        if self.family == "two_tokens" and self.tokens != 2:
            raise ValueError(
                f"family='two_tokens' needs tokens == 2, received tokens={self.tokens}"
            )


class ParameterDiagnostics(eqx.Module):
    """Scale-free measures of a teacher's (non-)degeneracy; see the module docstring."""

    w_norm: Float[Array, ""]
    """min_i ‖W_i‖_F / rms_j ‖W_j‖_F: no vanishing head."""
    separation: Float[Array, ""]
    """min_{i≠j} ‖Θ_i − Θ_j‖_F / rms_j ‖Θ_j‖_F (inf for one head): separated heads."""
    sigma_ratio: Float[Array, ""]
    """σ_min(ΣW) / ‖ΣW‖₂."""
    theta_sv: Float[Array, ""]
    """σ_min of the rows vec(Θ_i)/‖Θ_i‖_F: robustly independent Θ's."""
    sum_w_norm: Float[Array, ""]
    """‖ΣW‖_F / sqrt(Σ_i ‖W_i‖²_F): about 1 for random heads, about ε when they cancel."""


def parameter_diagnostics(
    theta: Float[Array, "heads dim dim"], W: Float[Array, "heads dim dim"]
) -> ParameterDiagnostics:
    """The scale-free non-degeneracy measures of the layer (Θ, W).

    Raises:
        ValueError: ``theta`` and ``W`` are not both (heads, dim, dim).
    """
    theta, W = arrays(theta=theta, W=W)
    check_shapes(("theta", theta, "heads dim dim"), ("W", W, "heads dim dim"))
    heads = theta.shape[0]
    tiny = jnp.finfo(theta.dtype).tiny
    w_norms = jnp.sqrt(jnp.sum(W**2, axis=(1, 2)))
    t_norms = jnp.sqrt(jnp.sum(theta**2, axis=(1, 2)))
    w_rms = jnp.sqrt(jnp.mean(w_norms**2))
    t_rms = jnp.sqrt(jnp.mean(t_norms**2))

    diff = theta[:, None] - theta[None, :]
    dist = jnp.sqrt(jnp.sum(diff**2, axis=(2, 3)))
    dist = jnp.where(jnp.eye(heads, dtype=bool), jnp.inf, dist)
    sum_w = jnp.sum(W, axis=0)
    s = singular_values(sum_w)
    rows = theta.reshape(heads, -1) / jnp.maximum(t_norms, tiny)[:, None]
    return ParameterDiagnostics(
        w_norm=jnp.min(w_norms) / jnp.maximum(w_rms, tiny),
        separation=jnp.min(dist) / jnp.maximum(t_rms, tiny),
        sigma_ratio=s[-1] / jnp.maximum(s[0], tiny),
        theta_sv=singular_values(rows)[-1],
        sum_w_norm=jnp.sqrt(jnp.sum(sum_w**2)) / jnp.maximum(jnp.sqrt(jnp.sum(w_norms**2)), tiny),
    )


def passes_checks(spec: TeacherSpec, diag: ParameterDiagnostics) -> Bool[Array, ""]:
    """Whether a draw satisfies every check enforced for ``spec.family``."""
    passed = {
        "w_norm": diag.w_norm >= spec.min_w_norm,
        "separation": diag.separation >= spec.min_separation,
        "sigma_ratio": diag.sigma_ratio * spec.dim >= spec.min_sigma_ratio,
        "theta_sv": diag.theta_sv >= spec.min_theta_sv,
    }
    return jnp.all(jnp.stack([passed[c] for c in _ENFORCED[spec.family]]))


def draw_teacher(key: PRNGKeyArray, spec: TeacherSpec) -> LayerParams:
    """One unchecked draw from ``spec``'s family (what :func:`sample_teacher` resamples)."""
    m, d = spec.heads, spec.dim
    dtype = jnp.result_type(float)
    k_theta, k_w, k_extra = jax.random.split(key, 3)
    if spec.family == "rank_one":
        u, v = draws.normal(k_theta, (2, m, d), dtype)
        u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)
        v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
        theta = spec.beta * u[:, :, None] * v[:, None, :]
    else:
        theta = (spec.beta / d) * draws.normal(k_theta, (m, d, d), dtype)
    W = (spec.w_scale / jnp.sqrt(d)) * draws.normal(k_w, (m, d, d), dtype)
    extra = draws.normal(k_extra, (d, d), dtype)
    if spec.family == "near_duplicate":
        theta = theta.at[1].set(theta[0] + spec.stress_eps * (spec.beta / d) * extra)
    elif spec.family == "ill_conditioned":
        cancel = -jnp.sum(W[:-1], axis=0) + spec.stress_eps * (spec.w_scale / jnp.sqrt(d)) * extra
        W = W.at[-1].set(cancel)
    return LayerParams(theta=theta, W=W)


class TeacherInfo(eqx.Module):
    """How a teacher's rejection sampling went."""

    attempts: Int[Array, ""]
    """Draws made (1: the first draw was accepted)."""
    accepted: Bool[Array, ""]
    """False when ``max_attempts`` draws all failed the checks (the last one is returned)."""


class TeacherDraw(NamedTuple):
    """A teacher drawn by rejection sampling, and how the drawing went."""

    teacher: LayerParams
    info: TeacherInfo


#: draws made side by side before the loop, by platform (elsewhere: 4). On a CPU the loop alone
#: draws only what each instance needs; on an accelerator, under ``vmap``, a loop runs the
#: slowest instance's draws for every instance and reports to the host after each, so there
#: the first draws are made at once and the loop runs only for the rare instance that needs more
CANDIDATES: dict[str, int] = {"cpu": 1}


def default_candidates() -> int:
    """The draws made side by side on the platform of the program being traced
    (:func:`~mhalearn.platforms.platform`; :data:`CANDIDATES`)."""
    return CANDIDATES.get(platform(), 4)


def sample_teacher_with_info(
    key: PRNGKeyArray, spec: TeacherSpec, candidates: int | None = None
) -> TeacherDraw:
    """Like :func:`sample_teacher`, also saying how many draws it took and whether it succeeded.

    ``candidates`` draws (``None``: :func:`default_candidates`) are made side by side and the
    first accepted is kept; an instance none of them passes goes on drawing one at a time. The
    teacher and its count of draws do not depend on ``candidates``: draw j is always the one
    from ``fold_in(key, j)``, and the first that passes is returned.
    """
    candidates = positive_int(
        "candidates", default_candidates() if candidates is None else candidates
    )
    candidates = min(candidates, spec.max_attempts)

    def draw(attempt):
        params = draw_teacher(jax.random.fold_in(key, attempt), spec)
        return params, passes_checks(spec, parameter_diagnostics(params.theta, params.W))

    def not_done(carry):
        attempt, _, ok = carry
        return jnp.logical_and(~ok, attempt < spec.max_attempts)

    def step(carry):
        attempt, _, _ = carry
        params, ok = draw(attempt)
        return attempt + 1, params, ok

    if candidates == 1:
        # one copy of the draw in the program, inside the loop (a first draw before it would
        # be a second copy to compile)
        shapes = jax.eval_shape(draw, 0)[0]
        none = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        start = (jnp.asarray(0), none, jnp.asarray(False))
    else:
        drawn, passed = jax.vmap(draw)(jnp.arange(candidates))
        ok = jnp.any(passed)
        # the first that passes; where none does, the last (what the loop returns if it ends)
        first = jnp.where(ok, jnp.argmax(passed), candidates - 1)
        chosen = jax.tree.map(lambda leaf: leaf[first], drawn)
        start = (jnp.where(ok, first + 1, candidates), chosen, ok)
    attempts, params, ok = jax.lax.while_loop(not_done, step, start)
    return TeacherDraw(params, TeacherInfo(attempts=attempts, accepted=ok))


def sample_teacher(key: PRNGKeyArray, spec: TeacherSpec) -> LayerParams:
    """Draw a teacher from ``spec``, resampling until the family's checks pass.

    Draw j uses ``fold_in(key, j)``. Works under ``jit`` and ``vmap`` over keys (and over
    array-valued numbers in ``spec``).

    Args:
        key: the teacher's key.
        spec: its shapes, scale β, family and check thresholds.

    Returns:
        The teacher's :class:`~mhalearn.params.LayerParams` (Θ and W, each heads × dim ×
        dim). If ``spec.max_attempts`` draws all fail, the last one:
        :func:`sample_teacher_with_info` says when that happened.
    """
    return sample_teacher_with_info(key, spec).teacher


class TeacherDiagnostics(eqx.Module):
    """Per-teacher diagnostics: parameter measures and attention statistics on inputs."""

    parameters: ParameterDiagnostics
    mean_max_attention: Float[Array, ""]  # mean over samples, heads, rows of max_k A
    attention_entropy: Float[Array, ""]  # mean over samples, heads, rows of −Σ_k A log A (nats)
    agreement: Float[Array, ""]  # share of rows where every head puts >= 1−δ on one token value


class AttentionStatistics(NamedTuple):
    """How one sequence's heads attend, as means over heads and rows."""

    mean_max_attention: Float[Array, ""]  # of max_k A
    attention_entropy: Float[Array, ""]  # of −Σ_k A log A (nats)
    agreement: Float[Array, ""]  # share of rows where every head puts >= 1−δ on one value


def attention_statistics(
    X: Float[Array, "tokens dim"], theta: Float[Array, "heads dim dim"], delta: float
) -> AttentionStatistics:
    """The mean max weight, mean entropy and share of agreeing rows of one sequence.

    Agreement merges identical tokens: a row agrees when some token value b receives, from
    every head, total weight >= 1 − δ over the positions holding that value.
    """
    A = attention_weights(X, theta)  # (heads, tokens, tokens)
    same = jnp.all(X[:, None, :] == X[None, :, :], axis=-1).astype(A.dtype)  # (keys, keys)
    merged = A @ same  # (heads, rows, b): weight of each row on the value of token b
    agree = jnp.any(jnp.min(merged, axis=0) >= 1 - delta, axis=-1)
    entropy = -jnp.sum(jax.scipy.special.xlogy(A, A), axis=-1)
    return AttentionStatistics(
        jnp.mean(jnp.max(A, axis=-1)), jnp.mean(entropy), jnp.mean(agree.astype(A.dtype))
    )


def teacher_diagnostics(
    key: PRNGKeyArray,
    teacher: LayerParams,
    spec: TeacherSpec,
    samples: int = 512,
    delta: float = 0.1,
) -> TeacherDiagnostics:
    """Diagnostics of ``teacher`` on ``samples`` fresh sequences of ``spec.inputs`` tokens."""
    samples = positive_int("samples", samples)
    in_range("delta", delta, 0.0, 0.5, open_low=True)
    X = sample_tokens(key, spec.inputs, (samples, spec.tokens, spec.dim), teacher.theta.dtype)
    stats = jax.vmap(attention_statistics, in_axes=(0, None, None))(X, teacher.theta, delta)
    mean_max, entropy, agree = (jnp.mean(s) for s in stats)
    return TeacherDiagnostics(
        parameters=parameter_diagnostics(teacher.theta, teacher.W),
        mean_max_attention=mean_max,
        attention_entropy=entropy,
        agreement=agree,
    )
