#!/usr/bin/env bash
# One command, under 10 minutes, for a machine with an NVIDIA GPU and JAX built with CUDA:
#   bash benchmarks/gpu_check.sh
# Prints the devices, runs the engine-versus-baselines comparison (benchmarks/compare.py) and
# the throughput sweep on the GPU, and writes their rows under benchmarks/results/
# (compare.csv, throughput.csv; the rows carry the device kind). Install first, e.g.
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
timeout 420 "$PY" benchmarks/compare.py --steps 50
timeout 150 "$PY" benchmarks/throughput.py --small
