#!/usr/bin/env bash
# Every GPU check of this round in one call on a lent H200 (no internet), about 9 minutes:
#   A. at once, in parallel (correctness; the GPU is shared): the conformance suite for torch and JAX
#      on cpu:0 + every GPU, for CuPy on gpu:0 (torch and JAX as interop partners), the CuPy adapter's
#      GPU tests, and the mutation catalogue's torch mutants on cpu:0 + every GPU;
#   B. one after another (timing): the bench suites overhead, bandwidth and autoparallel for torch and
#      JAX, overhead and bandwidth for CuPy, the thin calls step by step (benchmarks/baselines/call_profile.py); with
#      COMPILE=1 D2L 12.1's compile suite for torch and JAX, with BREAKDOWN=1 h2d_breakdown.py;
#   C. one merged report: $TAG.json/.md/.png with every goal row.
# Writes into $OUT: conformance-*.json, $TAG.json/.md/.png, log.txt, and details.tar.gz (the mutants'
# JSON, every step's output).
#   MULTIDEV_SOURCE_COMMIT=$(git rev-parse HEAD) bash scripts/gpu/final.sh
# Knobs: TAG, PY, CAP_CONFORMANCE (s), BENCH_EXTRA.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-final}" && cd "${OUT:-$REPO/build/gpu-final}" && pwd)
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)-final}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore::DeprecationWarning COLUMNS=200
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch, JAX and CuPy share the GPU
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

stamp "install multidev (editable, no dependencies) at ${MULTIDEV_SOURCE_COMMIT:-unknown commit}"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
nvidia-smi -L || true
"$PY" -m multidev.cli devices --backend numpy,torch,jax,cupy || true
NG=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
DEVS=cpu:0; for ((i = 0; i < NG; i++)); do DEVS="$DEVS,gpu:$i"; done
CAP=${CAP_CONFORMANCE:-150}

stamp "A. correctness, in parallel (cap $CAP s each)"
timeout -s INT -k 15 "$CAP" "$PY" -m multidev.cli conformance --backend torch,jax --device "$DEVS" \
  --json "$OUT/conformance-$TAG-torch-jax.json" -- -q -p no:cacheprovider > "$OUT/conformance-torch-jax.txt" 2>&1 &
p1=$!
timeout -s INT -k 15 "$CAP" "$PY" -m multidev.cli conformance --backend cupy --device gpu:0 \
  --json "$OUT/conformance-$TAG-cupy.json" -- -q -p no:cacheprovider > "$OUT/conformance-cupy.txt" 2>&1 &
p2=$!
(timeout -k 10 "$CAP" "$PY" -m pytest tests/test_adapter_cupy.py tests/test_adapter_jax.py -m gpu -q \
  -p no:cacheprovider -o addopts= --import-mode=importlib -rs > "$OUT/pytest-cupy.txt" 2>&1) &
p3=$!
(OUT="$OUT" ONLY=torch timeout -k 10 "$CAP" bash scripts/gpu/mutants.sh > "$OUT/mutants.txt" 2>&1) &
p4=$!
for p in $p1 $p2 $p3 $p4; do wait $p; echo "pid $p exit $?"; done
for f in conformance-torch-jax conformance-cupy; do
  echo "-- $f"; grep -E "^(feature|[a-z_]+ +[0-9]+/)|WARNING|passed|failed" "$OUT/$f.txt" | tail -14
done
echo "-- CuPy and JAX GPU tests"; tail -n 4 "$OUT/pytest-cupy.txt"
echo "-- mutants"; tail -n 30 "$OUT/mutants.txt"

stamp "B. timing, one at a time"
bench() {  # bench NAME CAP ARGS...
  local name=$1 cap=$2; shift 2
  timeout -k 10 "$cap" "$PY" -m multidev.cli bench --no-progress --max-time $(( cap - 15 )) ${BENCH_EXTRA:-} \
    --json "$OUT/bench-$name.json" "$@" > "$OUT/bench-$name.txt" 2>&1
  echo "bench $name exit code: $?"; grep -E "^(met|MISSED)|correctness" "$OUT/bench-$name.txt" | head -40
}
SUITES=overhead,bandwidth,autoparallel
bench torch 120 --backend torch --device "$DEVS" --suite $SUITES --reps 6 --budget 0.2
bench jax 175 --backend jax --device "$DEVS" --suite $SUITES --reps 6 --budget 0.2
bench cupy 55 --backend cupy --device gpu:0 --suite overhead,bandwidth --reps 6 --budget 0.2
if [ "${COMPILE:-0}" = 1 ]; then  # D2L 12.1's suite (committed from an earlier run; COMPILE=1 re-runs it)
  bench compile-torch 50 --backend torch --device gpu:0 --suite compile --reps 5 --budget 0.3
  bench compile-jax 30 --backend jax --device gpu:0 --suite compile --reps 5 --budget 0.3
fi
if [ "${BREAKDOWN:-0}" = 1 ]; then  # where a small torch upload's time goes (1/4/16 MiB)
  timeout -k 10 40 "$PY" -m multidev.benchmarks.h2d_breakdown --backend torch --rounds 200 \
    --out "$OUT/$TAG.h2d-breakdown.json" || echo "h2d_breakdown exit code: $?"
fi
echo "-- thin calls: md against native, step by step (benchmarks/baselines/call_profile.py)"
timeout -k 10 60 "$PY" -m multidev.benchmarks.baselines.call_profile --rows "${PROFILE_ROWS:-convert,sync}" --out "$OUT/call-profile.json" > "$OUT/call-profile.txt" 2>&1
echo "call_profile exit code: $?"; grep -E "^== |^  [a-z.]|left out" "$OUT/call-profile.txt"

stamp "C. report"
parts=(); for f in "$OUT"/bench-*.json; do [ -s "$f" ] && parts+=("$f"); done
if [ ${#parts[@]} -gt 0 ]; then
  "$PY" -m multidev.cli bench --report "${parts[@]}" --json "$OUT/$TAG.json" --plot "$OUT/$TAG.png" \
    --markdown "$OUT/$TAG.md" > "$OUT/report.txt" 2>&1 && rm -f "${parts[@]}"
  grep -E "^(met|MISSED)" "$OUT/report.txt"
fi
stamp "done: everything but the report and the matrices goes into one archive (9 files come back)"
# The archive is written outside $OUT (tar reading the folder it writes into, or a log still being
# written, exits non-zero); the loose files go whatever tar's status, so the files that come back
# stay within the limit; a failed archive says so in the log.
cd "$OUT"
tar czf /tmp/details.tar.gz --exclude="$TAG.*" --exclude="conformance-*.json" --exclude=log.txt . \
  || echo "tar exited $? (the archive may be partial)"
find . -maxdepth 4 -type f ! -name "$TAG.*" ! -name "conformance-*.json" ! -name log.txt -delete
find . -mindepth 1 -type d -empty -delete
mv /tmp/details.tar.gz "$OUT/details.tar.gz"
ls -la "$OUT"
