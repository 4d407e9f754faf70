#!/usr/bin/env bash
# Round 20 on a lent GPU machine (issue 36's one-process collectives and the torch floor row; the CUDA
# checks of rounds 19 and 20):
#   1. tests/test_adapter_torch.py on the GPU (the conj/neg views' device-to-host reads among them);
#   2. the suite's new check that collective results are freed when dropped, and the collectives,
#      transfer and wait checks, for torch, JAX and CuPy on cpu:0,gpu:0;
#   3. scripts/bench/coll_rows.py, NumPy on 2, 4, 8 virtual devices of the host, 1-64 MiB: checkout
#      .old (round 19) and this one alternated twice (the fresh-memory floor is this checkout's column);
#   4. multidev.benchmarks.distributed_run on torch, 2 processes on the host (the new floor row).
# Everything into $OUT/round20.tgz (the lent machine hands back a few files only).
#   OUT=/path/to/out bash scripts/gpu/round20.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
R=$(pwd); W=$OUT/w; mkdir -p $W; nvidia-smi -L > $W/versions.txt; nproc >> $W/versions.txt
python3 -c "import torch, jax, numpy; print(torch.__version__, jax.__version__, numpy.__version__)" >> $W/versions.txt
timeout -k 5 ${CAP1:-150} python3 -m pytest -q -p no:cacheprovider tests/test_adapter_torch.py > $W/tests-torch.txt 2>&1
echo "tests exit $?"; tail -n 3 $W/tests-torch.txt
timeout -k 5 ${CAP2:-200} python3 -m multidev.cli conformance --backend torch,jax,cupy --device cpu:0,gpu:0 -- -q \
  -k "freed_when_dropped or allreduce_matches or to_numpy or wait or transfer" > $W/conformance.txt 2>&1
echo "conformance exit $?"; grep -E "^  (torch|jax|cupy): ran|FAILED" $W/conformance.txt | head -12
S_OLD=$(bash scripts/bench/shadow_tree.sh .old); S_NEW=$(bash scripts/bench/shadow_tree.sh .)
for i in 1 2; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd $W && CUDA_VISIBLE_DEVICES= PYTHONPATH=$S timeout -k 5 ${CAP3:-100} python3 "$R/scripts/bench/coll_rows.py" \
    --backend numpy --counts 2,4,8 --sizes 1MiB,4MiB,16MiB,64MiB --rounds 21 --json rows-$t-$i.json \
    --markdown rows-$t-$i.md > rows-$t-$i.txt 2>&1); echo "rows $t $i exit $?"
done; done
(cd $W && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=4 timeout -k 10 ${CAP4:-200} python3 -m multidev.benchmarks.distributed_run \
  --out $W/distributed --processes 2 --reps 10 --faults 0 --engines torch > $W/distributed.txt 2>&1); echo "distributed exit $?"
head -n 12 $W/distributed.md
tar czf $OUT/round20.tgz -C $W . && rm -rf $W
