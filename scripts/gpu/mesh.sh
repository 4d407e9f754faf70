#!/usr/bin/env bash
# Issue 34 (meshes and layouts) on the lent GPU machine (torch CUDA, JAX; no TF/MXNet, no internet),
# about 2 minutes: the mesh conformance checks for torch and JAX, scripts/gpu/mesh_probe.py (a mesh of
# every GPU: placement, JAX<->torch piece by piece, collectives along axes, md.to against
# jax.device_put), and `multidev bench --suite mesh` (GPUs where there are two or more, else 4 virtual
# CPU devices), and scripts/gpu/mesh_training.py (training on a mesh of every GPU against one GPU).
# Writes log.txt and mesh.md into $OUT.
#   OUT=/path/to/out bash scripts/gpu/mesh.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-mesh}" && cd "${OUT:-$REPO/build/gpu-mesh}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false COLUMNS=200 MULTIDEV_JAX_CPU_DEVICES=4
exec > >(tee -a "$OUT/log.txt") 2>&1
[ "${SKIP_INSTALL:-0}" = 1 ] || (cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .)
cd "$REPO"
nvidia-smi -L || true
timeout 300 "$PY" -m multidev.cli conformance --backend torch,jax -- -q -k "test_mesh" || echo "conformance exit $?"
timeout 200 "$PY" scripts/gpu/mesh_probe.py || echo "probe exit $?"
timeout 300 "$PY" -m multidev.cli bench --backend jax,torch --suite mesh --cpu-devices 4 --reps 20 --budget 2 \
  --markdown "$OUT/mesh.md" --no-progress || echo "bench exit $?"
timeout 300 "$PY" scripts/gpu/mesh_training.py || echo "mesh training exit $?"
