#!/usr/bin/env bash
# Issue #23's rows on one lent H200 (no internet), about 4.5 minutes (every step under a time cap: 6.5 at worst):
#   1. the bench suites overhead and bandwidth on cpu:0 + gpu:0 for torch and JAX, on gpu:0 for CuPy
#      (thin calls, creation, synchronize, convert torch<->JAX, pageable H2D at 1 MiB, D2H with JAX's
#      honest baseline, every row checked against the pinned copy measured beside it), sizes to 256 MiB;
#   2. the collectives scaling study on 8 virtual CPU devices of the host (NumPy and JAX; one GPU
#      gives no GPU collective), 4 KiB to 16 MiB, with its fit and report;
#   3. the thin calls step by step (benchmarks/baselines/call_profile.py: torch's thin calls and creation,
#      convert, synchronize, DLPack's C exchange route);
#   4. one merged report ($TAG.json/.md/.png) and `multidev bench --report ... --check` (its exit
#      status is in log.txt: 3 when a goal row is missed or a row is above its bound).
# Writes into $OUT (8 files, no folders): log.txt, $TAG.json, $TAG.md, $TAG.png, $TAG-scaling.md,
# $TAG-scaling.png, $TAG-call-profile.txt, details.tar.gz (every step's output and JSON).
#   OUT=/path/to/out bash scripts/gpu/perf.sh
# Knobs: PY (python3), TAG (h200-DATE-perf), CAP (seconds per bench step, default 50), DRY_RUN=1 (no GPU:
# cpu:0 only, tiny sizes, no CuPy: tries the script on a CPU machine), SKIP_INSTALL=1.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-perf}" && cd "${OUT:-$REPO/build/gpu-perf}" && pwd)
PY=${PY:-python3}
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)-perf}
CAP=${CAP:-50}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore::DeprecationWarning COLUMNS=200
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch, JAX and CuPy take turns on the GPU
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
W=$(mktemp -d)  # every step's own output: archived at the end (details.tar.gz)

stamp "install multidev (editable, no dependencies) at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
[ "${SKIP_INSTALL:-0}" = 1 ] || (cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) \
  || exit 1
cd "$REPO"
nvidia-smi -L || true
"$PY" -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__)" || true

bench() {  # bench NAME CAP ARGS...: one bench process, capped; its JSON and table into $W
  local name=$1 cap=$2; shift 2
  timeout -k 10 "$cap" "$PY" -m multidev.cli bench --no-progress --max-time $(( cap - 12 )) \
    --json "$W/bench-$name.json" "$@" > "$W/bench-$name.txt" 2>&1
  echo "bench $name exit $?"; grep -E "^(met|MISSED|INVALID)|correctness" "$W/bench-$name.txt" | head -60
}

DEVS=cpu:0,gpu:0; FAST="--reps 6 --budget 0.15 --max-bytes 256MiB"; STUDY="--max-bytes 16MiB --reps 5 --budget 0.25"
if [ "${DRY_RUN:-0}" = 1 ]; then DEVS=cpu:0; FAST="--quick"; STUDY="--quick"; fi

stamp "1. thin calls, creation, convert, bandwidth (torch, JAX on $DEVS; CuPy on gpu:0)"
bench torch "$CAP" --backend torch --device "$DEVS" --suite overhead,bandwidth $FAST
bench jax $(( CAP + 15 )) --backend jax --device "$DEVS" --suite overhead,bandwidth $FAST
[ "${DRY_RUN:-0}" = 1 ] || bench cupy $(( CAP - 20 )) --backend cupy --device gpu:0 --suite overhead,bandwidth $FAST

stamp "2. collectives scaling study: NumPy and JAX on 8 virtual CPU devices of the host"
bench collectives "$CAP" --backend numpy,jax --suite collectives --cpu-devices 8 $STUDY
if [ -s "$W/bench-collectives.json" ]; then
  timeout -k 5 40 "$PY" -m multidev.benchmarks.scaling fit "$W/bench-collectives.json" --out "$W/model-h200-host.json" \
    > "$W/fit.txt" 2>&1 || echo "fit exit $?"
  # auto's choice in the report: the model refitted on this host (what $MULTIDEV_COLLECTIVE_MODEL is for)
  MULTIDEV_COLLECTIVE_MODEL="$W/model-h200-host.json" timeout -k 5 40 "$PY" -m multidev.benchmarks.scaling report "$W/bench-collectives.json" \
    --markdown "$OUT/$TAG-scaling.md" --plot "$OUT/$TAG-scaling.png" \
    --command "OUT=\$OUT bash scripts/gpu/perf.sh (step 2)" > "$W/scaling.txt" 2>&1 || echo "scaling report exit $?"
  sed -n '/^## Headline/,/^## allreduce/p' "$OUT/$TAG-scaling.md" | head -12
fi

stamp "3. the thin calls step by step (call_profile: thin, convert, sync, cexchange)"
PROFILE_CPU=""; [ "${DRY_RUN:-0}" = 1 ] && PROFILE_CPU="--cpu"
timeout -k 5 50 "$PY" -m multidev.benchmarks.baselines.call_profile --rows thin,convert,sync,cexchange --rounds 9 $PROFILE_CPU \
  --out "$W/call-profile.json" > "$W/call-profile.txt" 2>&1
echo "call_profile exit $?"; grep -E "^== |^  [a-z.]|left out" "$W/call-profile.txt" | head -40
cp "$W/call-profile.txt" "$OUT/$TAG-call-profile.txt" 2>/dev/null || true

stamp "4. one report, and --check on it"
parts=(); for f in "$W"/bench-torch.json "$W"/bench-jax.json "$W"/bench-cupy.json "$W"/bench-collectives.json; do
  [ -s "$f" ] && parts+=("$f"); done
if [ ${#parts[@]} -gt 0 ]; then
  timeout -k 5 60 "$PY" -m multidev.cli bench --report "${parts[@]}" --json "$OUT/$TAG.json" --plot "$OUT/$TAG.png" \
    --markdown "$OUT/$TAG.md" --check > "$W/report.txt" 2>&1
  echo "bench --report --check exit $? (3: a goal row missed or a row above its bound; the lines follow)"
  grep -E "^(MISSED|INVALID)|multidev bench --check" "$W/report.txt" | head -80
fi

stamp "done: the step outputs go into details.tar.gz"
tar czf "$OUT/details.tar.gz" -C "$W" . || echo "tar exit $?"
rm -rf "$W"
ls -la "$OUT"
