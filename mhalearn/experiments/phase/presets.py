"""The phase study's grids and named sizes: notebook 09's main diagram, its hard families and
its sections, each at a small size (CI) and at full size."""

from __future__ import annotations

from typing import Any

#: the β × N diagram's grid of N/N_c: ten values, log-spaced from 0.5 to 32
RATIOS = (0.5, 0.794, 1.26, 2.0, 3.17, 5.04, 8.0, 12.7, 20.2, 32.0)
#: the heads diagram's grid of N/N_c: powers of √2 from 0.5 to 8, both thresholds inside
HEADS_RATIOS = (0.5, 0.707, 1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0)

#: notebook 09's main diagram: the statistical and converged computational thresholds vs heads
#: 1–6 (variable projection from random starts beside the oracle on the same 256 teachers per
#: point, dim 8, β 4), budgets 1, 4, 16 × each learner's default starts, the larger two only at
#: N/N_c in [1.8, 4.5], around the computational crossing
FULL: dict[str, Any] = dict(
    learner=("varpro", "oracle"),
    ratio=HEADS_RATIOS,
    heads=(1, 2, 3, 4, 5, 6),
    dim=(8,),
    inputs=("boolean",),
    beta=(4.0,),
    budget=(1.0, 4.0, 16.0),
    ladder=(1.8, 4.5),
    steps=3000,
    instances=256,
    bootstrap=1000,
)
#: the hard teacher families at the main diagram's size (near_duplicate and ill_conditioned
#: from two heads, two_tokens at two tokens)
FAMILIES: dict[str, dict[str, Any]] = {
    "rank_one": dict(family="rank_one"),
    "near_duplicate": dict(family="near_duplicate", heads=(2, 3, 4, 5, 6)),
    "ill_conditioned": dict(family="ill_conditioned", heads=(2, 3, 4, 5, 6)),
    "two_tokens": dict(family="two_tokens", tokens=2),
}
#: the β × N diagram at heads 1–3 (256 teachers, one budget): the base of the variants below
DIAGRAM: dict[str, Any] = dict(
    learner=("varpro",),
    ratio=RATIOS,
    heads=(1, 2, 3),
    dim=(8,),
    inputs=("boolean",),
    beta=(1.0, 4.0, 16.0),
    steps=3000,
    instances=256,
    bootstrap=1000,
)
#: notebook 09's small size: its full size's learners and budget ladder on a small grid
SMALL: dict[str, Any] = dict(
    ratio=(0.5, 2.0, 8.0), heads=(1, 2), dim=(4,), beta=(4.0,), budget=(1.0, 2.0), instances=8
)

#: the study's named sizes (:attr:`Phase.presets`)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        learner=("varpro", "adam", "oracle"),
        ratio=(0.5, 4.0, 16.0),
        budget=(1.0, 2.0),
        heads=(1, 2),
        dim=(4,),
        beta=(1.0, 4.0),
        steps=20,
        instances=4,
        bootstrap=50,
    ),
    # notebook 09's sizes: small (CI) and full, each with its variants
    "small": {**FULL, **SMALL},
    **{
        f"small_{name}": {**FULL, **SMALL, **family, "heads": (2,), "instances": 4}
        for name, family in FAMILIES.items()
    },
    "small_beta": {**DIAGRAM, **SMALL, "beta": (1.0, 4.0), "budget": (1.0,)},
    "small_learners": {
        **DIAGRAM,
        **SMALL,
        "learner": ("adam", "chen_li", "chen_li_pure"),
        "ratio": (2.0, 8.0),
        "budget": (1.0,),
        "steps": 300,
        "instances": 4,
    },
    "small_gaussian": {
        **DIAGRAM,
        **SMALL,
        "inputs": ("gaussian",),
        "ratio": (2.0, 8.0),
        "budget": (1.0,),
        "instances": 4,
    },
    "small_dim": {
        **DIAGRAM,
        **SMALL,
        "ratio": (2.0, 8.0),
        "heads": (2,),
        "dim": (3, 4),
        "budget": (1.0,),
        "instances": 4,
    },
    "full": FULL,
    **{f"full_{name}": {**FULL, **family} for name, family in FAMILIES.items()},
    "full_beta": DIAGRAM,
    # the slower learners beside variable projection on the same teachers, heads 1–4 at β 4:
    # the pipeline in its hybrid (polished) mode and in its pure mode
    "full_learners": {
        **DIAGRAM,
        "learner": ("varpro", "adam", "chen_li", "chen_li_pure"),
        "heads": (1, 2, 3, 4),
        "beta": (4.0,),
        "instances": 64,
    },
    "full_gaussian": {**DIAGRAM, "inputs": ("gaussian",)},
    # the threshold vs dim at two heads
    "full_dim": {**DIAGRAM, "dim": (4, 8, 16), "heads": (2,), "beta": (4.0,)},
}
