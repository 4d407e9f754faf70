#!/usr/bin/env bash
# Round 22, second call on the lent GPU machine's host (CPU only: issue 36's multi-process rows after the
# JAX engine dispatches from the caller once a function has run, and the torch engine's trims):
#   1. scripts/bench/jax_inline_ab.py, 2 processes, 4 KiB and 64 KiB: the caller's dispatch against the
#      dispatch thread alternated in one process;
#   2. multidev.benchmarks.distributed_run on the jax, torch and mpi engines, 2 processes (each row's
#      engine call, its floor and the checked call beside it).
# Everything into $OUT/round22b.tgz.
#   OUT=/path/to/out bash scripts/gpu/round22b.sh
set -u
R=$(pwd)
W=$OUT/w22b; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES=
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null 2>&1
for s in 4096 65536; do
  (cd /tmp && SIZE=$s OMP_NUM_THREADS=4 timeout -k 5 90 python3 -m multidev.distributed.launch -n 2 --engine jax \
    $R/scripts/bench/jax_inline_ab.py >> $W/jax-inline-ab.txt 2>&1); echo "inline ab $s exit $?"
done
grep "jax engine" $W/jax-inline-ab.txt
(cd $W && OMP_NUM_THREADS=4 timeout -k 10 ${CAP2:-300} python3 -m multidev.benchmarks.distributed_run \
  --out $W/distributed --processes 2 --reps 10 --faults 0 --engines jax,torch,mpi > $W/distributed.txt 2>&1)
echo "distributed exit $?"
head -n 20 $W/distributed.md
tar czf $OUT/round22b.tgz -C $W . && rm -rf $W
