"""What every number in a results Dataset means: one registry, applied by :func:`annotate`.

The variables of the tasks, learners and teachers are declared here; each study declares its
own with :func:`register_variables` (and name patterns with :func:`register_pattern`), beside
its computation.

Each variable a study or :func:`~mhalearn.simulate` writes gets ``long_name`` (what a figure's
axis says), a one-sentence ``description`` (its definition) and ``units`` where they apply
(``relative``, ``rad``, ``steps``, ``nats``, ``s``). Flags (0/1) also carry the CF attributes
``flag_values`` and ``flag_meanings``. ``trace_NAME`` is NAME at the logged steps,
``info_NAME`` a learner's own diagnostic, ``info_movement_FIELD[_relative]`` how far a
parameter field moved.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple


class Meta(NamedTuple):
    long_name: str
    description: str
    units: str | None = None
    flag: bool = False


_REL = "relative"

VARIABLES: dict[str, Meta] = {
    # recovery of Chen–Li teachers (tasks.RegressionTask.evaluate)
    "theta_error_max": Meta(
        "largest relative error of a matched Θ_i",
        "max over heads of ‖Θ̂_i − Θ_i‖_F / ‖Θ_i‖_F after Hungarian matching of the heads.",
        _REL,
    ),
    "theta_error_mean": Meta(
        "mean relative error of the matched Θ_i",
        "Mean over heads of ‖Θ̂_i − Θ_i‖_F / ‖Θ_i‖_F after Hungarian matching of the heads.",
        _REL,
    ),
    "w_error_max": Meta(
        "largest relative error of a matched W_i",
        "max over heads of ‖Ŵ_i − W_i‖_F / ‖W_i‖_F after Hungarian matching of the heads.",
        _REL,
    ),
    "w_error_mean": Meta(
        "mean relative error of the matched W_i",
        "Mean over heads of ‖Ŵ_i − W_i‖_F / ‖W_i‖_F after Hungarian matching of the heads.",
        _REL,
    ),
    "sum_w_error": Meta(
        "relative error of ΣW",
        "‖Σ_i Ŵ_i − Σ_i W_i‖_F / ‖Σ_i W_i‖_F (no matching needed).",
        _REL,
    ),
    "span_angle": Meta(
        "largest principal angle between the spans of the Θ's",
        "Largest principal angle between span{Θ̂_i} and span{Θ_i} (0: the same subspace).",
        "rad",
    ),
    "prediction_error": Meta(
        "squared normalised prediction error",
        "The squared ratio Σ_n ‖F̂(X_n) − F(X_n)‖²_F / Σ_n ‖F(X_n)‖²_F on fresh inputs of the "
        "training distribution.",
        _REL,
    ),
    "prediction_error_other": Meta(
        "squared normalised prediction error, other inputs",
        "The squared ratio Σ_n ‖F̂(X_n) − F(X_n)‖²_F / Σ_n ‖F(X_n)‖²_F on fresh inputs of the "
        "other distribution (Boolean ↔ Gaussian).",
        _REL,
    ),
    "success": Meta(
        "recovered",
        "1 when every matched Θ_i and W_i is within the relative Frobenius error given by the "
        "attribute `tolerance`, else 0.",
        flag=True,
    ),
    "teacher_accepted": Meta(
        "teacher passed its checks",
        "1 when the teacher's draw passed the family's non-degeneracy checks within "
        "max_attempts draws; 0 when every draw failed and the last one was used.",
        flag=True,
    ),
    # losses and errors (both tasks)
    "train_loss": Meta(
        "training loss",
        "The training objective at the fitted parameters: the mean squared error over every "
        "entry for regression, the mean logistic loss log(1 + exp(−y·Φ(X))) for "
        "classification.",
    ),
    "train_excess": Meta(
        "training loss above the teacher's",
        "(training loss of the fit − training loss of the teacher) / mean(Y²) on the training "
        "set: at most ~0 when the fit explains the training data as well as the truth does.",
        _REL,
    ),
    "train_error": Meta(
        "training 0-1 error", "Share of training samples whose score has the wrong sign."
    ),
    "test_loss": Meta(
        "test logistic loss",
        "Mean logistic loss log(1 + exp(−y·Φ(X))) on fresh samples of the mixture.",
        "nats",
    ),
    "test_error": Meta(
        "test error",
        "On fresh samples: for the classification task the share whose score has the wrong "
        "sign (0-1 error); for the positional–semantic model (mhalearn.solvable) Σ(ŷ − y)²/(2d) "
        "per sequence (Cui et al.'s normalisation).",
    ),
    "relevant_attention": Meta(
        "attention on relevant tokens",
        "Mean over held-out samples, active heads and queries of the attention weight on the "
        "positions that carry the label's mean.",
    ),
    "active_heads": Meta(
        "active heads H", "Number of heads the mask leaves on (the model's head count H)."
    ),
    # learner status (learners.base.Status)
    "diverged": Meta(
        "diverged",
        "1 when the loss or the parameters became non-finite and the instance was frozen.",
        flag=True,
    ),
    "diverged_at": Meta(
        "step of divergence", "The step whose update was not finite; -1 when none.", "steps"
    ),
    "converged": Meta(
        "stopped at the tolerance",
        "1 when the learner stopped early because its loss reached its tolerance.",
        flag=True,
    ),
    "steps_taken": Meta(
        "steps taken", "Updates (or solver iterations) the learner applied.", "steps"
    ),
    # GD diagnostics (learners.gd)
    "info_loss_sum": Meta(
        "sum of training losses over the steps",
        "Σ_t L̂(θ_t) over every applied update: the stability proxy is lr/samples times it.",
    ),
    # variable projection (learners.varpro)
    "info_starts": Meta(
        "random starts run",
        "Starts variable projection ran, one after another until one fitted the data.",
    ),
    # the certify-and-sculpt pipeline (learners.chen_li, a reconstruction)
    "info_rows_certified": Meta(
        "certified rows", "Output rows certified as all heads attending one token value."
    ),
    "info_rows_certified_heads": Meta(
        "rows certified head by head",
        "Output rows certified as each head attending one token (the heads' tokens alike or "
        "not), from each head's estimated values: the rows of the heads' own bodies K_i.",
    ),
    "info_constraints_kept": Meta(
        "constraints in K", "Linear constraints of the polyhedron K kept from certified rows."
    ),
    "info_min_norm": Meta("‖min-norm point of K‖", "Frobenius norm of the min-norm point of K."),
    "info_span_cost": Meta(
        "cost after the search inside the span",
        "Training cost of the chosen candidate at the end of its search restricted to the "
        "estimated span (before the unrestricted polish).",
    ),
    "info_candidate_cost": Meta(
        "cost of the chosen candidate", "Training cost of the chosen candidate after the polish."
    ),
    "info_candidates_accepted": Meta(
        "candidates with a certificate",
        "Candidates that fit the data and satisfy K (within the slack).",
    ),
    "info_accepted": Meta(
        "certificate accepted",
        "1 when some candidate fits the data and satisfies K; 0 when none does.",
        flag=True,
    ),
    "crude_sum_w_error": Meta(
        "relative error of the crude ΣW",
        "‖M₀ − ΣW‖_F / ‖ΣW‖_F of the input–label correlation estimate M₀ (phase 1).",
        _REL,
    ),
    "refined_sum_w_error": Meta(
        "relative error of the refined ΣW",
        "‖S − ΣW‖_F / ‖ΣW‖_F of the least-squares refit on certified rows (phase 3).",
        _REL,
    ),
    "values_error": Meta(
        "largest relative error of a head's estimated values",
        "max over heads of ‖Ŵ_i − W_i‖_F / ‖W_i‖_F of the per-head values fitted for the "
        "heads' own bodies, the heads paired on the values alone.",
        _REL,
    ),
    "certified_sound": Meta(
        "share of certified rows that are sound",
        "Share of certified rows on which every true head puts at least 1 − δ on the "
        "certified token value (NaN when no row is certified).",
    ),
    "min_norm_in_span": Meta(
        "share of the min-norm point inside span{Θ_i}",
        "‖projection of the min-norm point of K on span{Θ_i}‖ / ‖min-norm point‖.",
    ),
    "span_angle_estimate": Meta(
        "largest principal angle of the span estimate",
        "Largest principal angle from span{Θ_i} to the estimated span the search used (phase 4).",
        "rad",
    ),
    "truth_in_k": Meta(
        "truth inside K",
        "1 when every true Θ_i satisfies every constraint of the polyhedron K (phase 3).",
        flag=True,
    ),
    "truth_in_head_bodies": Meta(
        "truth inside each head's own body",
        "1 when every true Θ_i satisfies every constraint of the body K_i of the estimated "
        "head it is paired with (on the values), for the heads' span methods.",
        flag=True,
    ),
    "k_tilt": Meta(
        "K's tilt at the heads",
        "Median over the heads and 16 fixed random directions orthogonal to span{Θ_i} of the "
        "largest angle by which a true head can turn that way and still satisfy every "
        "constraint of K: K's resolution at the heads (0 when a head is outside K).",
        "rad",
    ),
    # the solvable models of the literature (mhalearn.solvable), as their authors measure them
    "mse": Meta(
        "AIM error ‖S − S*‖²_F/D",
        "Squared Frobenius distance between the student's attention matrix S = WᵀW/√(R·D) and "
        "the teacher's, over D (Boncoraglio et al.'s normalisation).",
    ),
    "m": Meta(
        "positional overlap m",
        "|1ᵀQ|/d: the overlap of the student's query with the positional direction.",
    ),
    "theta": Meta(
        "semantic overlap θ",
        "|Q*ᵀQ|/d: the overlap of the student's query with the teacher's semantic direction.",
    ),
    "linear_test_error": Meta(
        "linear baseline's test error",
        "Test error (normalised as test_error) of the positional–semantic model's linear "
        "baseline ŷ = B·z, the ridge minimiser of its training loss on the same sequences "
        "(Cui et al.'s baseline, in closed form).",
    ),
    # teacher regimes (teachers.teacher_diagnostics)
    "mean_max_attention": Meta(
        "mean max attention weight",
        "Mean over samples, heads and rows of the largest attention weight of the row.",
    ),
    "attention_entropy": Meta(
        "attention entropy", "Mean over samples, heads and rows of −Σ_k A log A.", "nats"
    ),
    "agreement": Meta(
        "share of rows where all heads agree",
        "Share of output rows on which every head puts at least 1 − delta on one token value.",
    ),
    "sigma_ratio": Meta(
        "σ_min(ΣW) / ‖ΣW‖₂", "Smallest over largest singular value of Σ_i W_i.", _REL
    ),
    "separation": Meta(
        "head separation",
        "min_{i≠j} ‖Θ_i − Θ_j‖_F / rms_j ‖Θ_j‖_F (inf for one head).",
        _REL,
    ),
    "theta_sv": Meta(
        "independence of the Θ's",
        "Smallest singular value of the matrix whose rows are vec(Θ_i)/‖Θ_i‖_F.",
    ),
    "attempts": Meta("teacher draws", "Draws made until the checks passed (1: the first)."),
}

#: name patterns (a compiled regex, and the meaning of a name it matches, or None)
PATTERNS: list[tuple[re.Pattern, Callable[[re.Match], Meta | None]]] = []


def register_variables(entries: dict[str, Meta]) -> None:
    """Declare the meaning of each variable of ``entries`` (a study's own variables).

    Raises:
        ValueError: a name declared already with another meaning."""
    for name, entry in entries.items():
        if VARIABLES.get(name, entry) != entry:
            raise ValueError(f"variable {name!r} is declared already, with another meaning")
    VARIABLES.update(entries)


def register_pattern(pattern: str, make: Callable[[re.Match], Meta | None]) -> None:
    """Declare the meaning of every variable whose name matches ``pattern`` (a regex, matched
    from the start): ``make(match)``, or None for a name it does not describe."""
    PATTERNS.append((re.compile(pattern), make))


_MOVEMENT = re.compile(r"info_movement_(?P<field>\w+?)(?P<relative>_relative)?$")
_BOUND = re.compile(r"(?P<base>\w+)_(?P<side>lower|upper)$")


def meta(name: str) -> Meta | None:
    """The registered meaning of a variable (``None`` if it has none)."""
    if name in VARIABLES:
        return VARIABLES[name]
    if name.startswith("trace_"):
        inner = "train_loss" if name == "trace_loss" else name[len("trace_") :]
        base = meta(inner)
        if base is None:
            return None
        return Meta(base.long_name, f"At each logged step: {base.description}", base.units)
    bound = _BOUND.match(name)
    if bound and bound["base"] in VARIABLES:
        base = VARIABLES[bound["base"]]
        return Meta(
            f"{base.long_name}, {bound['side']} 95% bound",
            f"The {bound['side']} end of the 95% interval of: {base.description}",
            base.units,
        )
    for pattern, make in PATTERNS:
        found = pattern.match(name)
        if found and (made := make(found)) is not None:
            return made
    moved = _MOVEMENT.match(name)
    if moved:
        field = moved["field"]
        if moved["relative"]:
            return Meta(
                f"relative movement of {field}",
                f"‖{field}_T − {field}_0‖_F / ‖{field}_0‖_F (inf when it started at zero).",
                _REL,
            )
        return Meta(f"movement of {field}", f"‖{field}_T − {field}_0‖_F over training.")
    return None


def attributes(name: str) -> dict[str, Any]:
    """The attributes :func:`annotate` gives variable ``name`` (``long_name`` only, from the
    name, when it is not registered: a learner's own diagnostic)."""
    m = meta(name)
    if m is None:
        return {"long_name": name.replace("_", " "), "description": "Not documented."}
    out: dict[str, Any] = {"long_name": m.long_name, "description": m.description}
    if m.units is not None:
        out["units"] = m.units
    if m.flag:
        out["flag_values"] = [0, 1]
        out["flag_meanings"] = "false true"
    return out


def annotate(ds, extra: dict[str, dict[str, Any]] | None = None):
    """``ds`` with every data variable's attributes set (``extra``: more attributes by
    variable name, e.g. ``{"success": {"tolerance": 1e-3}}``). Returns ``ds``."""
    extra = extra or {}
    for name in ds.data_vars:
        ds[name].attrs.update(attributes(str(name)))
        ds[name].attrs.update(extra.get(str(name), {}))
    return ds
