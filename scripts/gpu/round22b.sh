#!/usr/bin/env bash
# Round 22, second part on the lent GPU machine's host (CPU only: issue 36's multi-process rows after the
# torch engine's trims): multidev.benchmarks.distributed_run on the jax, torch and mpi engines, 2
# processes (each row's engine call, its floor and the checked call beside it).
# Everything into $OUT/round22b.tgz.
#   OUT=/path/to/out bash scripts/gpu/round22b.sh
set -u
R=$(pwd)
W=$OUT/w22b; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES=
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null 2>&1
(cd $W && OMP_NUM_THREADS=4 timeout -k 10 ${CAP2:-300} python3 -m multidev.benchmarks.distributed_run \
  --out $W/distributed --processes 2 --reps 10 --faults 0 --engines jax,torch,mpi > $W/distributed.txt 2>&1)
echo "distributed exit $?"
head -n 20 $W/distributed.md
tar czf $OUT/round22b.tgz -C $W . && rm -rf $W
