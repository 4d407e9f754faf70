#!/usr/bin/env bash
# Issue #36's GPU rows on one lent H200 (torch 2.11 CUDA 13, JAX 0.11.2, CuPy 14; no TF/MXNet, no internet),
# about 5.5 minutes on the H200's host (every step under a time cap; 6.8 at worst):
#   1. bench suites overhead and bandwidth for torch and JAX on cpu:0 + gpu:0 (thin calls, creation,
#      convert torch<->JAX at every size against the consumer's own from_dlpack, D2H 1-256 MiB against
#      the preallocated pinned copy measured beside it), CuPy bandwidth on gpu:0 (D2H 1-256 MiB);
#   2. torch D2H step by step (scripts/gpu/d2h_torch_probe.py: md.to_numpy against a pinned copy on the
#      current stream and on a copy stream, preallocated and from torch's caching host allocator);
#   3. collectives: the NumPy and JAX study on 8 virtual CPU devices of the host (a quiet 16-core
#      machine: in place against out of place, every algorithm against the memcpy bound, auto against
#      the best) and JAX on gpu:0 alone (one device: the n=1 path);
#   4. suite models for torch and JAX on cpu:0 + gpu:0 (md.to(model) resident and moved, train_batch);
#   5. call_profile of convert (torch->JAX on the GPU step by step) and the thin calls;
#   6. one merged report ($TAG.json/.md/.png) and `multidev bench --report ... --check`
#      (--stability strict: unstable rows are named, not judged).
# Writes into $OUT (8 files, no folders): log.txt, $TAG.json, $TAG.md, $TAG.png, $TAG-d2h-probe.txt,
# $TAG-scaling.md, $TAG-call-profile.txt, details.tar.gz (every step's own output and JSON).
#   OUT=/path/to/out bash scripts/gpu/round4-perf.sh
# Knobs: PY (python3), TAG (h200-DATE-round4-perf), DRY_RUN=1 (no GPU: cpu:0 only, tiny sizes, no CuPy,
# no probe: tries the script on a CPU machine; on a loaded 2-core VM the capped steps get cut), SKIP_INSTALL=1.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-round4-perf}" && cd "${OUT:-$REPO/build/gpu-round4-perf}" && pwd)
PY=${PY:-python3}
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)-round4-perf}
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
uptime || true

bench() {  # bench NAME CAP ARGS...: one bench process, capped; its JSON and table into $W
  local name=$1 cap=$2; shift 2
  timeout -k 10 "$cap" "$PY" -m multidev.cli bench --no-progress --max-time $(( cap - 12 )) \
    --json "$W/bench-$name.json" "$@" > "$W/bench-$name.txt" 2>&1
  echo "bench $name exit $?"; grep -E "^(met|MISSED|INVALID|UNSTABLE|warning)|correctness" "$W/bench-$name.txt" | head -60
}

DEVS=cpu:0,gpu:0; FAST="--reps 8 --budget 0.15 --max-bytes 256MiB"; STUDY="--max-bytes 16MiB --reps 7 --budget 0.25"
MODELS="--reps 8 --budget 0.5"
if [ "${DRY_RUN:-0}" = 1 ]; then DEVS=cpu:0; FAST="--quick"; STUDY="--quick"; MODELS="--quick"; fi

stamp "1. thin calls, creation, convert, bandwidth (torch, JAX on $DEVS; CuPy bandwidth on gpu:0)"
bench torch 50 --backend torch --device "$DEVS" --suite overhead,bandwidth $FAST
bench jax 60 --backend jax --device "$DEVS" --suite overhead,bandwidth $FAST
[ "${DRY_RUN:-0}" = 1 ] || bench cupy 30 --backend cupy --device gpu:0 --suite bandwidth $FAST

stamp "2. torch D2H step by step (1-256 MiB)"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "(no GPU: skipped)"; else
  timeout -k 5 30 "$PY" scripts/gpu/d2h_torch_probe.py --rounds 7 --json "$W/d2h-probe.json" > "$OUT/$TAG-d2h-probe.txt" 2>&1
  echo "d2h probe exit $?"; cat "$OUT/$TAG-d2h-probe.txt" | tail -40
fi

stamp "3. collectives: NumPy and JAX on 8 virtual CPU devices of the host; JAX on gpu:0 alone"
bench collectives 45 --backend numpy,jax --suite collectives --cpu-devices 8 $STUDY
[ "${DRY_RUN:-0}" = 1 ] || bench collectives-gpu 20 --backend jax --device gpu:0 --suite collectives $FAST
if [ -s "$W/bench-collectives.json" ]; then
  timeout -k 5 30 "$PY" -m multidev.benchmarks.scaling fit "$W/bench-collectives.json" --out "$W/model-h200-host.json" \
    > "$W/fit.txt" 2>&1 || echo "fit exit $?"
  MULTIDEV_COLLECTIVE_MODEL="$W/model-h200-host.json" timeout -k 5 30 "$PY" -m multidev.benchmarks.scaling report \
    "$W/bench-collectives.json" --markdown "$OUT/$TAG-scaling.md" --plot "$W/scaling.png" \
    --command "OUT=\$OUT bash scripts/gpu/round4-perf.sh (step 3)" > "$W/scaling.txt" 2>&1 || echo "scaling report exit $?"
  sed -n '/^## Headline/,/^## allreduce/p' "$OUT/$TAG-scaling.md" | head -14
fi

stamp "4. md.to(model) and train_batch (suite models; torch, JAX on $DEVS)"
bench models-torch 45 --backend torch --device "$DEVS" --suite models $MODELS
bench models-jax 45 --backend jax --device "$DEVS" --suite models $MODELS

stamp "5. convert and the thin calls step by step (call_profile)"
PROFILE_CPU=""; [ "${DRY_RUN:-0}" = 1 ] && PROFILE_CPU="--cpu"
timeout -k 5 35 "$PY" -m multidev.benchmarks.baselines.call_profile --rows thin,convert --rounds 7 $PROFILE_CPU \
  --out "$W/call-profile.json" > "$W/call-profile.txt" 2>&1
echo "call_profile exit $?"; grep -E "^== |^  [a-z.]|left out" "$W/call-profile.txt" | head -30
cp "$W/call-profile.txt" "$OUT/$TAG-call-profile.txt" 2>/dev/null || true

stamp "6. one report, and --check on it"
parts=(); for f in "$W"/bench-torch.json "$W"/bench-jax.json "$W"/bench-cupy.json "$W"/bench-collectives.json \
  "$W"/bench-collectives-gpu.json "$W"/bench-models-torch.json "$W"/bench-models-jax.json; do
  [ -s "$f" ] && parts+=("$f"); done
if [ ${#parts[@]} -gt 0 ]; then
  timeout -k 5 40 "$PY" -m multidev.cli bench --report "${parts[@]}" --json "$OUT/$TAG.json" --plot "$OUT/$TAG.png" \
    --markdown "$OUT/$TAG.md" --check > "$W/report.txt" 2>&1
  echo "bench --report --check exit $? (3: a goal row missed, unstable or above its bound; the lines follow)"
  grep -E "^(met|MISSED|INVALID|UNSTABLE|warning)|multidev bench --check" "$W/report.txt" | head -120
fi

stamp "done: the step outputs go into details.tar.gz"
tar czf "$OUT/details.tar.gz" -C "$W" . || echo "tar exit $?"
rm -rf "$W"
ls -la "$OUT"
