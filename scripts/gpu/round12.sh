#!/usr/bin/env bash
# Issue 36's rows after this round's later changes, on a lent H200's quiet host (16 cores), one call
# of about 7 minutes, every step under a time cap:
#   1. NumPy allreduce on 2, 4, 8 virtual devices, 1-64 MiB, on multidev's host threads, each variant
#      against the faster of a copy of the same bytes on one thread and on every core, timed in the
#      same rounds (scripts/bench/coll_rows.py; 256 KiB blocks);
#   2. `multidev.distributed`'s collectives against the engine's own call, checks off and on, 2
#      processes, the torch engine, 4 KiB-256 MiB (multidev.benchmarks.distributed_run; the bench
#      judges each row's stability itself);
#   3. the consistency check's cost (the records through shared memory, and through the engines' own
#      channels for comparison) and md.data_parallel against DDP (scripts/gpu/round6-check.sh).
# Writes into $OUT: log.txt, rows-numpy.md, distributed.{json,md}, check/.
#   OUT=/path/to/out bash scripts/gpu/round12.sh   (T1, T2, T3: each step's cap in seconds; BLOCKS, STEPS: step 3's)
NAME=round12
source "$(dirname "$0")/prelude.sh"
nproc; uptime
"$PY" -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"

stamp "1. NumPy allreduce rows (host threads; the bound: one thread's or every core's copy)"
timeout -k 5 ${T1:-100} "$PY" scripts/bench/coll_rows.py --backend numpy --counts 2,4,8 --sizes 1MiB,4MiB,16MiB,64MiB \
  --rounds 21 --markdown "$OUT/rows-numpy.md" > "$OUT/rows-numpy.txt" 2>&1; echo "exit $?"
grep -E "^\|" "$OUT/rows-numpy.txt" | cut -c1-240

stamp "2. distributed collectives against the engine's own call (2 processes, torch)"
OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 timeout -k 10 ${T2:-200} "$PY" -m multidev.benchmarks.distributed_run \
  --out "$OUT/distributed" --processes 2 --reps 10 --faults 0 --engines torch > "$OUT/distributed.txt" 2>&1
echo "exit $?"; tail -n 45 "$OUT/distributed.txt"

stamp "3. the check's cost and data_parallel against DDP (scripts/gpu/round6-check.sh)"
BLOCKS=${BLOCKS:-40} OUT="$OUT/check" timeout -k 10 ${T3:-260} bash scripts/gpu/round6-check.sh > /dev/null 2>&1; echo "exit $?"
cat "$OUT/check/summary.md" 2>/dev/null | head -60
stamp "finished"
