"""What every number in a results Dataset means: one registry, applied by :func:`annotate`.

Each variable a study or :func:`~mhalearn.simulate` writes gets ``long_name`` (what a figure's
axis says), a one-sentence ``description`` (its definition) and ``units`` where they apply
(``relative``, ``rad``, ``steps``, ``nats``, ``s``). Flags (0/1) also carry the CF attributes
``flag_values`` and ``flag_meanings``. ``trace_NAME`` is NAME at the logged steps,
``info_NAME`` a learner's own diagnostic, ``info_movement_FIELD[_relative]`` how far a
parameter field moved.
"""

from __future__ import annotations

import re
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
        "test 0-1 error", "Share of fresh samples of the mixture whose score has the wrong sign."
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
    # the sculpt study (experiments.sculpt)
    "false_accept": Meta(
        "false accept",
        "1 when the certificate accepted a fit that does not recover the teacher.",
        flag=True,
    ),
    "false_reject": Meta(
        "false reject",
        "1 when the certificate rejected a fit that recovers the teacher.",
        flag=True,
    ),
    "parameter_error": Meta(
        "parameter error ε",
        "The larger of the largest relative errors of a matched Θ_i and of a matched W_i: "
        "recovery within ε.",
    ),
    "error_rate": Meta(
        "rate of ε in N",
        "Slope of log(median parameter error ε over teachers) on log N, least squares over "
        "the N of the grid.",
    ),
    "error_reach": Meta(
        "N where the fitted ε reaches the success tolerance",
        "Where the power law fitted to the median ε reaches ε = success_tol (inf: the fit "
        "does not decrease).",
    ),
    "span_rate": Meta(
        "rate of the span angle in N",
        "Slope of log(median angle of the span estimate (phase 4) over teachers) on log N, "
        "least squares over the N of the grid.",
    ),
    "phase_seconds": Meta(
        "seconds per teacher",
        "Wall seconds per teacher of each phase of the pipeline, each phase compiled "
        "beforehand, over a few teachers of the cell.",
        "s",
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
    # step sizes and curvature (experiments.stepsize)
    "largest_stable_lr": Meta(
        "largest stable step size η",
        "The stable end of the bisection bracket in log η after `halvings` halvings: GD "
        "stays finite and its training loss never rises by more than rise_tol relative over "
        "`steps` steps (0: lr_low unstable; lr_high: lr_high stable).",
    ),
    "smallest_unstable_lr": Meta(
        "smallest unstable step size found",
        "The unstable end of the bisection bracket (inf when lr_high was stable).",
    ),
    "lr_censored": Meta(
        "step size outside the bracket",
        "1 when lr_high was stable or lr_low unstable (the edge lies outside the bracket).",
        flag=True,
    ),
    "loss_star": Meta(
        "training loss at the largest stable η",
        "Training loss of full-batch GD at the instance's own largest stable step size.",
        "nats",
    ),
    "loss_fixed": Meta(
        "training loss at the fixed η",
        "Training loss of full-batch GD at the study's fixed_lr.",
        "nats",
    ),
    "rate_star": Meta(
        "fitted rate of the training loss at the largest stable η",
        "Least-squares slope of log L̂ vs log t over the logged steps t >= rate_from · "
        "train_steps, at the instance's own largest stable step size (theory: −1).",
    ),
    "rate_fixed": Meta(
        "fitted rate of the training loss at the fixed η",
        "Least-squares slope of log L̂ vs log t over the logged steps t >= rate_from · "
        "train_steps, at fixed_lr (theory: −1).",
    ),
    "theory_loss_star": Meta(
        "theory's level 1/(ηTγ²) at the largest stable η",
        "1/(η·T·γ²) with η the instance's largest stable step, T = train_steps and γ its NTK "
        "margin at θ₀ (NaN when not separable); the theory bounds L̂_T by this up to "
        "constants and logarithms.",
        "nats",
    ),
    "theory_loss_fixed": Meta(
        "theory's level 1/(ηTγ²) at the fixed η",
        "1/(η·T·γ²) with η = fixed_lr, T = train_steps and γ the NTK margin at θ₀ (NaN when "
        "not separable).",
        "nats",
    ),
    "hessian_norm": Meta(
        "‖∇²L̂(θ₀)‖", "Spectral norm of the training loss's Hessian at the start (Lanczos)."
    ),
    "score_hessian_norm": Meta(
        "‖∇²Φ(X; θ₀)‖",
        "Mean over the first score_samples training sequences of the spectral norm of the "
        "score's Hessian at the start.",
    ),
    "weak_convexity": Meta(
        "weak-convexity ratio −λ_min(∇²L̂)/L̂",
        "−λ_min(∇²L̂(θ₀)) / L̂(θ₀) at the start (Lanczos).",
    ),
    # generalisation (experiments.samples)
    "gap": Meta("generalisation gap", "Test loss minus training loss.", "nats"),
    "stability_proxy": Meta(
        "stability proxy (η/n)·Σ_t L̂(θ_t)",
        "Step size over samples times the sum of training losses over the steps.",
        "nats",
    ),
    "proxy_bounds_gap": Meta(
        "stability proxy bounds the gap",
        "1 when the generalisation gap is at most the stability proxy (η/n)·Σ_t L̂(θ_t).",
        flag=True,
    ),
    "test_loss_slope": Meta(
        "fitted slope of the test loss in n",
        "Least-squares slope of log(median test loss) vs log n over the sample sizes "
        "(theory under separability: −1); bounds: 95% bootstrap interval over instances.",
    ),
    # NTK margin (experiments.margin)
    # the phase study (experiments/phase.py)
    "failure_optimisation": Meta(
        "optimisation failure",
        "1 when the teacher was not recovered and the fit's training loss exceeds the "
        "teacher's by more than the attribute `tolerance` times mean(Y²), else 0.",
        flag=True,
    ),
    "failure_identification": Meta(
        "non-identified",
        "1 when the teacher was not recovered although the fit's training loss exceeds the "
        "teacher's by at most the attribute `tolerance` times mean(Y²), else 0.",
        flag=True,
    ),
    "success_rate": Meta(
        "share of teachers recovered", "Mean of `success` over the instances of a grid point."
    ),
    "threshold": Meta(
        "recovery threshold N*50",
        "The sample count at which a logistic fit in log N of the success share crosses one "
        "half (NaN when it does not inside the grid).",
    ),
    "threshold_ratio": Meta(
        "recovery threshold N*50/N_c",
        "N*50 divided by the counting limit N_c = 2·heads·dim/tokens.",
    ),
    "fit_seconds": Meta(
        "wall seconds per fit",
        "Wall seconds of the cell up to this budget (its rounds of starts, compilation "
        "included) over its teachers × β: what one teacher's fits cost on the machine that "
        "ran it. A timing, not a result: it changes from run to run.",
        "s",
    ),
    "budget_converged": Meta(
        "threshold converged in the budget",
        "1 when the 95% intervals of N*50 at the two largest budgets overlap, 0 when they do "
        "not (NaN when either is not crossed inside the grid).",
        flag=True,
    ),
    "threshold_converged": Meta(
        "converged recovery threshold N*50",
        "N*50 at the largest budget where it agrees with the next largest (their 95% "
        "intervals overlap); NaN where it does not.",
    ),
    "threshold_converged_ratio": Meta(
        "converged recovery threshold N*50/N_c",
        "The converged N*50 divided by the counting limit N_c = 2·heads·dim/tokens.",
    ),
    "identified": Meta(
        "teacher identified",
        "1 when no fit at the largest budget, of any learner of the study (the oracle's from "
        "the teacher's neighbourhood, the others' from random starts), reaches the teacher's "
        "training loss (within fit_tol) while lying away from the teacher (not recovered, up to "
        "head permutation); 0 when one does. Only a fit can show that the data do not "
        "identify a teacher, so this is an upper bound on identification.",
        flag=True,
    ),
    "identified_rate": Meta(
        "share of teachers identified", "Mean of `identified` over the instances of a point."
    ),
    "threshold_statistical": Meta(
        "statistical threshold N*50",
        "The sample count at which a logistic fit in log N of the share identified crosses "
        "one half (NaN when it does not inside the grid): at least where the data identify "
        "half the teachers, as far as the study's fits can tell.",
    ),
    "threshold_statistical_ratio": Meta(
        "statistical threshold N*50/N_c",
        "The statistical N*50 divided by the counting limit N_c = 2·heads·dim/tokens.",
    ),
    "threshold_gap": Meta(
        "computational over statistical threshold",
        "N*50 of the learner at the largest budget divided by the statistical N*50: how many "
        "times the samples that identify half the teachers the learner needs to recover half.",
    ),
    "growth_power": Meta(
        "power-law rate of N*50/N_c in the heads",
        "k of the least-squares fit log(N*50/N_c) = c + k·log m over the head counts.",
    ),
    "growth_exponential": Meta(
        "exponential rate of N*50/N_c in the heads",
        "s of the least-squares fit log(N*50/N_c) = c + s·m over the head counts.",
    ),
    "growth_exponential_better": Meta(
        "exponential fits better",
        "1 when the exponential fit of N*50/N_c in the heads has the smaller residual sum of "
        "squares, 0 when the power law has.",
        flag=True,
    ),
    "growth_better_share": Meta(
        "share of replicates agreeing on the better fit",
        "Share of bootstrap replicates in which the better growth model also fits better.",
    ),
    "margin": Meta(
        "NTK margin γ at θ₀",
        "γ = 1/√(Σα*) of the hard-margin SVM dual on the NTK Gram matrix (0: not separable).",
    ),
    "separable": Meta(
        "NTK-separable",
        "1 when the SVM solver certified the NTK features as linearly separable.",
        flag=True,
    ),
    "margin_u": Meta(
        "NTK margin γ at θ₀, readout features only",
        "γ of the hard-margin SVM on the Gram matrix of ∂Φ/∂U alone (0: not separable).",
    ),
    "separable_u": Meta(
        "separable by the readout's NTK features",
        "1 when the SVM solver certified the features ∂Φ/∂U as linearly separable.",
        flag=True,
    ),
    # the attention SVM (experiments.max_margin; metrics.selection)
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
        _REL,
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

_MOVEMENT = re.compile(r"info_movement_(?P<field>\w+?)(?P<relative>_relative)?$")
_ONSET = re.compile(r"onset_(?P<phase>\w+)$")
_SPAN = re.compile(r"span_angle_(?P<method>\w+)$")
_BOUND = re.compile(r"(?P<base>\w+)_(?P<side>lower|upper)$")
_STATISTICAL_GROWTH = re.compile(r"growth_statistical_(?P<fit>\w+)$")


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
    statistical = _STATISTICAL_GROWTH.match(name)
    if statistical:
        base = meta(f"growth_{statistical['fit']}")
        if base is None:
            return None
        return Meta(
            f"{base.long_name} (statistical threshold)",
            f"{base.description} Of the statistical threshold N*50/N_c.",
            base.units,
            flag=base.flag,
        )
    onset = _ONSET.match(name)
    if onset:
        return Meta(
            f"onset of {onset['phase'].replace('_', ' ')}",
            "Smallest N of the grid from which the phase's criterion "
            "(mhalearn.experiments.sculpt.ONSETS) holds at every larger N; NaN if not by the "
            "largest.",
        )
    method = _SPAN.match(name)
    if method:
        return Meta(
            f"span angle, {method['method']}",
            "Largest principal angle from span{Θ_i} to the span estimated by the method "
            f"{method['method']!r} from the same K (phase 4).",
            "rad",
        )
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
