"""Shared pieces of the benchmark scripts: the workload's FLOP count, machine facts, CSV rows."""

from __future__ import annotations

import csv
import datetime
import os
import platform
import resource
import time
from pathlib import Path

import numpy as np

#: where rows are appended: ``benchmarks/results/``, or the folder named by the environment
#: variable ``MHALEARN_BENCH_RESULTS`` (a trial run that must not touch the recorded rows)
RESULTS = Path(
    os.environ.get("MHALEARN_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"
)

#: the environment variable through which ``gpu_check.sh`` has the steps after its timing of
#: the fused kernel run the engine as it would ship with that timing's choice: ``off``, or a
#: variant, ``FORM,keep|recompute,TILE_ROWS,WARPS`` (``gpu_targets.py --choose-fused``)
FUSED_ENV = "MHALEARN_BENCH_FUSED"


def fused_setting() -> str:
    """How :mod:`mhalearn.fused` is set in this process: ``off`` (``FUSED_ON_GPU`` false), or
    the variant a GPU's full-batch steps take, in :data:`FUSED_ENV`'s form."""
    from mhalearn import fused

    if not fused.FUSED_ON_GPU:
        return "off"
    keep = "recompute" if fused.RECOMPUTE else "keep"
    return f"{fused.FORM},{keep},{fused.TILE_ROWS},{fused.WARPS}"


def use_fused(setting: str) -> None:
    """Set :mod:`mhalearn.fused` as ``setting`` says (:data:`FUSED_ENV`'s form): ``off``, or
    a variant, which turns ``FUSED_ON_GPU`` on (it changes nothing but on a GPU)."""
    from mhalearn import fused

    if setting == "off":
        fused.FUSED_ON_GPU = False
        return
    parts = setting.split(",")
    if (
        len(parts) != 4
        or parts[0] not in fused.FORMS
        or parts[1] not in ("keep", "recompute")
        or not all(p.isdigit() for p in parts[2:])
    ):
        raise ValueError(
            f"{FUSED_ENV}: 'off' or FORM,keep|recompute,TILE_ROWS,WARPS with FORM one of "
            f"{fused.FORMS} (e.g. 'pairs,keep,16,8'), received {setting!r}"
        )
    fused.FORM, fused.RECOMPUTE = parts[0], parts[1] == "recompute"
    fused.TILE_ROWS, fused.WARPS = int(parts[2]), int(parts[3])
    fused.FUSED_ON_GPU = True


if os.environ.get(FUSED_ENV):  # every benchmark script imports this module before it runs
    use_fused(os.environ[FUSED_ENV])

#: the standard benchmark shape: one Chen–Li layer fitted by full-batch GD (instances apart)
STANDARD = dict(heads=4, dim=16, tokens=8, samples=512)
#: the step size of the full-batch GD workload
LR = 0.05


def gd_workload(heads: int, dim: int, tokens: int, samples: int, steps: int):
    """The (task, learner) every engine benchmark times: random teachers of the given shape,
    ``steps`` full-batch GD steps at :data:`LR`, the trace at the start and the end only."""
    import mhalearn as mh

    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=heads, dim=dim, tokens=tokens),
        samples=samples,
        test_samples=16,
    )
    return task, mh.GDConfig(optimizer="gd", steps=steps, lr=LR, snapshots=2)


#: the teachers' data drawn for engine_fit_seconds, per (task, learner, instances)
_PROBLEMS: dict = {}


def engine_fit_seconds(task, learner, instances: int, **engine) -> tuple[float, float]:
    """(compile seconds, run seconds) of the engine's fit alone: ``mh.map_instances`` (the
    engine simulate runs on: its devices, vector width and compiled-program cache; ``engine``
    its options, e.g. ``devices``, ``chunk_size``) of ``learner.fit`` over teachers and data
    drawn beforehand and not timed (drawing and scoring are what simulate adds)."""
    import jax

    import mhalearn as mh

    ident = (task, learner, instances)
    if ident not in _PROBLEMS:
        keys = jax.random.split(jax.random.key(1), instances)
        drawn = jax.jit(jax.vmap(lambda k: task.sample(k).problem))(keys)
        _PROBLEMS[ident] = jax.tree.map(np.asarray, drawn)

    def fit(key, problem, learner):
        out = learner.fit(key, problem)
        return out.params, out.status

    stats: dict = {}
    mh.map_instances(
        fit, jax.random.key(0), instances, _PROBLEMS[ident], learner, stats=stats, **engine
    )
    return stats["compile_seconds"], stats["run_seconds"]


def layer_flops_per_step(heads: int, dim: int, tokens: int, samples: int) -> float:
    """FLOPs of one full-batch loss-and-gradient step of the Chen–Li layer on one instance.

    Forward, per sample and head: X·Θ (2Td²), (XΘ)·Xᵀ (2T²d), A·X (2T²d), (AX)·W (2Td²).
    The backward pass costs about twice the forward, so a step counts 3× the forward.
    """
    forward = heads * samples * (4 * tokens * dim**2 + 4 * tokens**2 * dim)
    return 3.0 * forward


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "python": platform.python_version()}


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB: VmHWM on Linux (getrusage's
    ru_maxrss would carry over the parent's peak through fork and exec), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def append_rows(name: str, rows: list[dict]) -> Path:
    """Append rows (with a timestamp) to ``RESULTS/NAME.csv``, header if new; a row
    with columns the file lacks rewrites the file with the union of columns (old rows empty)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = [{"timestamp": stamp, **row} for row in rows]
    fields = list(rows[0])
    old: list[dict] = []
    if path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            known = list(reader.fieldnames or [])
            if set(fields) <= set(known):
                fields = known
            else:
                old = list(reader)
                fields = known + [c for c in fields if c not in known]
    rewrite = bool(old) or not path.exists()
    with path.open("w" if rewrite else "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        if rewrite:
            writer.writeheader()
            writer.writerows(old)
        writer.writerows(rows)
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(_fmt(r[c]).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def ceiling_gflops(n: int | None = None, repeats: int = 10, precision: str = "highest") -> float:
    """The float32 matrix-multiply rate of the default device through jax (best of
    ``repeats``; n × n products, n = 2048 on CPU and 8192 on an accelerator). ``precision``
    ``"highest"``: true float32 products (the ceiling); ``"default"``: JAX's default, which on
    NVIDIA GPUs since Ampere computes float32 products in TensorFloat-32 (the CPU's
    products are float32 at both)."""
    import jax
    import jax.numpy as jnp

    n = n or (2048 if jax.devices()[0].platform == "cpu" else 8192)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    dot = jax.jit(lambda x: jnp.matmul(x, x, precision=precision))
    jax.block_until_ready(dot(a))
    best = np.inf
    for _ in range(repeats):
        tic = time.perf_counter()
        jax.block_until_ready(dot(a))
        best = min(best, time.perf_counter() - tic)
    return 2 * n**3 / best / 1e9
