#!/usr/bin/env bash
# Issue 36's MPI row on the quiet H200 host (no GPU used): scripts/gpu/mpi_buffers_probe.py under
# mpiexec -n 2 and -n 3 (where the time of multidev's MPI allreduce goes: the nonblocking call and its
# polling, new buffers, copies), then the check-cost bench on MPI. About 2 minutes; prints everything.
#   OUT=/path/to/out bash scripts/gpu/round7-mpi.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r7mpi}" && cd "${OUT:-$REPO/build/gpu-r7mpi}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; mpiexec --version | head -n 1
  for n in 2 3; do
    echo "== mpi_buffers_probe -n $n"
    timeout 200 mpiexec --allow-run-as-root --oversubscribe -n $n -x OMP_NUM_THREADS "$PY" scripts/gpu/mpi_buffers_probe.py
  done
  echo "== check cost, mpi 2"
  timeout 200 mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS "$PY" -m multidev.benchmarks.distributed_check_cost --blocks 30
} 2>&1 | tee "$OUT/mpi.txt"
