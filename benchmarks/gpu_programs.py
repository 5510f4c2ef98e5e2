"""The engine's programs as a GPU would run them, counted on a machine without one: the kernels
one run launches and the times the host must read a value back before it can go on, beside
compare.py's ``jit(vmap(scan))`` at the same shapes.

    pip install -e ".[gpu-compile]"            # JAX's CUDA plugin alone: no driver, no CUDA
    python benchmarks/gpu_programs.py          # compare.py's four shapes, 50 GD steps
    python benchmarks/gpu_programs.py --fused  # full-batch steps through the fused kernel
    python benchmarks/gpu_programs.py --varpro # variable projection, the GPU check's cell

Each program is compiled by the XLA GPU compiler of the installed jaxlib for a compile-only
device (its facts in ``benchmarks/devices/h100_sxm.txtpb``, an H100), with the engine's choices
as on a GPU (its teachers' first draws side by side; the fused kernel with ``--fused``), and
its scheduled HLO is read:

- **launches**: every kernel (a fusion, a library or Triton call, a copy), as many times as the
  loops around it run;
- **host reads**: every loop condition and branch predicate the host must read back from the
  GPU before it can choose the next kernel, which drains the queue of launched kernels; a loop
  whose trip count the compiler knows (a ``scan``, a ``fori_loop`` of fixed bounds) runs its
  body that many times without one.

At the studies' small shapes a GPU's time goes to these more than to arithmetic: on the H200
of 2026-12-04 (``results/gpu_check_h200.log``), ``jit(vmap(scan))`` at the phase cells' shape
(2, 8, 4, 32, 1024 instances) took 8.5 ms, for 906 launches and no read by this count. So the
counts say where the engine must lose to the baseline before a GPU runs it. They are counts,
not times: a kernel at the standard shape with 16384 instances is bound by its arithmetic and
memory, and XLA may replay a run of kernels as one CUDA graph.

Loops whose trip count the compiler does not know are counted as they run in this workload:
the teacher's rejection loop after its side-by-side draws as many times as its slowest
instance needs (its draws are made here on the CPU: the teachers are the same on every
platform), and the fit's loop of whole blocks ``n // check_every`` times in a snapshot
interval of n steps (no instance stops early at a fixed step size). A branch of the fit's
last steps of an interval is counted where its bit of ``n % check_every`` is set.

``--varpro`` counts instead one start of the registered variable projection (its whole
budget of Levenberg–Marquardt iterations) vmapped over 256 teachers of
``recovery_speed.py``'s first cell in float64, as the GPU check times it, once with the
chunks of the Gauss–Newton sums a CPU takes and once with an accelerator's
(``mhalearn.learners.reduced.CHUNK_ROWS``), with the program's temporary memory per teacher
from its memory analysis. Prints one table and appends its rows to
``benchmarks/results/gpu_programs.csv``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import sys
from pathlib import Path
from unittest.mock import patch

# the programs are compiled for a GPU and never run: JAX's own devices are the CPU's, and the
# CUDA plugin then registers without looking for a driver
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STANDARD, append_rows, gd_workload, machine, table
from compare import SHAPES, naive_loss

import mhalearn as mh
from mhalearn import fused, teachers
from mhalearn.learners import make_learner, reduced
from mhalearn.platforms import lowering_for_gpu, tracing_for
from mhalearn.simulate import _fit_and_score, instance_keys

TARGET = Path(__file__).resolve().parent / "devices" / "h100_sxm.txtpb"
#: instructions that launch no kernel
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "opt-barrier",
    "after-all", "add-dependency", "partition-id", "replica-id",
}  # fmt: skip
_OP = re.compile(r"=\s.*?\s([a-z][\w\-]*)\(")


def gpu_device(target: Path = TARGET) -> jax.Device:
    """A compile-only GPU of the installed CUDA plugin, described by ``target``."""
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            platform="cuda", topology="1x1x1", target_config=target.read_text()
        )
    except (NotImplementedError, RuntimeError) as err:
        raise SystemExit(
            f"no compile-only GPU ({err}): install JAX's CUDA plugin, "
            'pip install -e ".[gpu-compile]"'
        ) from err
    return topology.devices[0]


class Hlo:
    """A compiled program's scheduled HLO: its computations, their instructions, and the
    function each instruction was traced in."""

    def __init__(self, text: str):
        self.computations: dict[str, list[str]] = {}
        self.entry = ""
        current = section = None
        tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
        for line in text.splitlines():
            if line in ("FunctionNames", "FileLocations", "StackFrames"):
                section = line
                continue
            row = re.match(r"^(\d+) (.*)$", line)
            if section and row:
                tables[section][int(row.group(1))] = row.group(2)
                continue
            head = re.match(r"^(ENTRY )?%([\w.\-]+) \(.*\{$", line)
            if head:
                section, current = None, head.group(2)
                self.computations[current] = []
                if head.group(1):
                    self.entry = current
            elif current and line.startswith("  ") and "=" in line:
                self.computations[current].append(line.strip())

        def field(value: str, name: str) -> int:
            return int(re.search(rf"{name}=(\d+)", value).group(1))

        names = {i: v.strip('"') for i, v in tables["FunctionNames"].items()}
        located = {i: field(v, "function_name_id") for i, v in tables["FileLocations"].items()}
        self._frames = {
            i: names.get(located.get(field(v, "file_location_id")), "")
            for i, v in tables["StackFrames"].items()
        }

    def function(self, instruction: str) -> str:
        """The innermost function an instruction was traced in ("" if unknown)."""
        found = re.search(r"stack_frame_id=(\d+)", instruction)
        return self._frames.get(int(found.group(1)), "") if found else ""


def count(text: str, unknown_trips, branch_taken) -> dict[str, int]:
    """Launches and host reads of one run of a compiled program (its HLO ``text``).

    ``unknown_trips(function)``: the trips of a loop whose count the compiler does not know,
    from the innermost function it was traced in; ``branch_taken(function, branches)``: how
    often each branch of a conditional runs (a share per branch), from the same and, per
    branch, the trip
    counts of its loops and the operations of its instructions that launch a kernel (copies
    alone: it passes its operands through). Both may be means over the iterations of a loop
    around them (the fit's snapshot intervals differ in length): the counts are linear in
    them, so the result is the count of the whole run."""
    hlo = Hlo(text)
    kinds: collections.Counter = collections.Counter()
    reads = 0

    def trips(instruction: str) -> int | None:
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"', instruction)
        return int(known.group(1)) if known else None

    def op(instruction: str) -> str:
        found = _OP.search(instruction)
        return found.group(1) if found else "?"

    def summary(computation: str) -> tuple[list[int], set[str]]:
        body = hlo.computations[computation]
        loops = [t for i in body if (t := trips(i)) is not None]
        return loops, {op(i) for i in body} - _FREE

    def walk(computation: str, times: float) -> None:
        nonlocal reads
        for ins in hlo.computations.get(computation, []):
            kind = op(ins)
            if kind in _FREE:
                continue
            if kind == "while":
                body = re.search(r"body=%([\w.\-]+)", ins).group(1)
                n = trips(ins)
                if n is not None:  # run n times over, the condition never evaluated
                    walk(body, times * n)
                    continue
                n = unknown_trips(hlo.function(ins))
                walk(body, times * n)
                walk(re.search(r"condition=%([\w.\-]+)", ins).group(1), times * (n + 1))
                reads += times * (n + 1)
            elif kind == "conditional":
                listed = re.search(r"branch_computations=\{([^}]*)\}", ins)
                if listed:
                    branches = re.findall(r"%([\w.\-]+)", listed.group(1))
                else:  # a predicate's two branches: true first
                    branches = [
                        re.search(rf"{side}_computation=%([\w.\-]+)", ins).group(1)
                        for side in ("true", "false")
                    ]
                shares = branch_taken(hlo.function(ins), [summary(b) for b in branches])
                for branch, share in zip(branches, shares, strict=True):
                    walk(branch, times * share)
                reads += times
            elif kind in ("call", "async-start"):
                for callee in re.findall(r"(?:to_apply|calls)=%([\w.\-]+)", ins):
                    walk(callee, times)
            elif kind == "custom-call":
                target = re.search(r'custom_call_target="([^"]*)"', ins).group(1)
                kinds["triton" if "triton" in target else "library"] += times
            else:
                kinds["copy" if kind == "copy" else "kernel"] += times

    walk(hlo.entry, 1)
    counts = {"launches": sum(kinds.values()), "host_reads": reads, **kinds}
    return {name: round(value) for name, value in counts.items()}


def compiled(fn, args, device: jax.Device):
    """``jit(fn)`` compiled for ``device``, a compile-only GPU (matrix products in float32, as
    the engine's programs are traced)."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
    with jax.default_matmul_precision("highest"), lowering_for_gpu(device.device_kind):
        return jax.jit(fn).lower(*shapes).compile()


def compiled_text(fn, args, device: jax.Device) -> str:
    """The scheduled HLO of :func:`compiled`."""
    return compiled(fn, args, device).as_text()


@contextlib.contextmanager
def as_on_a_gpu(use_fused: bool):
    """Traces the engine as for a GPU (``mhalearn.platforms.tracing_for("gpu")``: the forms
    chosen per platform, side-by-side first draws and the fused kernel), the fused kernel on or
    off as asked."""
    saved = fused.FUSED_ON_GPU
    fused.FUSED_ON_GPU = use_fused
    try:
        with tracing_for("gpu"):
            yield
    finally:
        fused.FUSED_ON_GPU = saved


def engine_programs(shape: dict, steps: int, device, use_fused: bool) -> dict[str, dict]:
    """The counts of the engine's instance program over ``instances`` (draw, fit, score: what
    mh.simulate runs in one group on a GPU) and of its fit alone."""
    B = shape["instances"]
    task, learner = gd_workload(**{k: shape[k] for k in STANDARD}, steps=steps)
    k, spec = learner.check_every, {"task": task, "learner": learner}
    ids = jnp.arange(B)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(ids)
    per = jax.vmap(instance_keys)(keys)
    candidates = teachers.CANDIDATES.get("gpu", 4)
    attempts = jax.jit(
        jax.vmap(lambda key: teachers.sample_teacher_with_info(key, task.teacher, candidates))
    )(per.problem).info.attempts
    rejection_trips = int(max(0, int(np.max(attempts)) - candidates))

    intervals = np.diff(learner.snapshot_steps())  # the steps of each snapshot interval

    def unknown_trips(function):
        if function == "sample_teacher_with_info":
            return rejection_trips
        if function == "_interval":  # the whole blocks, a mean over the intervals
            return np.mean(intervals // k)
        raise ValueError(f"a loop of unknown length in {function!r}: no rule to count it")

    def branch_taken(function, branches):
        if function == "_interval":  # the last steps' branches: pass, or `size` steps
            (steps_branch,) = [i for i, (_, ops) in enumerate(branches) if ops - {"copy"}]
            size = max(branches[steps_branch][0], default=1)  # one step is no loop
            share = np.mean(((intervals % k) & size) != 0)
            return [share if i == steps_branch else 1 - share for i in range(len(branches))]
        raise ValueError(f"a branch in {function!r}: no rule to choose it")

    with as_on_a_gpu(use_fused):
        problems = jax.eval_shape(jax.vmap(lambda key: task.sample(key).problem), per.problem)
        programs = {
            "engine": (jax.vmap(lambda key: _fit_and_score(instance_keys(key), spec)), (keys,)),
            "engine_fit": (jax.vmap(learner.fit), (per.fit, problems)),
        }
        return {
            name: count(compiled_text(fn, args, device), unknown_trips, branch_taken)
            for name, (fn, args) in programs.items()
        }


def naive_program(shape: dict, steps: int, device) -> dict:
    """The counts of compare.py's jit(vmap(scan)) of ``steps`` GD steps."""
    B, m, d, T, N = (shape[k] for k in ("instances", "heads", "dim", "tokens", "samples"))

    def fit(theta, W, X, Y):
        def step(p, _):
            g = jax.grad(naive_loss)(p, X, Y)
            return jax.tree.map(lambda a, b: a - 0.05 * b, p, g), None

        return jax.lax.scan(step, (theta, W), None, steps)[0]

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in [(B, m, d, d)] * 2 + [(B, N, T, d)] * 2]

    def refuse(*_):
        raise ValueError("jit(vmap(scan)) has no loop of unknown length and no branch")

    return count(compiled_text(jax.vmap(fit), args, device), refuse, refuse)


#: the teachers recovery_speed.py's GPU step fits at its first cell
VARPRO_TEACHERS = 256


def varpro_programs(device) -> list[dict]:
    """The counts of one start of the registered variable projection over
    :data:`VARPRO_TEACHERS` teachers of recovery_speed.py's first cell, a row per number of
    (sample, token) rows a chunk of its Gauss–Newton sums takes: the CPU's, then an
    accelerator's."""
    from recovery_speed import CELLS  # float64 from here on, as variable projection runs

    d, T, m, n, _ = CELLS[0]
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=m, dim=d, tokens=T), samples=n)
    learner = make_learner("varpro", 0)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(VARPRO_TEACHERS))
    per = jax.vmap(instance_keys)(keys)

    def unknown_trips(function):
        if function == "levenberg_marquardt":  # a start's whole budget
            return learner.iterations
        if function == "VarProConfig.fit":  # one start
            return 1
        raise ValueError(f"a loop of unknown length in {function!r}: no rule to count it")

    def refuse(*_):
        raise ValueError("variable projection's loop bodies branch on no value the host reads")

    shape = dict(heads=m, dim=d, tokens=T, samples=n, instances=VARPRO_TEACHERS)
    out = []
    for rows in (reduced.chunk_rows("cpu"), reduced.chunk_rows("gpu")):
        with patch.dict(reduced.CHUNK_ROWS, {"gpu": rows}), as_on_a_gpu(False):
            problems = jax.eval_shape(jax.vmap(lambda k: task.sample(k).problem), per.problem)
            program = compiled(jax.vmap(learner.fit), (per.fit, problems), device)
        c = count(program.as_text(), unknown_trips, refuse)
        temp = program.memory_analysis().temp_size_in_bytes / VARPRO_TEACHERS / 1e6
        out.append(
            {"program": "varpro", "chunk_rows": rows, **shape, "steps": learner.iterations}
            | {"launches": c["launches"], "host_reads": c["host_reads"]}
            | {"copies": c.get("copy", 0), "library_calls": c.get("library", 0)}
            | {"temp_mb_per_teacher": round(temp, 2)}
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=50, help="GD steps (gpu_check.sh runs 50)")
    p.add_argument("--shapes", type=int, nargs="+", default=None, help="compare.py's, by index")
    p.add_argument("--fused", action="store_true", help="full-batch steps take the fused kernel")
    p.add_argument("--varpro", action="store_true", help="variable projection's programs")
    p.add_argument("--target", type=Path, default=TARGET, help="the GPU's description")
    args = p.parse_args()
    device = gpu_device(args.target)
    extra = {"device_kind": f"{device.device_kind} (compile-only)", "jax": jax.__version__}
    compiled_by = (
        f"compiled for {device.device_kind} by jaxlib {jax.__version__}'s XLA, without one:"
    )
    if args.varpro:
        rows = varpro_programs(device)
        print(compiled_by)
        print(table(rows, list(rows[0])))
        append_rows("gpu_programs", [dict(r, **extra, **machine()) for r in rows])
        return
    shapes = SHAPES if args.shapes is None else [SHAPES[i] for i in args.shapes]
    rows = []
    for shape in shapes:
        counts = engine_programs(shape, args.steps, device, args.fused)
        counts["jax_naive"] = naive_program(shape, args.steps, device)
        naive = counts["jax_naive"]
        for name, c in counts.items():
            rows.append(
                {
                    "program": name,
                    **shape,
                    "steps": args.steps,
                    "fused": args.fused if name != "jax_naive" else False,
                    "launches": c["launches"],
                    "host_reads": c["host_reads"],
                    "copies": c.get("copy", 0),
                    "library_calls": c.get("library", 0),
                    "triton_calls": c.get("triton", 0),
                    "launches_vs_naive": round(c["launches"] / naive["launches"], 3),
                }
            )
    print(compiled_by)
    print(table(rows, ["program", "heads", "dim", "tokens", "samples", "instances", "fused",
                 "launches", "host_reads", "copies", "library_calls", "triton_calls",
                 "launches_vs_naive"]))  # fmt: skip
    append_rows("gpu_programs", [dict(r, **extra, **machine()) for r in rows])


if __name__ == "__main__":
    main()
