#!/usr/bin/env bash
# Round 22 on a lent GPU machine (issue 36: the JAX model move's and a distributed call's own Python after
# round 22's trims), checkout .old (round 21's) against this one:
#   1. scripts/gpu/round17.sh with BACKENDS=jax ROUNDS=2 PROBE_INNER="20 1": the models suite, the two
#      checkouts alternated, the suite's structure, dtype-move and to_numpy checks on cpu:0,gpu:0, and
#      scripts/gpu/tree_move_probe.py with 20 calls a sample and 1 (this checkout);
#   2. scripts/bench/tree_move_python.py --device gpu:0 (md.to's Python with device_put stubbed, against the
#      probe's floor walk), the two checkouts alternated twice;
#   3. scripts/bench/percall_stub.py on the torch and mpi engines, checks off, one process on the host, the
#      two checkouts alternated twice; checks on, this checkout;
#   4. this machine's torch: which primitives the torch engine starts without its warnings guard warn
#      (scripts/bench/torch_warnings.py), and tests/test_adapter_jax.py on the GPU.
# N (default 2) sets the alternations of steps 2-3, TESTS=0 skips the tests of step 4, B=1 runs
# scripts/gpu/round22b.sh after (the multi-process rows) in the same call.
# Everything into $OUT/round22.tgz and $OUT/round17.tgz (the lent machine hands back a few files only).
#   OUT=/path/to/out bash scripts/gpu/round22.sh
#   ROUNDS=1 N=1 TESTS=0 B=1 OUT=/path/to/out bash scripts/gpu/round22.sh   (all of it in one call)
set -u
R=$(pwd)
OUT=$OUT BACKENDS=jax ROUNDS=${ROUNDS:-2} PROBE_INNER="20 1" ROUNDS_PROBE=${ROUNDS_PROBE:-150} CAP=${CAP:-110} \
  timeout -k 5 ${CAP1:-330} bash scripts/gpu/round17.sh
W=$OUT/w22; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
S_OLD=$(bash scripts/bench/shadow_tree.sh .old); S_NEW=$(bash scripts/bench/shadow_tree.sh .)
for i in $(seq ${N:-2}); do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo "## $t, run $i" >> $W/tree-move-python.txt
  (cd /tmp && PYTHONPATH=$S timeout -k 5 60 python3 $R/scripts/bench/tree_move_python.py --device gpu:0 \
    >> $W/tree-move-python.txt 2>&1); echo "tree python $t $i exit $?"
done; done
grep -E "^##|md.to|floor_to" $W/tree-move-python.txt
for i in $(seq ${N:-2}); do for e in torch mpi; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo -n "$t run $i: " >> $W/percall-stub.txt
  (cd /tmp && CUDA_VISIBLE_DEVICES= CHECKS=0 OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 60 python3 -m \
    multidev.distributed.launch -n 1 --engine $e $R/scripts/bench/percall_stub.py >> $W/percall-stub.txt 2>&1)
  echo "stub $e $t $i exit $?"
done; done; done
for e in torch mpi; do echo -n "new, checks on: " >> $W/percall-stub.txt
  (cd /tmp && CUDA_VISIBLE_DEVICES= CHECKS=1 OMP_NUM_THREADS=1 PYTHONPATH=$S_NEW timeout -k 5 60 python3 -m \
    multidev.distributed.launch -n 1 --engine $e $R/scripts/bench/percall_stub.py >> $W/percall-stub.txt 2>&1)
done
cat $W/percall-stub.txt | grep engine
CUDA_VISIBLE_DEVICES= timeout -k 5 60 python3 scripts/bench/torch_warnings.py > $W/torch-warnings.txt 2>&1
echo "warnings exit $?"; cat $W/torch-warnings.txt
if [ "${TESTS:-1}" = 1 ]; then
  timeout -k 5 ${CAP2:-150} python3 -m pytest -q -p no:cacheprovider tests/test_adapter_jax.py > $W/tests-jax.txt 2>&1
  echo "tests exit $?"; tail -n 3 $W/tests-jax.txt
fi
tar czf $OUT/round22.tgz -C $W . && rm -rf $W
[ "${B:-0}" = 1 ] && OUT=$OUT bash scripts/gpu/round22b.sh
