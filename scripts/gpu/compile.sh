#!/usr/bin/env bash
# D2L chapter 12 on a lent GPU machine (H200 image: torch + CUDA, JAX; no TF, no MXNet, no internet):
#   1. the 12.1 bench (suite "compile": the MLP, batch 1, 1000 calls a sample) for torch and JAX on
#      gpu:0: eager, every native compiler (TorchScript, trace, torch.compile, reduce-overhead,
#      jax.jit) and md.compile, whose measured route lands in the JSON (params.route);
#   2. the digits example (md.train_batch) for torch and JAX on 1 GPU and on every GPU.
# Writes into $OUT (default build/gpu-compile): compile-$TAG.{json,md,png}, digits-$TAG.{json,png},
# log.txt. About 3 minutes on one H200 (torch.compile's two compilations take most of it).
#   bash scripts/gpu/compile.sh            (TAG defaults to h200-YYYY-MM-DD)
# The image may lack scikit-learn: the digits part then reads ./digits-data.npz when the tree has one
# (make it where scikit-learn is: python -m multidev.examples.digits --save-data digits-data.npz),
# else it is skipped with a message. Knobs: PYTHON, OUT, TAG, EPOCHS; for a dry run elsewhere DEVICE
# (default gpu:0), BENCH_EXTRA (e.g. --quick), DIGITS_DEVICES (default: the GPU count).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-compile}" && cd "${OUT:-$REPO/build/gpu-compile}" && pwd)
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore COLUMNS=200
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and JAX take turns on the GPU
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

stamp "install multidev (editable, no dependencies)"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation -e .) || echo "pip install -e failed"
cd /tmp  # import the installed multidev
nvidia-smi -L || true
"$PY" -c "import sys, numpy, torch, jax; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPU(s); jax', jax.__version__, jax.devices())"

parts=()
for b in torch jax; do
  stamp "bench compile: $b on ${DEVICE:-gpu:0}"
  timeout -k 10 130 "$PY" -m multidev.cli bench --backend "$b" --suite compile --device "${DEVICE:-gpu:0}" --budget 1 \
    --no-progress ${BENCH_EXTRA:-} --json "$OUT/compile-$b.json" > "$OUT/compile-$b.txt" 2>&1
  echo "bench $b exit code: $?"
  tail -n 25 "$OUT/compile-$b.txt"
  [ -s "$OUT/compile-$b.json" ] && parts+=("$OUT/compile-$b.json")
done
if [ ${#parts[@]} -gt 0 ]; then
  "$PY" -m multidev.cli bench --report "${parts[@]}" --json "$OUT/compile-$TAG.json" --markdown "$OUT/compile-$TAG.md" \
    --check; echo "goals (--check) exit code: $?"
  "$PY" -m multidev.benchmarks.compilation "$OUT/compile-$TAG.json" "$OUT/compile-$TAG.png"
  rm -f "$OUT"/compile-torch.json "$OUT"/compile-jax.json
fi

NG=${DIGITS_DEVICES:-$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)}
DATA=()
if ! "$PY" -c "import sklearn" 2>/dev/null; then
  if [ -s "$REPO/digits-data.npz" ]; then DATA=(--data "$REPO/digits-data.npz"); else
    stamp "digits skipped: no scikit-learn in this image and no $REPO/digits-data.npz"; NG=0; fi
fi
if [ "$NG" -gt 0 ]; then
  stamp "digits: torch and jax on 1 and $NG GPU(s)"
  timeout -k 10 100 "$PY" -m multidev.examples.digits --backend torch,jax --devices "$NG" --epochs "${EPOCHS:-10}" \
    --no-progress "${DATA[@]}" --json "$OUT/digits-$TAG.json" --plot "$OUT/digits-$TAG.png"
  echo "digits exit code: $?"
fi
stamp "done"; ls -la "$OUT"
