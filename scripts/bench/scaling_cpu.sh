#!/usr/bin/env bash
# The committed collectives scaling study on this repository's CPU machine: the collectives suite on
# 2, 4 and 8 virtual CPU devices, 4 KiB to $MAX (64 MiB by default: the cap for 2 cores and 24 GiB),
# every backend in its own process (NumPy, JAX, TensorFlow from the modern environment, MXNet from
# the one with numpy 1.26; torch has one CPU device: no row), merged into
# benchmarks/results/scaling-cpu-$DATE.{json,md,png}, the model fitted from it, and the study's report
# scaling-cpu-$DATE-report.{md,png}.
#   MODERN=/path/to/venv MX=/path/to/mx-venv bash scripts/bench/scaling_cpu.sh [--write-model] [extra bench args]
# --write-model: rewrite multidev/data/collective_model.json (the model auto ships with) from this run.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODERN=${MODERN:-$REPO/.venv}
MX=${MX:-$REPO/.venv-mx}
DATE=${DATE:-$(date -u +%Y-%m-%d)}
MAX=${MAX:-64MiB}
WRITE=0
if [ "${1:-}" = --write-model ]; then WRITE=1; shift; fi
B="$REPO/build/scaling-cpu"
R="$REPO/benchmarks/results"
mkdir -p "$B" "$R"
export TF_CPP_MIN_LOG_LEVEL=2 COLUMNS=${COLUMNS:-200} PYTHONWARNINGS=ignore::DeprecationWarning
cd "$REPO"
ARGS=(--suite collectives --cpu-devices 8 --max-bytes "$MAX" --reps 5 --budget 1 --no-progress "$@")
parts=()
for b in numpy jax tensorflow; do
  echo "== $b ($MODERN) $(date -u +%T)"
  "$MODERN/bin/multidev" bench --backend "$b" "${ARGS[@]}" --json "$B/$b.json" > "$B/$b.txt" 2>&1 \
    || echo "   $b: exit $? (see $B/$b.txt)"
  [ -s "$B/$b.json" ] && parts+=("$B/$b.json")
done
if [ -x "$MX/bin/multidev" ]; then
  echo "== mxnet ($MX) $(date -u +%T)"
  "$MX/bin/multidev" bench --backend mxnet "${ARGS[@]}" --json "$B/mxnet.json" > "$B/mxnet.txt" 2>&1 \
    || echo "   mxnet: exit $? (see $B/mxnet.txt)"
  [ -s "$B/mxnet.json" ] && parts+=("$B/mxnet.json")
fi
OUT="$R/scaling-cpu-$DATE"
"$MODERN/bin/multidev" bench --report "${parts[@]}" --json "$OUT.json" --markdown "$OUT.md" --plot "$OUT.png" \
  > "$B/report.txt" 2>&1 || echo "   report: exit $? (see $B/report.txt)"
if [ "$WRITE" = 1 ]; then
  "$MODERN/bin/python" -m multidev.benchmarks.scaling fit "$OUT.json" --write \
    --source "benchmarks/results/scaling-cpu-$DATE.json (MODERN=... MX=... bash scripts/bench/scaling_cpu.sh)"
fi
"$MODERN/bin/python" -m multidev.benchmarks.scaling report "$OUT.json" --markdown "$OUT-report.md" \
  --plot "$OUT-report.png" --command "bash scripts/bench/scaling_cpu.sh $*"
echo "== done $(date -u +%T)"
