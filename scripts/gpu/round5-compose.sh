#!/usr/bin/env bash
# The GPU check of the adapters by composition (issue 31, round 5), one call on a lent H200, ~6 minutes:
#   A. in parallel (correctness): the conformance suite for torch and JAX on cpu:0 + every GPU, for
#      CuPy on gpu:0 (torch and JAX as partners), the CuPy and JAX adapters' GPU tests, and every
#      torch, JAX and CuPy mutant of the catalogue on the GPU (scripts/gpu/mutants.sh step 3);
#   B. then scripts/gpu/round5-ddp.sh's comparisons (RUNS=2) on the quiet host.
#   OUT=/path/to/out bash scripts/gpu/round5-compose.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r5c}" && cd "${OUT:-$REPO/build/gpu-r5c}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::DeprecationWarning XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
NG=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
DEVS=cpu:0; for ((i = 0; i < NG; i++)); do DEVS="$DEVS,gpu:$i"; done
CAP=${CAP:-330}
timeout -s INT -k 15 "$CAP" "$PY" -m multidev.cli conformance --backend torch,jax --device "$DEVS" \
  --json "$OUT/conformance-torch-jax.json" -- -q -p no:cacheprovider > "$OUT/conformance-torch-jax.txt" 2>&1 &
p1=$!
timeout -s INT -k 15 "$CAP" "$PY" -m multidev.cli conformance --backend cupy --device gpu:0 \
  --json "$OUT/conformance-cupy.json" -- -q -p no:cacheprovider > "$OUT/conformance-cupy.txt" 2>&1 &
p2=$!
(timeout -k 10 "$CAP" "$PY" -m pytest tests/test_adapter_cupy.py tests/test_adapter_jax.py -m gpu -q \
  -p no:cacheprovider -o addopts= --import-mode=importlib -rs > "$OUT/pytest-gpu.txt" 2>&1) &
p3=$!
(OUT="$OUT/mutants" STEPS=3 timeout -k 10 "$CAP" bash scripts/gpu/mutants.sh > "$OUT/mutants.txt" 2>&1) &
p4=$!
status=0
for p in $p1 $p2 $p3 $p4; do wait $p || status=1; done
for f in conformance-torch-jax conformance-cupy; do
  echo "-- $f"; grep -E "^(feature|[a-z_]+ +[0-9]+/)|passed|failed|ran " "$OUT/$f.txt" | tail -16
done
echo "-- GPU tests"; tail -n 4 "$OUT/pytest-gpu.txt"
echo "-- mutants"; grep -E "catalogue|caught|MISSED|passed|failed" "$OUT/mutants.txt" | tail -12
RUNS=${RUNS:-2} OUT="$OUT/ddp" bash scripts/gpu/round5-ddp.sh || status=1
exit $status
