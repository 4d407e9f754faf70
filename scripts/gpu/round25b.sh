#!/usr/bin/env bash
# Round 25's second call on a lent GPU machine, checkout OLD (default .old: the round's start) against this
# one, every step under a time cap, all into $OUT/round25b.tgz:
#   1. scripts/gpu/consecutive_move_probe.py on gpu:0 (the MLP's move, one and three moves a sample, md.to,
#      md.to without the staged upload, jax.device_put(tree)), this checkout;
#   2. multidev.benchmarks.distributed_run on the mpi and torch engines, 2 processes, the two checkouts
#      alternated ROUNDS (default 3) times;
#   3. scripts/gpu/round16.sh with ENGINES=mpi ROUNDS=2 (the consistency check's cost, the two checkouts
#      alternated), its archive beside;
#   4. scripts/bench/percall_real.py on the mpi and torch engines, the two checkouts alternated once.
#   STEPS (default 1,2,3,4) picks the steps.
#   OUT=/path/to/out bash scripts/gpu/round25b.sh
set -u
R=$(pwd)
OLD=${OLD:-$R/.old}
W=$OUT/w25b && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round25b.tgz" -C "$OUT" w25b && rm -rf "$W"' EXIT
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null 2>&1
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh .) || exit 1
STEPS=",${STEPS:-1,2,3,4},"
if [[ $STEPS == *,1,* ]]; then
echo "== 1. consecutive moves"
(cd "$W" && PYTHONPATH=$S_NEW timeout -k 5 150 python3 "$R/scripts/gpu/consecutive_move_probe.py" --device gpu:0 \
  --rounds "${PROBE_ROUNDS:-30}" > "$W/consecutive.txt" 2>&1); echo "exit $?"; cat "$W/consecutive.txt"
fi
if [[ $STEPS == *,2,* ]]; then
echo "== 2. the mpi and torch engines' 2-process rows, $OLD against this checkout"
for i in $(seq "${ROUNDS:-3}"); do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd "$W" && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=4 PYTHONPATH=$S timeout -k 10 120 python3 -m multidev.benchmarks.distributed_run \
    --out "$W/distributed-$t-$i" --processes 2 --reps 10 --faults 0 --engines mpi,torch > "$W/distributed-$t-$i.txt" 2>&1)
  echo "$t $i exit $?"; grep -E "^\| (mpi|torch)" "$W/distributed-$t-$i.md" | cut -d'|' -f2,4,7,11
done; done
fi
if [[ $STEPS == *,3,* ]]; then
echo "== 3. the check's cost"
CUDA_VISIBLE_DEVICES= OUT=$W OLD=$OLD ENGINES=mpi ROUNDS=2 CAP=45 timeout -k 5 150 bash scripts/gpu/round16.sh > /dev/null 2>&1
echo "exit $?"; tar xzf "$W/round16.tgz" -C "$W" w/dcc.txt 2>/dev/null && cat "$W/w/dcc.txt"
fi
if [[ $STEPS == *,4,* ]]; then
echo "== 4. percall_real.py"
for e in mpi torch; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo "## $e, $t" >> "$W/real.txt"
  (cd "$W" && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 60 python3 -m multidev.distributed.launch -n 2 \
    --engine $e "$R/scripts/bench/percall_real.py" --calls 1 20 --samples 200) 2>&1 | grep -E "sample|[Ee]rror" >> "$W/real.txt"
done; done
cat "$W/real.txt"
fi
