#!/usr/bin/env bash
# Issue 36's rows on the one-process collectives, on a lent H200 host (16 quiet cores; torch 2.11 CUDA,
# JAX 0.11.2, CuPy 14; no TF/MXNet, no internet), about 5 minutes (every step under a time cap):
#   1. NumPy allreduce on 2, 4, 8 virtual devices of the host, 1-64 MiB (scripts/bench/coll_rows.py:
#      alternating rounds, medians): in place / out of place per algorithm, each algorithm's fraction of
#      the memcpy bound (n copies of the size, timed in the same rounds), auto against the best;
#   2. the bench's own study (`multidev bench --suite collectives`, NumPy, 8 virtual devices, to 64 MiB)
#      with its goals and stability marks, and the scaling report of it;
#   3. auto against the best on JAX's virtual CPU devices (2, 4, 8; 4 KiB-16 MiB);
#   4. auto against the best where the collectives run beside the one GPU: gpu:0 + cpu:0 on torch and
#      JAX (the single-GPU cases; a second GPU is not there, so no GPU-only allreduce runs).
# Writes into $OUT (4 files, no folders): log.txt, $TAG-rows.md (steps 1, 3, 4), $TAG-scaling.md (step 2's
# report), details.tar.gz (every step's own output and JSON).
#   OUT=/path/to/out bash scripts/gpu/round6-coll.sh
# Knobs: PY (python3), TAG (h200-DATE-round6-coll), DRY_RUN=1 (no GPU: step 4 skipped, small sizes; tries
# the script on a CPU machine), SKIP_INSTALL=1.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-round6-coll}" && cd "${OUT:-$REPO/build/gpu-round6-coll}" && pwd)
PY=${PY:-python3}
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)-round6-coll}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore COLUMNS=200
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
W=$(mktemp -d)

stamp "install multidev (editable, no dependencies) at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
[ "${SKIP_INSTALL:-0}" = 1 ] || (cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) \
  || exit 1
cd "$REPO"
nvidia-smi -L || true
"$PY" -c "import numpy, torch, jax; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__)" || true
uptime || true

BIG=1MiB,4MiB,16MiB,64MiB; SMALL=4KiB,256KiB,4MiB,16MiB; GPU=4KiB,64KiB,1MiB,16MiB,64MiB; R=21; MAXB=64MiB
STUDY="--reps 7 --budget 0.25"
if [ "${DRY_RUN:-0}" = 1 ]; then BIG=1MiB,4MiB; SMALL=4KiB,1MiB; R=5; MAXB=1MiB; STUDY="--quick"; fi

rows() {  # rows NAME CAP ARGS...: scripts/bench/coll_rows.py, capped; its table into $W/rows-NAME.md
  local name=$1 cap=$2; shift 2
  timeout -k 5 "$cap" "$PY" scripts/bench/coll_rows.py --json "$W/rows-$name.json" --markdown "$W/rows-$name.md" "$@" \
    > "$W/rows-$name.txt" 2>&1
  echo "rows $name exit $?"; grep -E "^\|" "$W/rows-$name.txt" | cut -c1-260
}

stamp "1. NumPy allreduce rows: 2, 4, 8 virtual devices, $BIG"
rows numpy 110 --backend numpy --counts 2,4,8 --sizes "$BIG" --rounds $R

stamp "2. the bench's collectives study (NumPy, 8 virtual devices, to $MAXB) and its report"
timeout -k 10 90 "$PY" -m multidev.cli bench --no-progress --max-time 75 --backend numpy --suite collectives \
  --cpu-devices 8 --max-bytes $MAXB $STUDY --json "$W/bench-collectives.json" > "$W/bench-collectives.txt" 2>&1
echo "bench collectives exit $?"
grep -E "^(met|MISSED|INVALID|UNSTABLE|warning)|correctness" "$W/bench-collectives.txt" | head -60
if [ -s "$W/bench-collectives.json" ]; then
  timeout -k 5 30 "$PY" -m multidev.benchmarks.scaling report "$W/bench-collectives.json" --markdown "$OUT/$TAG-scaling.md" \
    --command "OUT=\$OUT bash scripts/gpu/round6-coll.sh (step 2)" > "$W/scaling.txt" 2>&1 || echo "scaling report exit $?"
  sed -n '/^## Headline/,/^## allreduce/p' "$OUT/$TAG-scaling.md" | head -12
fi

stamp "3. auto against the best on JAX's virtual CPU devices (2, 4, 8; $SMALL)"
rows jax-cpu 45 --backend jax --counts 2,4,8 --sizes "$SMALL" --rounds 11

stamp "4. auto against the best beside the one GPU: gpu:0 + cpu:0 (torch, JAX)"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "(no GPU: skipped)"; else
  rows torch-gpu 30 --backend torch --devices gpu:0,cpu:0 --sizes "$GPU" --rounds 15
  rows jax-gpu 30 --backend jax --devices gpu:0,cpu:0 --sizes "$GPU" --rounds 15
fi

stamp "done: tables into $TAG-rows.md, the step outputs into details.tar.gz"
for f in "$W"/rows-numpy.md "$W"/rows-jax-cpu.md "$W"/rows-torch-gpu.md "$W"/rows-jax-gpu.md; do
  [ -s "$f" ] && { echo "## $(basename "$f" .md)"; echo; cat "$f"; echo; }
done > "$OUT/$TAG-rows.md"
tar czf "$OUT/details.tar.gz" -C "$W" . || echo "tar exit $?"
rm -rf "$W"
stamp "finished"
