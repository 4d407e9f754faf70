#!/usr/bin/env bash
# Round 2's diagnostic call on a lent H200 (about 6 minutes), before the final run (scripts/gpu/final.sh):
#   A. in parallel: the mutation catalogue's torch mutants and controls on cpu:0 + every GPU (the
#      controls' failure tracebacks in mutants-torch.json), the three checks the torch control
#      failed there re-run for the control alone and for the real torch adapter (numpy partner,
#      -rfE), and the CuPy adapter's GPU tests;
#   B. one after another: benchmarks/baselines/call_profile.py (thin calls: md against native, cProfile),
#      benchmarks/h2d_breakdown.py (torch small uploads), benchmarks/baselines/jax_upload_tuning.py (ways to
#      upload pageable memory with JAX), and the CuPy overhead and bandwidth suites.
#   MULTIDEV_SOURCE_COMMIT=$(git rev-parse HEAD) TAG=... bash scripts/gpu/probe.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-probe}" && cd "${OUT:-$REPO/build/gpu-probe}" && pwd)
TAG=${TAG:-h200-$(date -u +%Y-%m-%d)-probe}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::DeprecationWarning COLUMNS=200 XLA_PYTHON_CLIENT_PREALLOCATE=false
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
stamp "install multidev at ${MULTIDEV_SOURCE_COMMIT:-unknown commit}"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
NG=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
DEVS=cpu:0; for ((i = 0; i < NG; i++)); do DEVS="$DEVS,gpu:$i"; done

stamp "A. correctness, in parallel"
(OUT="$OUT" ONLY=torch timeout -k 10 200 bash scripts/gpu/mutants.sh > "$OUT/mutants.txt" 2>&1) &
p1=$!
K="dlpack_concern_matches_behaviour or convert_shares_memory_wherever_both_sides_can"
(for spec in mutants:TorchControl torch; do
   echo "---- $spec"
   PYTHONPATH=tests timeout -k 10 120 "$PY" -m multidev.cli conformance --backend "$spec" --device "$DEVS" \
     -- -p mutants --multidev-partner=numpy -k "$K" -rfE -q -p no:cacheprovider 2>&1 | tail -n 120
 done > "$OUT/control-checks.txt" 2>&1) &
p2=$!
(timeout -k 10 150 "$PY" -m pytest tests/test_adapter_cupy.py -m gpu -q -p no:cacheprovider -o addopts= \
  --import-mode=importlib -rs > "$OUT/pytest-cupy.txt" 2>&1) &
p3=$!
for p in $p1 $p2 $p3; do wait $p; echo "pid $p exit $?"; done
tail -n 30 "$OUT/mutants.txt"; grep -E "passed|failed" "$OUT/control-checks.txt"; tail -n 3 "$OUT/pytest-cupy.txt"

stamp "B. timing, one at a time"
timeout -k 10 100 "$PY" -m multidev.benchmarks.baselines.call_profile --out "$OUT/$TAG.call-profile.json" > "$OUT/call-profile.txt" 2>&1
echo "call_profile exit $?"; grep -E "^== |left out" "$OUT/call-profile.txt"
timeout -k 10 40 "$PY" -m multidev.benchmarks.h2d_breakdown --backend torch --rounds 200 \
  --out "$OUT/$TAG.h2d-breakdown.json" > "$OUT/h2d-breakdown.txt" 2>&1
echo "h2d_breakdown exit $?"; cat "$OUT/h2d-breakdown.txt"
timeout -k 10 110 "$PY" -m multidev.benchmarks.baselines.jax_upload_tuning --out "$OUT/$TAG.jax-upload.json" \
  > "$OUT/jax-upload.txt" 2>&1
echo "jax_upload_tuning exit $?"; cat "$OUT/jax-upload.txt"
timeout -k 10 60 "$PY" -m multidev.cli bench --no-progress --max-time 45 --backend cupy --device gpu:0 \
  --suite overhead,bandwidth --reps 6 --budget 0.2 --json "$OUT/$TAG.bench-cupy.json" > "$OUT/bench-cupy.txt" 2>&1
echo "bench cupy exit $?"; grep -E "^(met|MISSED)|correctness" "$OUT/bench-cupy.txt"
stamp "done"
ls -la "$OUT"
