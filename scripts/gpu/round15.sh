#!/usr/bin/env bash
# Issue 36's multi-process rows after round 15, on a lent GPU machine's quiet host (16 cores; CPU
# tensors only, CUDA_VISIBLE_DEVICES empty), every step under a time cap, all into $OUT/round15.tgz
# (the device tool brings back 8 files at most) beside log.txt:
#   1. the jax and mpi engines against their own calls and floors, 2 processes, the checked call
#      alternated with the unchecked one (multidev.benchmarks.distributed_run; JAX's floor: the global
#      array made from the local one every call);
#   2. checkout OLD (default $REPO/.old, e.g. round 14's cf0f0e2: `git archive cf0f0e2 | tar -x -C .old`)
#      against this one on the mpi engine, alternated ROUNDS times, each tree imported whole
#      (scripts/bench/shadow_tree.sh): scripts/bench/check_parts.py (in place, 4 floats and 1 MiB: each
#      step of the call, checks on and off, and MPI's floor alternated call by call), then
#      multidev.benchmarks.distributed_check_cost (the check's share in alternating blocks);
#   3. checkout OLDJ (default $REPO/.oldj) against this one on the jax engine, alternated ROUNDS times:
#      scripts/bench/jax_percall.py (a 4 KiB allreduce, in blocks and one by one).
# STEPS picks steps (default 1,2; 3 where asked), CAP1 caps step 1, CAP2 each run of steps 2 and 3
# (about 420 s in all by default):
#   OUT=/path/to/out bash scripts/gpu/round15.sh
NAME=round15
source "$(dirname "$0")/prelude.sh"
W="$OUT/w" && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round15.tgz" -C "$OUT" w && rm -rf "$W"' EXIT  # (also after a step's failure)
{ nproc; uptime; "$PY" -c "import numpy, jax, mpi4py; print('numpy', numpy.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; mpiexec --version | head -1; } > "$W/versions.txt" 2>&1
cat "$W/versions.txt"
export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4
STEPS=",${STEPS:-1,2},"
if [[ $STEPS == *,1,* ]]; then
  stamp "1. the jax and mpi engines against their own calls, 2 processes, the check alternated"
  timeout -k 10 "${CAP1:-170}" "$PY" -m multidev.benchmarks.distributed_run --out "$W/distributed" \
    --processes 2 --reps 10 --faults 0 --engines "${ENGINES:-jax,mpi}" > "$W/distributed.txt" 2>&1; echo "exit $?"
  head -n 30 "$W/distributed.md"
fi
OLD=${OLD:-$REPO/.old}
if [[ $STEPS != *,2,* ]]; then
  :
elif [ -d "$OLD/multidev" ]; then
  stamp "2. the mpi engine's call step by step and the check's cost: $OLD against this checkout, alternated"
  S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
  MPI=(mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS=1 -x PYTHONPATH)
  for i in $(seq "${ROUNDS:-2}"); do
    for t in old new; do
      S=$S_OLD; [ $t = new ] && S=$S_NEW
      for e in 4 262144; do
        echo "-- round $i, $t, check_parts ELEMS=$e" | tee -a "$W/parts.txt"
        (cd "$W" && PYTHONPATH=$S ELEMS=$e INPLACE=1 timeout -k 5 "${CAP2:-40}" "${MPI[@]}" -x ELEMS -x INPLACE "$PY" "$REPO/scripts/bench/check_parts.py") 2>&1 \
          | tee -a "$W/parts.txt"
      done
      echo "-- round $i, $t, distributed_check_cost" | tee -a "$W/ab-mpi.txt"
      (cd "$W" && PYTHONPATH=$S timeout -k 5 "${CAP2:-40}" "${MPI[@]}" "$PY" -m multidev.benchmarks.distributed_check_cost \
        --blocks "${ABBLOCKS:-30}" --json "$W/ab-mpi-$t-$i.json") 2>&1 | tee -a "$W/ab-mpi.txt"
    done
  done
else
  stamp "2. skipped: no $OLD/multidev (carry .old, or set OLD)"
fi
OLDJ=${OLDJ:-$REPO/.oldj}
if [[ $STEPS == *,3,* && -d "$OLDJ/multidev" ]]; then
  stamp "3. the jax engine's per-call time: $OLDJ against this checkout, alternated"
  S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLDJ") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
  for i in $(seq "${ROUNDS:-2}"); do
    for t in old new; do
      S=$S_OLD; [ $t = new ] && S=$S_NEW
      echo "-- round $i, $t" | tee -a "$W/ab-jax.txt"
      (cd "$W" && OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 "${CAP2:-40}" "$PY" -m multidev.distributed.launch -n 2 \
        --engine jax "$REPO/scripts/bench/jax_percall.py") 2>&1 | grep median | tee -a "$W/ab-jax.txt"
    done
  done
elif [[ $STEPS == *,3,* ]]; then
  stamp "3. skipped: no $OLDJ/multidev (carry .oldj, or set OLDJ)"
fi
uptime
stamp "finished"
