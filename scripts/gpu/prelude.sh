# Sourced by a host-only GPU-machine script (scripts/gpu/round12.sh, round13.sh) after it sets NAME:
# strict mode; REPO (this checkout); OUT (default build/gpu-$NAME, created); PY (default python3); the
# environment of a CPU-only run; everything after it also into $OUT/log.txt; `stamp` (seconds since
# the start); the editable install of multidev (no dependencies, no index). Leaves the shell in $REPO.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-$NAME}" && cd "${OUT:-$REPO/build/gpu-$NAME}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore COLUMNS=200 CUDA_VISIBLE_DEVICES= TF_CPP_MIN_LOG_LEVEL=2
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
stamp "install multidev (editable, no dependencies)"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
