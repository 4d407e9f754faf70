#!/usr/bin/env bash
# Round 21 on a lent GPU machine (issue 36's JAX model move after round 21's trims; multidev's own time
# per distributed call):
#   1. scripts/gpu/round17.sh with BACKENDS=jax ROUNDS=3 PROBE_INNER="20 1": the models suite, checkout
#      .old (round 20's 428dffd) and this one alternated three times, the suite's structure, dtype-move
#      and to_numpy checks on cpu:0,gpu:0, and scripts/gpu/tree_move_probe.py with 20 calls a sample and 1;
#   2. tests/test_adapter_jax.py on the GPU (device_of's direct read, the pinned and staged routes);
#   3. scripts/bench/percall_stub.py on the torch and mpi engines, checks off and on, one process on the
#      host: multidev's own Python per dist.allreduce with the primitive stubbed.
# Everything into $OUT/round21.tgz and $OUT/round17.tgz (the lent machine hands back a few files only).
#   OUT=/path/to/out bash scripts/gpu/round21.sh
set -u
R=$(pwd)
OUT=$OUT BACKENDS=jax ROUNDS=3 PROBE_INNER="20 1" ROUNDS_PROBE=${ROUNDS_PROBE:-150} CAP=${CAP:-110} \
  timeout -k 5 ${CAP1:-420} bash scripts/gpu/round17.sh
W=$OUT/w21; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout -k 5 ${CAP2:-120} python3 -m pytest -q -p no:cacheprovider tests/test_adapter_jax.py > $W/tests-jax.txt 2>&1
echo "tests exit $?"; tail -n 3 $W/tests-jax.txt
for e in torch mpi; do for c in 0 1; do
  CUDA_VISIBLE_DEVICES= CHECKS=$c OMP_NUM_THREADS=1 timeout -k 5 ${CAP3:-60} python3 -m multidev.distributed.launch -n 1 \
    --engine $e scripts/bench/percall_stub.py >> $W/percall-stub.txt 2>&1; echo "stub $e checks=$c exit $?"
done; done
cat $W/percall-stub.txt | grep engine
tar czf $OUT/round21.tgz -C $W . && rm -rf $W
