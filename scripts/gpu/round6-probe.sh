#!/usr/bin/env bash
# Two probes of issue 36's H200 misses, about a minute: md.to(model) on a real move (LeNet) and
# md.convert(JAX GPU array, "torch"), each against the native call with a cProfile of multidev's side.
#   OUT=/path/to/out bash scripts/gpu/round6-probe.sh   (writes $OUT/probes.txt)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r6probe}" && cd "${OUT:-$REPO/build/gpu-r6probe}" && pwd)
PY=${PY:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ echo "== model move"; timeout 120 "$PY" scripts/gpu/model_move_probe.py
  echo "== convert jax -> torch"; timeout 120 "$PY" scripts/gpu/convert_probe.py; } > "$OUT/probes.txt" 2>&1
cat "$OUT/probes.txt"
