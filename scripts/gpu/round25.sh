#!/usr/bin/env bash
# Round 25 on a lent GPU machine's host (CPU only, issue 36's multi-process rows), checkout OLD (default
# .old: the round's start) against this one, every step under a time cap, all into $OUT/round25.tgz:
#   0. the host's CPUs (lscpu) and versions;
#   1. scripts/bench/percall_real.py on the mpi and torch engines, 2 processes, 4 KiB, 64 KiB and 1 MiB,
#      one call a sample and 20, the two checkouts alternated ROUNDS (default 2) times: where a real
#      call's time goes above the engine's own call (native, floor, the engine's wrapper, md, md checked);
#   2. scripts/bench/percall_stub.py on both engines, checks off and on, both checkouts;
#   3. where STEPS names 3, multidev.benchmarks.distributed_run on ENGINES3 (default mpi,torch), this checkout;
#   4. where STEPS names 4, the models suite for JAX on cpu:0,gpu:0 with --sample-time SAMPLE_MS (default 20: a
#      sample of many moves, whose alternating samples' ratio a noisy host spreads less), ROUNDS4 (default 3)
#      runs, this checkout (the round's start has no --sample-time).
#   OUT=/path/to/out bash scripts/gpu/round25.sh
NAME=round25
source "$(dirname "$0")/prelude.sh"
W="$OUT/w25" && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round25.tgz" -C "$OUT" w25 && rm -rf "$W"' EXIT
{ nproc; lscpu | grep -E "Model name|Socket|Core|Thread|NUMA|MHz"; uptime
  "$PY" -c "import numpy, torch, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'mpi4py', mpi4py.__version__)"
} > "$W/versions.txt" 2>&1
cat "$W/versions.txt"
OLD=${OLD:-$REPO/.old}
[ -d "$OLD/multidev" ] || { stamp "no $OLD/multidev (carry .old, or set OLD)"; exit 1; }
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
STEPS=",${STEPS:-1,2,3},"
if [[ $STEPS == *,1,* ]]; then
  stamp "1. percall_real.py, $OLD against this checkout"
  for i in $(seq "${ROUNDS:-2}"); do for e in mpi torch; do for t in old new; do
    S=$S_OLD; [ $t = new ] && S=$S_NEW
    echo "## $e, $t, run $i" | tee -a "$W/real.txt"
    (cd "$W" && OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 "${CAP1:-60}" "$PY" -m multidev.distributed.launch -n 2 \
      --engine $e "$REPO/scripts/bench/percall_real.py" --calls 1 20 --samples "${SAMPLES:-200}") 2>&1 \
      | grep -E "sample|[Ee]rror" | tee -a "$W/real.txt"
  done; done; done
fi
if [[ $STEPS == *,2,* ]]; then
  stamp "2. percall_stub.py"
  for e in mpi torch; do for c in 0 1; do for t in old new; do
    S=$S_OLD; [ $t = new ] && S=$S_NEW
    echo "## $e, checks $c, $t" | tee -a "$W/stub.txt"
    (cd "$W" && CHECKS=$c PYTHONPATH=$S timeout -k 5 60 "$PY" -m multidev.distributed.launch -n 1 --engine $e \
      "$REPO/scripts/bench/percall_stub.py") 2>&1 | tail -n 1 | tee -a "$W/stub.txt"
  done; done; done
fi
if [[ $STEPS == *,3,* ]]; then
  stamp "3. the engines against their own calls, 2 processes, this checkout"
  (cd "$W" && OMP_NUM_THREADS=4 timeout -k 10 "${CAP3:-200}" "$PY" -m multidev.benchmarks.distributed_run \
    --out "$W/distributed" --processes 2 --reps 10 --faults 0 --engines "${ENGINES3:-mpi,torch}" > "$W/distributed.txt" 2>&1)
  echo "exit $?"; head -n 20 "$W/distributed.md"
fi
if [[ $STEPS == *,4,* ]]; then
  for i in $(seq "${ROUNDS4:-3}"); do
    stamp "4. the models suite, JAX, --sample-time ${SAMPLE_MS:-20}, run $i"
    (cd "$W" && CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 "${CAP4:-150}" "$PY" -m multidev.cli bench \
      --backend jax --suite models --device cpu:0,gpu:0 --sample-time "${SAMPLE_MS:-20}" --no-progress \
      --json "models-jax-$i.json" --markdown "models-jax-$i.md" > "models-jax-$i.txt" 2>&1); echo "exit $?"
    grep -E -A2 "^(met|MISSED|UNSTABLE) +md.to\(model\) move" "$W/models-jax-$i.txt"
  done
fi
uptime
stamp "finished"
