#!/usr/bin/env bash
# One call on a lent GPU machine (H200; no internet): the conformance suite for torch and JAX, then
# every bench suite for torch and JAX on all GPUs + cpu:0, both f32 precisions (fp32 and tf32,
# labelled). Writes into $OUT (default build/gpu):
#   conformance-$TAG.json  $TAG.json  $TAG.png  $TAG.md  log.txt        (5 files; ~8 minutes)
# Run from anywhere:  bash benchmarks/gpu_run.sh      (TAG defaults to h200-YYYY-MM-DD)
# Needs python3 with torch, jax, numpy, rich, matplotlib, pytest, hypothesis, setuptools (the H200
# image has them). multidev is installed editable with --no-deps (the tree imports as installed).
# Knobs for a dry run elsewhere: PYTHON, OUT, TAG, CONFORMANCE_TIMEOUT (s), BENCH_EXTRA (e.g. --quick).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu}" && cd "${OUT:-$REPO/build/gpu}" && pwd)
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore::DeprecationWarning
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU in the conformance run
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

stamp "install multidev (editable, from this checkout; the image has every dependency)"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
MD() { "$PY" -m multidev.cli "$@"; }

stamp "machine"
nvidia-smi -L || true
"$PY" -c "import sys, numpy, torch, jax; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'GPU(s); jax', jax.__version__, jax.devices())"
MD devices --backend numpy,torch,jax

NG=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
DEVS=cpu:0
for ((i = 0; i < NG; i++)); do DEVS="$DEVS,gpu:$i"; done

stamp "conformance: torch, jax (devices $DEVS)"
timeout -s INT -k 20 "${CONFORMANCE_TIMEOUT:-170}" "$PY" -m multidev.cli conformance --backend torch,jax --device "$DEVS" \
  --json "$OUT/conformance-$TAG.json" -- -q -p no:cacheprovider
echo "conformance exit code: $?"

for b in torch jax; do
  stamp "bench $b on $DEVS"
  timeout -k 20 200 "$PY" -m multidev.cli bench --backend "$b" --device "$DEVS" --precision both \
    --budget 1 --max-time 110 --no-progress ${BENCH_EXTRA:-} --json "$OUT/bench-$b.json" > "$OUT/bench-$b.txt" 2>&1
  echo "bench $b exit code: $?"
  tail -n 12 "$OUT/bench-$b.txt"
done

stamp "report"
parts=()
for b in torch jax; do [ -s "$OUT/bench-$b.json" ] && parts+=("$OUT/bench-$b.json"); done
if [ ${#parts[@]} -gt 0 ]; then
  COLUMNS=200 MD bench --report "${parts[@]}" --json "$OUT/$TAG.json" --plot "$OUT/$TAG.png" \
    --markdown "$OUT/$TAG.md" && rm -f "$OUT"/bench-*.json "$OUT"/bench-*.txt
fi
stamp "done"; ls -la "$OUT"
