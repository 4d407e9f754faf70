#!/usr/bin/env bash
# Round 29's calls on a lent GPU machine, checkout OLD (default .old: the round's start) against this one,
# every step under a time cap, all into $OUT/round29.tgz:
#   1. scripts/gpu/put_ways_probe.py on gpu:0: where md.asarray's time goes onto a GPU (round 28's question);
#   2. the suite's asarray and data-parallel checks on cpu:0,gpu:0 for jax, torch and cupy;
#   3. scripts/bench/jax_layers.py at 4 KiB, 64 KiB and 1 MiB (2 processes, the host's CPUs), this checkout:
#      JAX's own call, the global array made per call (public function, constructor), from a thread, md;
#   4. the jax engine's 2-process bench rows, OLD and this checkout alternated ROUNDS4 times (default 2).
#   5. scripts/bench/jax_layers.py at 4 KiB, 64 KiB and 1 MiB, OLD and this checkout alternated ROUNDS5 times
#      (default 2): multidev's call itself, old against new, beside the same floors.
#   STEPS (default 1,2,3,4) picks the steps.
#   OUT=/path/to/out bash scripts/gpu/round29.sh
set -u
R=$(pwd)
OLD=${OLD:-$R/.old}
W=$OUT/w29 && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round29.tgz" -C "$OUT" w29 && rm -rf "$W"' EXIT
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false COLUMNS=200
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null 2>&1
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh .) || exit 1
{ nproc; uptime; nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; } > "$W/versions.txt" 2>&1
STEPS=",${STEPS:-1,2,3,4},"
if [[ $STEPS == *,1,* ]]; then
echo "== 1. put_ways_probe.py"
(cd "$W" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S_NEW timeout -k 5 150 python3 "$R/scripts/gpu/put_ways_probe.py" --device gpu:0 \
  --reps 21 > "$W/put_ways.txt" 2>&1); echo "exit $?"; grep -v "^W\|^I0\|^E0" "$W/put_ways.txt" | tail -40
fi
if [[ $STEPS == *,2,* ]]; then
echo "== 2. the suite's asarray and data-parallel checks on cpu:0,gpu:0"
(cd "$W" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S_NEW timeout -k 5 200 python3 -m multidev.cli conformance --backend jax,torch,cupy \
  --device cpu:0,gpu:0 -- -q -p no:cacheprovider -k "asarray_is_done or asarray_never_shares or data_parallel" > "$W/conformance.txt" 2>&1)
echo "exit $?"; grep -E ": ran|FAILED|passed|failed" "$W/conformance.txt" | tail -12
fi
if [[ $STEPS == *,3,* ]]; then
echo "== 3. jax_layers.py"
for e in 1024 16384 262144; do
  (cd "$W" && CUDA_VISIBLE_DEVICES= ELEMS=$e ROUNDS=${ROUNDS3:-10} PYTHONPATH=$S_NEW timeout -k 5 90 python3 -m multidev.distributed.launch \
    -n 2 --engine jax "$R/scripts/bench/jax_layers.py") 2>&1 | grep -E "^ |allreduce|[Ee]rror" >> "$W/jax-layers.txt"
done
cat "$W/jax-layers.txt"
fi
if [[ $STEPS == *,4,* ]]; then
echo "== 4. the jax engine's 2-process rows, $OLD against this checkout"
for r in $(seq 1 "${ROUNDS4:-2}"); do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd "$W" && CUDA_VISIBLE_DEVICES= PYTHONPATH=$S timeout -k 10 100 python3 -m multidev.benchmarks.distributed_run \
    --out "$W/distributed-jax-$t$r" --processes 2 --reps 10 --faults 0 --engines jax > "$W/distributed-jax-$t$r.txt" 2>&1)
  echo "$t$r exit $?"; grep -E "^\| jax" "$W/distributed-jax-$t$r.md" | cut -d'|' -f2,4,5,6,7,10
done; done
fi
if [[ $STEPS == *,5,* ]]; then
echo "== 5. jax_layers.py, $OLD against this checkout"
for r in $(seq 1 "${ROUNDS5:-2}"); do for e in 1024 16384 262144; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo "## $t$r" >> "$W/jax-layers-ab.txt"
  (cd "$W" && CUDA_VISIBLE_DEVICES= ELEMS=$e ROUNDS=${ROUNDS3:-10} PYTHONPATH=$S timeout -k 5 90 python3 -m multidev.distributed.launch \
    -n 2 --engine jax "$R/scripts/bench/jax_layers.py") 2>&1 | grep -E "^  (floor|md)|allreduce|[Ee]rror" >> "$W/jax-layers-ab.txt"
done; done; done
grep -v "plugin\|File \|cuda" "$W/jax-layers-ab.txt"
fi
