#!/usr/bin/env bash
# The CuPy adapter on a lent GPU machine (H200; no internet), in under 4 minutes (each step has a
# hard timeout; their sum is 4.3 minutes, a normal run far less). Writes into $OUT
# (default build/gpu-cupy):
#   env.txt                        versions, devices, `multidev devices`
#   pytest-cupy.xml / .txt         tests/test_adapter_cupy.py on the real GPU (pinned D2H, NCCL, DLPack)
#   conformance-cupy-gpu0.json     multidev conformance --backend cupy --device gpu:0
#   conformance-cupy-cpu0.json     the device tests on cpu:0 (the host mapping; interop ran in the first)
#   bench-cupy.json / .md / .txt   multidev bench rows of cupy on gpu:0 and cpu:0 (with the native column)
#   log.txt                        everything printed
# Interop partners in the conformance runs: every installed backend (torch and jax on the H200 image).
# Run from the repository root:  bash scripts/gpu/cupy.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-cupy}" && cd "${OUT:-$REPO/build/gpu-cupy}" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore::DeprecationWarning
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX, torch and CuPy share the GPU
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

stamp "install multidev (editable, no deps)"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation -e .) || echo "pip install failed"
MD() { "$PY" -m multidev.cli "$@"; }

stamp "machine"
{
  nvidia-smi -L || true
  "$PY" -c "import sys, numpy; print(sys.version.split()[0], 'numpy', numpy.__version__)"
  "$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount()); from cupy.cuda import nccl; print('nccl available', nccl.available, nccl.get_version() if nccl.available else '')" || true
  "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" || true
  "$PY" -c "import jax; print('jax', jax.__version__, jax.devices())" || true
  "$PY" -c "import ml_dtypes; print('ml_dtypes', ml_dtypes.__version__)" || true
  MD devices --backend numpy,cupy,torch,jax
} 2>&1 | tee "$OUT/env.txt"

stamp "unit tests of the adapter on the GPU"
(cd "$REPO" && timeout -k 10 45 "$PY" -m pytest tests/test_adapter_cupy.py -m gpu -q -p no:cacheprovider -o addopts= \
  --import-mode=importlib -rs --junitxml="$OUT/pytest-cupy.xml" > "$OUT/pytest-cupy.txt" 2>&1)
echo "pytest exit code: $?"; tail -n 25 "$OUT/pytest-cupy.txt"

stamp "conformance: cupy --device gpu:0"
cd /tmp  # import the installed package, not the repository folder
timeout -s INT -k 15 100 "$PY" -m multidev.cli conformance --backend cupy --device gpu:0 \
  --json "$OUT/conformance-cupy-gpu0.json" -- -q -p no:cacheprovider -x -rfE 2>&1 | tail -n 40
echo "conformance gpu:0 exit code: ${PIPESTATUS[0]}"

stamp "conformance: cupy --device cpu:0 (interop, which covers every shared device, ran above)"
timeout -s INT -k 15 40 "$PY" -m multidev.cli conformance --backend cupy --device cpu:0 \
  --json "$OUT/conformance-cupy-cpu0.json" -- -q -p no:cacheprovider -rfE -k "not interop" 2>&1 | tail -n 40
echo "conformance cpu:0 exit code: ${PIPESTATUS[0]}"

stamp "bench cupy on gpu:0,cpu:0"
timeout -k 10 55 "$PY" -m multidev.cli bench --backend cupy --device cpu:0,gpu:0 --budget 0.5 --max-time 45 \
  --no-progress --json "$OUT/bench-cupy.json" --markdown "$OUT/bench-cupy.md" > "$OUT/bench-cupy.txt" 2>&1
echo "bench exit code: $?"; tail -n 30 "$OUT/bench-cupy.txt"
stamp "done"; ls -la "$OUT"
