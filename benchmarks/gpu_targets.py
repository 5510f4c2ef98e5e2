"""The accelerator engine's three targets, judged from the rows one run of gpu_check.sh wrote.

    python benchmarks/gpu_targets.py --since 2026-12-07T06:00:00+00:00

Reads the rows stamped at or after ``--since`` (``benchmarks/gpu_check.sh`` passes its start)
from the results folder (``benchmarks/results``, or ``MHALEARN_BENCH_RESULTS``) and prints,
per target, the measured figure, the target and whether it is met:

1. **end to end**: ``compare.csv``'s engine (``mhalearn``: drawing, fitting, scoring) in
   instance-steps per second against ``jax_naive`` (``jit(vmap(scan))``) at every shape of the
   run: met where it is faster at every shape;
2. **the fit alone**: ``throughput.csv``'s ``fit_pct_of_ceiling`` (the GD fit through the
   engine, against the float32 product rate at 'highest' measured in the same run) at the
   standard shape with at least 16384 instances: met at 30% or more;
3. **variable projection**: ``recovery_speed.csv``'s seconds per recovered teacher in the
   steady state (the compiled program's run, compilation apart: what a study of many cells
   pays per teacher) against the 2-core CPU's, read from the rows recorded in
   ``benchmarks/results/recovery_speed.csv`` at the same cell and number of teachers: met at
   20 times fewer seconds or better. Cold wall time (compilation included) is printed beside.

Then, not a target but the choice it leaves to make: ``fused.csv``'s fastest variant of the
fused kernel (form, recomputing or keeping each head's attention, tile rows, warps) against
the XLA kernel, at the shape of the latest XLA row (the standard shape on a GPU), and the
settings of ``mhalearn.fused`` that would make full-batch GPU steps take it where faster.

    python benchmarks/gpu_targets.py --since ... --choose-fused

prints that choice alone, in the form ``benchmarks/_common.py`` reads from
``MHALEARN_BENCH_FUSED`` (``off``, or ``FORM,keep|recompute,TILE_ROWS,WARPS``):
``gpu_check.sh`` times the fused kernel first and runs every later step with the engine so
set, so that the targets are judged on the engine as that timing would ship it. Each target's
line says what the full-batch steps of its rows ran through.

The rows' device kind is printed with each figure; on a CPU (``gpu_check.sh --cpu``) the
figures are a trial of the script and judge nothing. Exit status 1 where a target's rows are
missing, 0 otherwise, whatever the verdicts.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, STANDARD

from mhalearn.learners.reduced import chunk_rows

#: the recorded rows of the 2-core CPU that variable projection's target compares against
RECORDED = Path(__file__).resolve().parent / "results" / "recovery_speed.csv"
CELL = ("dim", "tokens", "heads", "samples", "teachers")
TARGETS = dict(end_to_end=1.0, fit_pct=30.0, fit_instances=16384, varpro_speedup=20.0)


def read(path: Path, since: str = "") -> list[dict]:
    """The rows of a results file stamped at or after ``since`` (ISO times sort as text)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["timestamp"] >= since]


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def end_to_end(rows: list[dict]) -> list[str]:
    by_shape: dict[tuple, dict[str, float]] = {}
    for row in rows:
        shape = tuple(int(row[k]) for k in ("heads", "dim", "tokens", "samples", "instances"))
        by_shape.setdefault(shape, {})[row["impl"]] = float(row["inst_steps_per_s"])
    ratios = {
        shape: rates["mhalearn"] / rates["jax_naive"]
        for shape, rates in by_shape.items()
        if {"mhalearn", "jax_naive"} <= set(rates)
    }
    if not ratios:
        raise LookupError("compare.csv: no shape with both mhalearn and jax_naive rows")
    kind = f"{rows[0]['device_kind']}, full-batch steps through {_steps(rows[0])}"
    lines = [
        f"  (heads, dim, tokens, samples, instances) {shape}: {ratio:.3g}× jax_naive"
        for shape, ratio in ratios.items()
    ]
    worst = min(ratios.values())
    head = (
        f"1. end to end on {kind}: the slowest shape at {worst:.3g}× jit(vmap(scan)) "
        f"(target: above {TARGETS['end_to_end']:g}× at every shape): {verdict(worst > 1.0)}"
    )
    return [head, *lines]


def fit_alone(rows: list[dict], instances: int) -> list[str]:
    large = [
        row
        for row in rows
        if row.get("fit_pct_of_ceiling")
        and all(int(row[k]) == v for k, v in STANDARD.items())
        and int(row["instances"]) >= instances
    ]
    if not large:
        raise LookupError(
            f"throughput.csv: no fit-alone row at the standard shape with at least "
            f"{instances} instances"
        )
    best = max(large, key=lambda row: float(row["fit_pct_of_ceiling"]))
    pct = float(best["fit_pct_of_ceiling"])
    return [
        f"2. the fit alone on {best['device_kind']} through {_steps(best)}, standard shape, "
        f"{best['instances']} "
        f"instances: {pct:.3g}% of the float32 ceiling ({float(best['ceiling_gflops']):.0f} "
        f"GFLOP/s at '{best['precision']}') (target: {TARGETS['fit_pct']:g}%): "
        f"{verdict(pct >= TARGETS['fit_pct'])}"
    ]


def varpro(rows: list[dict], recorded: list[dict]) -> list[str]:
    lines = []
    for row in (r for r in rows if r["learner"] == "varpro"):
        cell = {k: row[k] for k in CELL}
        cpu = [
            r
            for r in recorded
            if r["learner"] == "varpro"
            and r["device_kind"] == "cpu"
            and r["cores"] == "2"
            # the CPU's own chunks: a row before the column existed, or one with them
            and r.get("chunk_rows") in (None, "", str(chunk_rows("cpu")))
            and all(r[k] == v for k, v in cell.items())
        ]
        if not cpu:
            lines.append(f"3. variable projection at {cell}: no 2-core CPU row recorded there")
            continue
        ref = cpu[-1]  # the latest recorded
        speedup = float(ref["s_per_recovered_steady"]) / float(row["s_per_recovered_steady"])
        cold = float(ref["s_per_recovered_wall"]) / float(row["s_per_recovered_wall"])
        lines.append(
            f"3. variable projection on {row['device_kind']} at {cell}: "
            f"{float(row['s_per_recovered_steady']):.3g} s per recovered teacher in the steady "
            f"state ({row['recovered']} of {row['teachers']} recovered) against the 2-core "
            f"CPU's {float(ref['s_per_recovered_steady']):.3g} s ({ref['timestamp']}): "
            f"{speedup:.3g}× (target: {TARGETS['varpro_speedup']:g}×): "
            f"{verdict(speedup >= TARGETS['varpro_speedup'])}; cold wall time, compilation "
            f"included, {cold:.3g}×"
        )
    if not lines:
        raise LookupError("recovery_speed.csv: no variable projection row")
    return lines


#: the largest relative difference from the XLA kernel's results of a fused variant that may
#: be chosen (float32 rounding over a full-batch sum)
AGREE = 1e-4


def _agrees(row: dict) -> bool:
    return float(row["max_rel_diff"]) <= AGREE


def fastest_fused(rows: list[dict]) -> tuple[dict, dict, list[dict], dict]:
    """(the latest XLA row, the fastest fused variant's row at its shape, the variants left
    out there, the shape): a variant that failed, or whose results differ from the XLA
    kernel's by more than float32 rounding, is not a choice."""
    xla = [r for r in rows if r["kernel"] == "xla"]
    if not xla:
        raise LookupError("fused.csv: no XLA row")
    keys = (*STANDARD, "instances")  # the latest XLA row's shape (the standard one on a GPU)
    shape = {k: int(xla[-1][k]) for k in keys}
    fused = [
        r
        for r in rows
        if r["kernel"].startswith("fused_") and all(int(r[k]) == v for k, v in shape.items())
    ]
    unfit = [r for r in fused if not r.get("us_per_instance") or not _agrees(r)]
    fused = [r for r in fused if r not in unfit]
    if not fused:
        why = f" ({len(unfit)} failed or disagreed: {unfit[0].get('error') or 'disagreed'})"
        raise LookupError(
            f"fused.csv: no fused row that ran and agreed at {shape}" + why * bool(unfit)
        )
    return xla[-1], min(fused, key=lambda r: float(r["us_per_instance"])), unfit, shape


def _variant(row: dict) -> tuple[str, bool]:
    """(form, recompute) of a fused row's kernel name."""
    name = row["kernel"].removeprefix("fused_")
    return name.removesuffix("_recompute"), name.endswith("_recompute")


def choose_fused(rows: list[dict]) -> str:
    """The setting the engine's later timings take (``_common.FUSED_ENV``'s form): the fastest
    fused variant where it ran on a GPU faster than the XLA kernel, else ``off``."""
    xla, best, _, _ = fastest_fused(rows)
    if best["device_kind"] == "cpu" or float(xla["us_per_instance"]) <= float(
        best["us_per_instance"]
    ):
        return "off"
    form, recompute = _variant(best)
    keep = "recompute" if recompute else "keep"
    return f"{form},{keep},{best['tile_rows']},{best['warps']}"


def fused_choice(rows: list[dict]) -> list[str]:
    xla, best, unfit, shape = fastest_fused(rows)
    ref, us = float(xla["us_per_instance"]), float(best["us_per_instance"])
    form, recompute = _variant(best)
    settings = (
        f"FORM = {form!r}, RECOMPUTE = {recompute}, "
        f"TILE_ROWS = {best['tile_rows']}, WARPS = {best['warps']}, FUSED_ON_GPU = True"
    )
    ratio = ref / us
    lines = [
        f"the fused kernel on {best['device_kind']} at {shape} (a choice, not a target): "
        f"the fastest, {best['kernel']} "
        f"({best['tile_rows']} rows, {best['warps']} warps), {us:.3g} µs per instance "
        f"against the XLA kernel's {ref:.3g} µs: {ratio:.3g}×",
    ]
    for r in unfit:
        why = r.get("error") or f"differs from the XLA kernel by {float(r['max_rel_diff']):.3g}"
        lines.append(f"  left out: {r['kernel']} on {r['warps']} warps: {why}")
    if best["device_kind"] == "cpu":
        lines.append("  on a CPU the fused kernel runs in interpret mode: no choice to make")
    elif ratio > 1:
        lines.append(f"  faster: in mhalearn/fused.py set {settings}")
    else:
        lines.append("  not faster: keep FUSED_ON_GPU = False")
    return lines


def _steps(row: dict) -> str:
    """What a row's full-batch GPU steps ran through (its ``fused_on_gpu``; older rows,
    written before the column, ran with the kernel off)."""
    setting = row.get("fused_on_gpu") or "off"
    return "the XLA kernel" if setting == "off" else f"the fused kernel ({setting})"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--since", default="", help="the earliest timestamp read (ISO, UTC)")
    p.add_argument(
        "--choose-fused",
        action="store_true",
        help="print only the fused kernel's setting for the later steps (off, or "
        "FORM,keep|recompute,TILE_ROWS,WARPS) from fused.csv, and exit",
    )
    p.add_argument(
        "--fit-instances",
        type=int,
        default=TARGETS["fit_instances"],
        help="the fewest instances of the fit-alone row (default %(default)s; a trial's fewer)",
    )
    args = p.parse_args()
    if args.choose_fused:
        try:
            print(choose_fused(read(RESULTS / "fused.csv", args.since)))
        except LookupError as e:
            print(f"off ({e})", file=sys.stderr)
            print("off")
        return
    print(f"rows from {RESULTS} stamped at or after {args.since or 'any time'}")
    judged = {
        "compare": end_to_end,
        "throughput": lambda rows: fit_alone(rows, args.fit_instances),
        "recovery_speed": lambda rows: varpro(rows, read(RECORDED)),
        "fused": fused_choice,
    }
    missing = []
    for name, judge in judged.items():
        try:
            print("\n".join(judge(read(RESULTS / f"{name}.csv", args.since))))
        except LookupError as e:
            missing.append(str(e))
            print(f"missing: {e}")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
