#!/usr/bin/env bash
# The book's programs (examples/d2l: D2L's GPUs, 12.2, 12.3, 12.5, 12.6) and the bench suite
# "models" (md.to of a model, md.train_batch on one device, each against the framework's own call)
# on a GPU machine: cpu:0 + gpu:0, torch and JAX (flax and equinox models where installed), CuPy
# for the sections without training. About 3 minutes on one H200; every step has a time cap.
#
#   OUT=/path/to/out bash scripts/gpu/book.sh
#
# Writes into $OUT: book-<backend>.json (every check and figure of every program; each program
# exits non-zero when a check fails), book-<backend>.txt (what the programs printed),
# models-h200.json/.md (the bench rows and goals, merged), models-h200-<backend>.json/.txt, versions.txt, log.txt. The exit status is 0
# when every program's checks held (bench goals are reported, not enforced: MISSED rows are in the
# .txt/.md with their figures). Installs multidev from this checkout first (editable, no deps).
# Knobs: PY (python3), BENCH_TIME (s, 80, split between torch and JAX), DEVICES (the N of the N-device runs: 2 = gpu:0 + cpu:0).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-book}" && cd "${OUT:-$REPO/build/gpu-book}" && pwd)
PY=${PY:-python3}
BENCH_TIME=${BENCH_TIME:-80}
DEVICES=${DEVICES:-2}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore COLUMNS=200
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch, JAX and CuPy take turns on the GPU
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
status=0

stamp "install multidev (editable, no dependencies) at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  "$PY" -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
  for m in torch jax flax equinox optax cupy sklearn; do
    "$PY" -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>/dev/null || echo "$m not installed"
  done
  "$PY" -m multidev.cli devices --backend numpy,torch,jax,cupy || true; } > versions.txt 2>&1
cat versions.txt

book() {  # book BACKEND CAP [ARGS...]: every section (or those in ARGS) on cpu:0 + gpu:0
  local name=$1 cap=$2; shift 2
  stamp "book: $name (cap $cap s)"
  timeout -k 10 "$cap" "$PY" -m multidev.examples.d2l --backend "$name" --devices "$DEVICES" --quiet \
    --json "book-$name.json" "$@" > "book-$name.txt" 2>&1
  local rc=$?
  echo "exit $rc"; grep -E "FAIL|checks held|^[a-z_]+: " "book-$name.txt" | tail -20
  [ "$rc" = 0 ] || status=1
}
book torch 60
book jax 90
book cupy 30 --sections use_gpu,async_computation,auto_parallelism

bench() {  # bench BACKEND CAP: the models suite for one backend (so each gets its share of the time)
  local name=$1 cap=$2
  stamp "bench: suite models, $name on cpu:0,gpu:0 (cap $cap s)"
  timeout -k 15 $(( cap + 25 )) "$PY" -m multidev.cli bench --suite models --backend "$name" --device cpu:0,gpu:0 \
    --reps 10 --budget 1.5 --max-time "$cap" --no-progress --json "models-h200-$name.json" > "models-h200-$name.txt" 2>&1
  echo "bench $name exit $?"; grep -E "^(met|MISSED)|correctness" "models-h200-$name.txt" | head -30
}
bench torch $(( BENCH_TIME / 2 ))
bench jax $(( BENCH_TIME - BENCH_TIME / 2 ))
"$PY" -m multidev.cli bench --report models-h200-torch.json models-h200-jax.json --json models-h200.json \
  --markdown models-h200.md > models-h200.txt 2>&1 || true
stamp "done: status $status (0: every program's checks held)"
exit $status
