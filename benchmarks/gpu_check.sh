#!/usr/bin/env bash
# One command, at most 8 minutes, for a machine with an NVIDIA GPU and JAX built with CUDA:
#   bash benchmarks/gpu_check.sh
# Prints the devices, then on the GPU, each step under its own time limit (a step that fails
# or runs out of time is reported and the next one runs; the exit status is non-zero if any
# failed):
#   1. the fused Pallas loss-and-gradient kernel, in each of its forms, keeping or recomputing
#      each head's attention, on 4 and on 8 warps, against the XLA kernel at the standard
#      shape, 4096 instances (benchmarks/fused.py); its fastest variant, where it ran faster
#      than the XLA kernel and agreed with it, is the one every later step's engine takes
#      (benchmarks/gpu_targets.py --choose-fused into MHALEARN_BENCH_FUSED, which
#      benchmarks/_common.py reads; "off" otherwise), so that the targets judge the engine as
#      that timing would ship it; every row says which (its column fused_on_gpu);
#   2. the same instances on the GPU and on the host CPU (benchmarks/accelerator_agreement.py:
#      float32 GD at JAX's default precision and at 'highest', float64 variable projection);
#   3. the engine-versus-baselines comparison (benchmarks/compare.py: the engine end to end,
#      its fit alone, and jax_naive; each against the GPU's own 8192² product rate in the
#      precision its products run in — 'highest' for the engine, TensorFloat-32 for
#      jax_naive at JAX's default — measured in the same run);
#   4. the throughput at the standard shape and at a large batch of 16384 instances, end to
#      end and the fit alone (benchmarks/throughput.py, no instance sweep; the group width
#      fitted to the GPU's memory; each row appended as it finishes);
#   5. seconds per recovered teacher of variable projection at a study point's size, 256
#      teachers at the first cell, no scipy baseline (benchmarks/recovery_speed.py --small
#      --teachers 256 --no-baseline; at 16 teachers a GPU waits on its launches: 6 ms per
#      teacher on the H200 on 2026-12-04, the 2-core CPU 17 ms, at 256 the CPU 13 ms);
#   6. where an instance's time goes, stage by stage (benchmarks/stages.py, 1024 instances),
#      and the small linear-algebra calls of drawing and scoring as the package makes them
#      (batched pieces) beside jnp.linalg's vmapped calls (benchmarks/linalg_ops.py, 4096
#      instances);
#   7. the three targets judged from the rows of this run (benchmarks/gpu_targets.py): end to
#      end faster than jit(vmap(scan)) at every shape, the fit alone at 30% of the float32
#      ceiling with 16384 instances, variable projection 20 times faster per recovered teacher
#      than the 2-core CPU's recorded rows; and the fastest fused variant against the XLA
#      kernel, with the settings of mhalearn/fused.py that would turn it on where faster.
# Rows go under benchmarks/results/, or MHALEARN_BENCH_RESULTS (accelerator_agreement.csv,
# compare.csv, throughput.csv, recovery_speed.csv, stages.csv, linalg_ops.csv, fused.csv;
# they carry the device kind). The limits add up to 7 min 50 s, and the choice of the fused
# kernel between steps 1 and 2 has 20 s (it reads one file). On an H200 on 2026-12-04, with
# the engine of that day, the first four steps took 82 s (without --small), 119 s, over
# 130 s (with the instance sweep) and over 150 s (log in benchmarks/results/gpu_check_h200.log).
# With device time left after it, gpu_choices.py beside this script (69 s on a 2-core CPU) times
# both ways the forms the engine takes on an accelerator that no GPU has timed.
# Install first, e.g.
#   pip install -e ".[bench]" "jax[cuda12]"
# or, on a machine that reaches no registry but whose Python has JAX with CUDA, optax,
# equinox, chex, jaxtyping, xarray, h5py, matplotlib, scipy, threadpoolctl and tqdm (the
# steps need neither tyro, h5netcdf nor submitit), from the checkout:
#   PYTHONPATH=$PWD PYTHON=python3 bash benchmarks/gpu_check.sh
# Before a GPU is at hand, the same steps run on this machine's CPU at trial sizes (the slow
# tests do, so that the one GPU run cannot fail on a script that no longer runs):
#   bash benchmarks/gpu_check.sh --cpu
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1
trial=0
case "${1:-}" in
    "") ;;
    --cpu) trial=1 ;;
    *) echo "usage: bash benchmarks/gpu_check.sh [--cpu]" >&2; exit 2 ;;
esac
if [ "$trial" -eq 1 ]; then
    # the same steps on this machine's CPU at trial sizes (each step's second argument, given
    # after its own so that it wins), each limit four times as long, the rows into a temporary
    # folder unless MHALEARN_BENCH_RESULTS names one: a check that every step still runs, which
    # says nothing of a GPU
    export MHALEARN_BENCH_RESULTS=${MHALEARN_BENCH_RESULTS:-$(mktemp -d)}
    echo "trial on the CPU; rows into $MHALEARN_BENCH_RESULTS"
else
    "$PY" - <<'PYEOF' || exit 1
import jax
gpus = [d for d in jax.devices() if d.platform == "gpu"]
if not gpus:
    raise SystemExit(f"no GPU visible to JAX (devices: {jax.devices()}); install jax[cuda12]")
print("GPU:", gpus[0].device_kind, "x", len(gpus), "| jax", jax.__version__)
PYEOF
fi
since=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)  # the rows of this run, for the verdict
failed=()
step() {  # step SECONDS "TRIAL ARGS" SCRIPT ARGS...: one benchmark under a time limit
    local limit=$1 trial_args=$2
    shift 2
    local args=("$@")
    if [ "$trial" -eq 1 ]; then
        limit=$((4 * limit))
        read -ra extra <<<"$trial_args"
        args+=("${extra[@]}")
    fi
    echo
    echo "=== ${args[*]} (limit ${limit}s)"
    local tic=$SECONDS
    timeout "$limit" "$PY" "${args[@]}"
    local rc=$?
    echo "=== exit $rc after $((SECONDS - tic))s: ${args[*]}"
    [ "$rc" -eq 0 ] || failed+=("${args[*]} (exit $rc)")
}
step 50 "--instances 2 --samples 16 --repeats 1" benchmarks/fused.py --warps 4 8
choice=$(timeout 20 "$PY" benchmarks/gpu_targets.py --since "$since" --choose-fused) || choice=off
export MHALEARN_BENCH_FUSED=$choice
echo
echo "=== the engine's full-batch GPU steps in the steps below: fused kernel $choice"
step 50 "--instances 4" benchmarks/accelerator_agreement.py --small
step 120 "--steps 2 --shapes 3" \
    benchmarks/compare.py --steps 50 --impls mhalearn mhalearn_fit jax_naive
step 100 "--instances 16 --large 64 --chunk-size 16 --steps 2" \
    benchmarks/throughput.py --small --large 16384 --sweep
step 70 "" benchmarks/recovery_speed.py --small --teachers 256 --learners varpro --no-baseline
step 40 "--instances 8 --steps 2 --repeats 1" benchmarks/stages.py
step 30 "--instances 8 --repeats 1" benchmarks/linalg_ops.py
unset MHALEARN_BENCH_FUSED  # the verdict reads rows only: no need to import JAX for it
step 10 "--fit-instances 64" benchmarks/gpu_targets.py --since "$since"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}"
    exit 1
fi
