#!/usr/bin/env bash
# One command, at most 8 minutes, for a machine with an NVIDIA GPU and JAX built with CUDA:
#   bash benchmarks/gpu_check.sh
# Prints the devices, then on the GPU, each step under its own time limit (a step that fails
# or runs out of time is reported and the next one runs; the exit status is non-zero if any
# failed):
#   1. the same instances on the GPU and on the host CPU (benchmarks/accelerator_agreement.py:
#      float32 GD at JAX's default precision and at 'highest', float64 variable projection);
#   2. the engine-versus-baselines comparison (benchmarks/compare.py: the engine end to end,
#      its fit alone, and jax_naive; each against the GPU's own 8192² product rate in the
#      precision its products run in — 'highest' for the engine, TensorFloat-32 for
#      jax_naive at JAX's default — measured in the same run);
#   3. the throughput at the standard shape and at a large batch of 16384 instances, end to
#      end and the fit alone (benchmarks/throughput.py, no instance sweep; the group width fitted to the GPU's
#      memory; each row appended as it finishes);
#   4. seconds per recovered teacher of variable projection against the per-teacher scipy
#      baseline (benchmarks/recovery_speed.py --small; the baseline runs on the host CPU);
#   5. where an instance's time goes, stage by stage (benchmarks/stages.py, 1024 instances),
#      and the small linear-algebra calls of drawing and scoring as the package makes them
#      (batched pieces) beside jnp.linalg's vmapped calls (benchmarks/linalg_ops.py, 4096
#      instances);
#   6. the fused Pallas loss-and-gradient kernel against the XLA kernel at the standard shape,
#      4096 instances (benchmarks/fused.py): where it is faster, mhalearn.fused.FUSED_ON_GPU
#      may be turned on.
# Rows go under benchmarks/results/ (accelerator_agreement.csv, compare.csv, throughput.csv,
# recovery_speed.csv, stages.csv, linalg_ops.csv, fused.csv; they carry the device kind). The
# limits add up to 7 min 40 s; on an H200 on 2026-12-04 the first four steps took 82 s (without --small),
# 119 s, over 130 s (with the instance sweep) and 82 s (log in
# benchmarks/results/gpu_check_h200.log). Install first, e.g.
#   pip install -e ".[bench]" "jax[cuda12]"
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1
"$PY" - <<'PYEOF' || exit 1
import jax
gpus = [d for d in jax.devices() if d.platform == "gpu"]
if not gpus:
    raise SystemExit(f"no GPU visible to JAX (devices: {jax.devices()}); install jax[cuda12]")
print("GPU:", gpus[0].device_kind, "x", len(gpus), "| jax", jax.__version__)
PYEOF
failed=()
step() {  # step SECONDS ARGS...: one benchmark under a time limit
    local limit=$1
    shift
    echo
    echo "=== $* (limit ${limit}s)"
    local tic=$SECONDS
    timeout "$limit" "$PY" "$@"
    local rc=$?
    echo "=== exit $rc after $((SECONDS - tic))s: $*"
    [ "$rc" -eq 0 ] || failed+=("$* (exit $rc)")
}
step 50 benchmarks/accelerator_agreement.py --small
step 120 benchmarks/compare.py --steps 50 --impls mhalearn mhalearn_fit jax_naive
step 100 benchmarks/throughput.py --small --large 16384 --sweep
step 70 benchmarks/recovery_speed.py --small --learners varpro
step 40 benchmarks/stages.py
step 30 benchmarks/linalg_ops.py
step 50 benchmarks/fused.py
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}"
    exit 1
fi
