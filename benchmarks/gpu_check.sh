#!/usr/bin/env bash
# One command, under 10 minutes, for a machine with an NVIDIA GPU and JAX built with CUDA:
#   bash benchmarks/gpu_check.sh
# Prints the devices, then on the GPU: the engine-versus-baselines comparison
# (benchmarks/compare.py, its ceiling the GPU's own float32 8192² product rate measured in
# the same run), the throughput at the standard shape and at a large batch of 16384
# instances (benchmarks/throughput.py; the group width fitted to the GPU's memory, the share
# of the ceiling in every row), and seconds per recovered teacher against the per-teacher
# scipy baseline (benchmarks/recovery_speed.py --small; the baseline runs on the host CPU).
# Rows go under benchmarks/results/ (compare.csv, throughput.csv, recovery_speed.csv; they
# carry the device kind). Install first, e.g.
#   pip install -e ".[bench]" "jax[cuda12]"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" - <<'PYEOF'
import jax
gpus = [d for d in jax.devices() if d.platform == "gpu"]
if not gpus:
    raise SystemExit(f"no GPU visible to JAX (devices: {jax.devices()}); install jax[cuda12]")
print("GPU:", gpus[0].device_kind, "x", len(gpus), "| jax", jax.__version__)
PYEOF
timeout 240 "$PY" benchmarks/compare.py --steps 50
timeout 180 "$PY" benchmarks/throughput.py --small --large 16384
timeout 150 "$PY" benchmarks/recovery_speed.py --small
