#!/usr/bin/env bash
# Issue 32's GPU rows after the JAX one-device step was cut (round 5): scripts/gpu/data-parallel.sh
# (torch and JAX wrapped steps against their plain loops on one GPU) and the per-step Python cost of
# JAX's dp.step on the GPU with host and resident batches (benchmarks/baselines/data_parallel_jax_overhead.py).
#   OUT=/path/to/out bash scripts/gpu/round5-dp.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r5dp}" && cd "${OUT:-$REPO/build/gpu-r5dp}" && pwd)
PY=${PY:-python3}
status=0
OUT="$OUT/data-parallel" bash "$REPO/scripts/gpu/data-parallel.sh" || status=1
cd "$REPO"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 "$PY" -m multidev.benchmarks.baselines.data_parallel_jax_overhead \
  --json "$OUT/jax-overhead.json" > "$OUT/jax-overhead.txt" 2>&1 || status=1
cat "$OUT/jax-overhead.txt"
exit $status
