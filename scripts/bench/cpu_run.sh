#!/usr/bin/env bash
# The committed CPU results: every backend in its own process (no framework's thread pools beside
# another's), NumPy/torch/JAX/TensorFlow from the "modern" environment and MXNet from the one with
# numpy 1.26, merged into benchmarks/results/cpu-DATE.{json,png,md}. About 6 minutes on 2 cores.
#   MODERN=/path/to/venv MX=/path/to/mx-venv bash scripts/bench/cpu_run.sh [extra bench args]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODERN=${MODERN:-$REPO/.venv}
MX=${MX:-$REPO/.venv-mx}
DATE=$(date -u +%Y-%m-%d)
B="$REPO/build/bench-cpu"
R="$REPO/benchmarks/results"
mkdir -p "$B" "$R"
export TF_CPP_MIN_LOG_LEVEL=2 COLUMNS=${COLUMNS:-200}
cd "$REPO"
parts=()
for b in numpy torch jax tensorflow; do
  echo "== $b ($MODERN)"
  "$MODERN/bin/multidev" bench --backend "$b" --no-progress --json "$B/$b.json" "$@" > "$B/$b.txt" 2>&1 \
    || echo "   $b: exit $? (see $B/$b.txt)"
  [ -s "$B/$b.json" ] && parts+=("$B/$b.json")
done
if [ -x "$MX/bin/multidev" ]; then
  echo "== mxnet ($MX)"
  "$MX/bin/multidev" bench --backend mxnet --no-progress --json "$B/mxnet.json" "$@" > "$B/mxnet.txt" 2>&1 \
    || echo "   mxnet: exit $? (see $B/mxnet.txt)"
  [ -s "$B/mxnet.json" ] && parts+=("$B/mxnet.json")
fi
"$MODERN/bin/multidev" bench --report "${parts[@]}" --json "$R/cpu-$DATE.json" --plot "$R/cpu-$DATE.png" \
  --markdown "$R/cpu-$DATE.md"
