#!/usr/bin/env bash
# Issue 36's torch D2H row after round 18 (the blocking reads copy on the current stream), on a lent GPU:
#   1. scripts/gpu/d2h_torch_probe.py at 1-256 MiB (every route interleaved, 41 rounds);
#   2. the bandwidth suite for torch on cpu:0,gpu:0, checkout .old and this one alternated twice;
#   3. the suite's transfer and wait checks for torch and JAX on cpu:0,gpu:0.
# Everything into $OUT/round18b.tgz (the lent machine hands back a few files only).
#   OUT=/path/to/out bash scripts/gpu/round18b.sh
set -u
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
W=$OUT/w; mkdir -p $W; nvidia-smi -L > $W/versions.txt; python3 -c "import torch; print(torch.__version__)" >> $W/versions.txt
python3 scripts/gpu/d2h_torch_probe.py --rounds 41 --sizes-mib 1,4,16,64,256 > $W/d2h-probe.txt 2>&1; tail -n 45 $W/d2h-probe.txt | grep -E "md.to_numpy|prealloc, current|download|event \(|current stream \+ event"
S_OLD=$(bash scripts/bench/shadow_tree.sh .old); S_NEW=$(bash scripts/bench/shadow_tree.sh .)
for i in 1 2; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd $W && PYTHONPATH=$S timeout -k 5 95 python3 -m multidev.cli bench --backend torch --suite bandwidth --device cpu:0,gpu:0 --reps 8 --budget 0.15 --max-bytes 256MiB --no-progress --max-time 80 --markdown bw-$t-$i.md > bw-$t-$i.txt 2>&1); echo "bw $t $i exit $?"
  grep -E "D2H at pinned" $W/bw-$t-$i.txt | head -4
done; done
timeout -k 5 150 python3 -m multidev.cli conformance --backend torch,jax --device cpu:0,gpu:0 -- -q -k "to_numpy or wait or move or host or transfer" > $W/conformance.txt 2>&1; echo "conformance exit $?"; grep -E "^  (torch|jax): ran" $W/conformance.txt | head -4
tar czf $OUT/round18b.tgz -C $W . && rm -rf $W
