#!/usr/bin/env bash
# Issue 36's rows after this round's convert and host-thread changes, on a lent H200 (16 host cores;
# torch 2.11 CUDA, JAX 0.11.2; no TF/MXNet, no internet), one call of about 7 minutes, every step
# under a time cap:
#   1. convert JAX <-> torch against the native DLPack call at 1 and 256 MiB on the GPU and on the host
#      (scripts/gpu/convert_probe.py: alternating medians; the host route of JAX now hands its capsule
#      over unread after one checked call, plain_host_exports);
#   2. NumPy allreduce on 2, 4, 8 virtual devices, 1-64 MiB (scripts/bench/coll_rows.py: in place / out of
#      place, each against the memcpy bound of the same rounds), with multidev's host threads (default)
#      and with MULTIDEV_HOST_THREADS=1 (one thread, as before): A/B in one lease;
#   3. the tests of both changes on the image's versions: tests/test_hostthreads.py,
#      tests/test_convert_steady_route.py, and the suite's plain_host_exports and convert checks (JAX, NumPy).
# Writes into $OUT: log.txt, convert.txt, rows-threads.md, rows-one-thread.md, tests.txt.
#   OUT=/path/to/out bash scripts/gpu/round11.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-round11}" && cd "${OUT:-$REPO/build/gpu-round11}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore COLUMNS=200
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
stamp "install multidev (editable, no dependencies) at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
nproc; uptime; nvidia-smi -L || true
"$PY" -c "import numpy, torch, jax; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__)"

stamp "1. convert probe"
timeout -k 5 150 "$PY" scripts/gpu/convert_probe.py > "$OUT/convert.txt" 2>&1; echo "exit $?"
grep -v "^ " "$OUT/convert.txt" | head -40

for mode in threads one-thread; do
  stamp "2. NumPy allreduce rows ($mode)"
  env $([ $mode = one-thread ] && echo MULTIDEV_HOST_THREADS=1) timeout -k 5 120 "$PY" scripts/bench/coll_rows.py \
    --backend numpy --counts 2,4,8 --sizes 1MiB,4MiB,16MiB,64MiB --rounds 21 \
    --markdown "$OUT/rows-$mode.md" > "$OUT/rows-$mode.txt" 2>&1; echo "exit $?"
  grep -E "^\|" "$OUT/rows-$mode.txt" | cut -c1-260
done

stamp "3. tests on the image's versions"
{ timeout -k 5 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_hostthreads.py tests/test_convert_steady_route.py
  timeout -k 5 90 "$PY" -m multidev.cli conformance --backend jax,numpy -- -q -p no:cacheprovider -rfE \
    -k "plain_host_exports or convert_shares or convert_keeps"; } > "$OUT/tests.txt" 2>&1; echo "exit $?"
tail -n 25 "$OUT/tests.txt"
stamp "finished"
