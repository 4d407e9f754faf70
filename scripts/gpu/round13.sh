#!/usr/bin/env bash
# Issue 36's multi-process rows after round 13's per-call trims, on a lent GPU machine's quiet host
# (16 cores; CPU tensors only, CUDA_VISIBLE_DEVICES empty), every step under a time cap:
#   PART=1: the mpi engine: `multidev.distributed`'s allreduce against mpi4py's Allreduce and against
#           the floor (Iallreduce + a Test loop: the least a call that can give up on a lost peer does),
#           2 and 4 processes, 4 KiB-256 MiB, checks off and on (multidev.benchmarks.distributed_run);
#           the check's cost step by step (scripts/bench/check_parts.py, 4 floats and 1 MiB); out of
#           place against mpi4py's calls (scripts/gpu/mpi_buffers_probe.py).
#   PART=2: the torch and jax engines against their own calls, 2 processes (distributed_run; ENGINES picks).
#   PART=3: MPI at 16 and 256 MiB with the engine's wait that never sleeps against the sleeping one
#           (scripts/gpu/mpi_big_probe.py; the old wait restored by sed in this copy, then put back),
#           then the MPI bench of PART=1 again at 2 processes.
# Writes into $OUT: log.txt, versions.txt, and each step's files.
#   PART=1 OUT=/path/to/out bash scripts/gpu/round13.sh   (CAP: the bench's cap in seconds; PROCS: its process counts)
NAME=round13
source "$(dirname "$0")/prelude.sh"
{ nproc; uptime; "$PY" -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; mpiexec --version | head -1; } > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4
if [ "${PART:-1}" = 1 ]; then
  stamp "1. the mpi engine against mpi4py and the floor, 2 and 4 processes"
  timeout -k 10 "${CAP:-360}" "$PY" -m multidev.benchmarks.distributed_run --out "$OUT/distributed-mpi" \
    --processes "${PROCS:-2,4}" --reps 10 --faults 0 --engines mpi > "$OUT/distributed-mpi.txt" 2>&1; echo "exit $?"
  head -n 30 "$OUT/distributed-mpi.md"
  stamp "2. the check's cost step by step (2 processes)"
  for e in 4 262144; do
    ELEMS=$e OMP_NUM_THREADS=1 timeout -k 5 60 mpiexec --allow-run-as-root --oversubscribe -n 2 -x ELEMS -x OMP_NUM_THREADS \
      "$PY" scripts/bench/check_parts.py 2>&1 | tee -a "$OUT/check-parts.txt"
  done
  stamp "3. out of place against mpi4py (2 processes)"
  OMP_NUM_THREADS=1 timeout -k 5 60 mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS \
    "$PY" scripts/gpu/mpi_buffers_probe.py 2>&1 | tee "$OUT/mpi-buffers.txt"
elif [ "${PART:-1}" = 3 ]; then
  stamp "5. 256 MiB on MPI: the engine's wait without sleeping (this tree) against the sleeping wait before it"
  for MB in 16 256; do MB=$MB timeout -k 5 120 mpiexec --allow-run-as-root --oversubscribe -n 2 -x MB -x OMP_NUM_THREADS \
    "$PY" scripts/gpu/mpi_big_probe.py 2>&1 | tee -a "$OUT/big-probe.txt"; done
  cp backends/engines/mpi.py "$OUT/.mpi.py.keep"
  sed -i 's/return poll_until(self.test, timeout, busy=timeout)/return poll_until(self.test, timeout)/' backends/engines/mpi.py
  echo "-- the sleeping wait (before):" | tee -a "$OUT/big-probe.txt"
  for MB in 16 256; do MB=$MB timeout -k 5 120 mpiexec --allow-run-as-root --oversubscribe -n 2 -x MB -x OMP_NUM_THREADS \
    "$PY" scripts/gpu/mpi_big_probe.py 2>&1 | tee -a "$OUT/big-probe.txt"; done
  cp "$OUT/.mpi.py.keep" backends/engines/mpi.py && rm "$OUT/.mpi.py.keep"
  stamp "6. the mpi engine against mpi4py and the floor again, 2 processes"
  timeout -k 10 "${CAP:-240}" "$PY" -m multidev.benchmarks.distributed_run --out "$OUT/distributed-mpi" \
    --processes 2 --reps 10 --faults 0 --engines mpi > "$OUT/distributed-mpi.txt" 2>&1; echo "exit $?"
  head -n 30 "$OUT/distributed-mpi.md"
else
  stamp "4. the torch and jax engines against their own calls, 2 processes"
  timeout -k 10 "${CAP:-420}" "$PY" -m multidev.benchmarks.distributed_run --out "$OUT/distributed-torch-jax" \
    --processes 2 --reps 10 --faults 0 --engines "${ENGINES:-torch,jax}" > "$OUT/distributed-torch-jax.txt" 2>&1; echo "exit $?"
  head -n 30 "$OUT/distributed-torch-jax.md"
fi
uptime
stamp "finished"
