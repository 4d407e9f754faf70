#!/usr/bin/env bash
# One call on a lent GPU machine (H200; no internet): the conformance suite, then bench suites, on every
# GPU + cpu:0. Writes into $OUT (default build/gpu): conformance-$TAG.json, $TAG.json/.png/.md, log.txt.
#   bash benchmarks/gpu_run.sh            (TAG defaults to h200-YYYY-MM-DD)
# Knobs: BACKENDS (torch,jax), SUITES (all), PRECISION (fp32), CONFORMANCE (1), CONFORMANCE_TIMEOUT (s),
# CONFORMANCE_ARGS (extra pytest args, e.g. -k transfers),
# BENCH_TIMEOUT (s per backend), BENCH_EXTRA (e.g. --quick), EXTRA (a command run after the benches).
# Needs python3 with torch, jax, numpy, rich, matplotlib, pytest, hypothesis, setuptools (the image has
# them). multidev is installed editable with --no-deps (the tree imports as installed).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu}" && cd "${OUT:-$REPO/build/gpu}" && pwd)
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)}
PY=${PYTHON:-python3}
BACKENDS=${BACKENDS:-torch,jax}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore::DeprecationWarning
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
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
"$PY" -c "import sys, numpy, multidev as md; print(sys.version.split()[0], 'numpy', numpy.__version__); [print(n, md.backend(n).version(), md.devices(backend=n)) for n in '$BACKENDS'.split(',')]"
NG=$("$PY" -c "import multidev as md; print(md.num_gpus(backend='${BACKENDS%%,*}'))" 2>/dev/null || echo 0)
DEVS=cpu:0
for ((i = 0; i < NG; i++)); do DEVS="$DEVS,gpu:$i"; done

if [ "${CONFORMANCE:-1}" = 1 ]; then
  stamp "conformance: $BACKENDS (devices $DEVS)"
  timeout -s INT -k 20 "${CONFORMANCE_TIMEOUT:-240}" "$PY" -m multidev.cli conformance --backend "$BACKENDS" \
    --device "$DEVS" --json "$OUT/conformance-$TAG.json" -- -q -p no:cacheprovider ${CONFORMANCE_ARGS:-}
  echo "conformance exit code: $?"
fi

parts=()
for b in ${BACKENDS//,/ }; do
  [ -n "${SUITES:-}" ] && S="--suite $SUITES" || S=""
  stamp "bench $b on $DEVS ${SUITES:-all suites}"
  timeout -k 20 "${BENCH_TIMEOUT:-200}" "$PY" -m multidev.cli bench --backend "$b" --device "$DEVS" $S \
    --precision "${PRECISION:-fp32}" --budget 1 --max-time $(( ${BENCH_TIMEOUT:-200} - 30 )) --no-progress \
    ${BENCH_EXTRA:-} --json "$OUT/bench-$b.json" > "$OUT/bench-$b.txt" 2>&1
  echo "bench $b exit code: $?"
  grep -E "^(met|MISSED)|correctness" "$OUT/bench-$b.txt" | head -40
  [ -s "$OUT/bench-$b.json" ] && parts+=("$OUT/bench-$b.json")
done

stamp "report"
if [ ${#parts[@]} -gt 0 ]; then
  COLUMNS=200 MD bench --report "${parts[@]}" --json "$OUT/$TAG.json" --plot "$OUT/$TAG.png" \
    --markdown "$OUT/$TAG.md" > "$OUT/report.txt" 2>&1 && rm -f "$OUT"/bench-*.json
  grep -E "^(met|MISSED)" "$OUT/report.txt"
fi
if [ -n "${EXTRA:-}" ]; then stamp "extra: $EXTRA"; bash -c "$EXTRA"; fi
stamp "done"; ls -la "$OUT"
