#!/usr/bin/env bash
# Issue 36's convert rows after the steady accelerator route (exchange._Route.steady) on the lent
# H200: JAX <-> torch against the native DLPack call at 1 and 256 MiB on the GPU and on the host
# (scripts/gpu/convert_probe.py, alternating medians, with a cProfile of JAX -> torch on the GPU),
# then the conformance suite's interop and DLPack checks on gpu:0 for torch, JAX and CuPy (each
# other's partners): the route's results are right. About 3 minutes; prints everything.
#   OUT=/path/to/out bash scripts/gpu/round7-convert.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r7convert}" && cd "${OUT:-$REPO/build/gpu-r7convert}" && pwd)
PY=${PY:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c "import torch, jax, cupy; print('torch', torch.__version__, 'jax', jax.__version__, 'cupy', cupy.__version__)"
  echo "== convert probe"; timeout 200 "$PY" scripts/gpu/convert_probe.py; } > "$OUT/convert.txt" 2>&1
cat "$OUT/convert.txt"
status=0
for b in torch jax cupy; do
  echo "== conformance $b --device gpu:0 -k 'interop or dlpack or convert'"
  timeout -s INT -k 15 200 "$PY" -m multidev.cli conformance --backend "$b" --device gpu:0 \
    --json "$OUT/conformance-$b.json" -- -q -p no:cacheprovider -rfE -k "interop or dlpack or convert" \
    >"$OUT/conformance-$b.log" 2>&1 || status=1
  tail -n 15 "$OUT/conformance-$b.log"
done
exit $status
