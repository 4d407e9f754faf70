#!/usr/bin/env bash
# Issue 36's multi-process rows on a quiet machine (the lent H200's host: 16 cores, nothing else
# running; the shared 2-core VM cannot certify a 5% ratio): `multidev.distributed`'s collectives on
# every engine installed there (torch over gloo, MPI through mpi4py, JAX's multi-controller runtime
# over gloo) at 2 and 4 processes, 4 KiB to 256 MiB, checks off and on, against the engine's own
# call in the same run, with the hang detection's time-to-error; the bench judges each row's
# stability itself. CPU tensors only.
#   OUT=/path/to/out bash scripts/gpu/round6-dist.sh
# Writes $OUT/distributed-quiet.{json,md}, $OUT/versions.txt, $OUT/log.txt (4 files). ENGINES=torch,jax
# picks engines (MPI alone takes about 6 minutes there: its 2- and 4-process runs took 138 and 197 s).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r6dist}" && cd "${OUT:-$REPO/build/gpu-r6dist}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 PYTHONWARNINGS=ignore TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; "$PY" -c "import torch, jax, mpi4py; print('torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; } > "$OUT/versions.txt" 2>&1
timeout -k 10 "${CAP:-500}" "$PY" -m multidev.benchmarks.distributed_run --out "$OUT/distributed-quiet" \
  --processes 2,4 --reps "${REPS:-12}" --faults 2 ${ENGINES:+--engines "$ENGINES"} > "$OUT/log.txt" 2>&1
status=$?
tail -n 40 "$OUT/log.txt"
uptime >> "$OUT/versions.txt"
exit $status
