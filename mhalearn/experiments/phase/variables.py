"""The phase study's own variables (its thresholds, failure kinds and growth fits)."""

from __future__ import annotations

from mhalearn.variables import Meta, meta, register_pattern, register_variables

register_variables(
    {
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
            "not (NaN when either is not crossed inside the grid, or crosses outside the "
            "ladder's window, where the larger budgets did not run).",
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
            "1 when no fit at the largest budget, of any learner of the study (the oracle's "
            "from the teacher's neighbourhood, the others' from random starts), reaches the "
            "teacher's training loss (within fit_tol) while lying away from the teacher (not "
            "recovered, up to head permutation); 0 when one does. Only a fit can show that the "
            "data do not identify a teacher, so this is an upper bound on identification.",
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
    }
)


def _statistical_growth(found):
    """``growth_statistical_FIT``: the growth fit FIT of the statistical threshold."""
    base = meta(f"growth_{found['fit']}")
    if base is None:
        return None
    return Meta(
        f"{base.long_name} (statistical threshold)",
        f"{base.description} Of the statistical threshold N*50/N_c.",
        base.units,
        flag=base.flag,
    )


register_pattern(r"growth_statistical_(?P<fit>\w+)$", _statistical_growth)
