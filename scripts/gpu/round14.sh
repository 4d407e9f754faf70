#!/usr/bin/env bash
# Issue 36's multi-process rows after round 14, on a lent GPU machine's quiet host (16 cores; CPU
# tensors only, CUDA_VISIBLE_DEVICES empty), every step under a time cap, all into $OUT/round14.tgz
# (the device tool brings back 8 files at most) beside log.txt:
#   1. every engine (torch, jax, mpi) against its own call, 2 processes, the checked call alternated
#      with the unchecked one (multidev.benchmarks.distributed_run: the check's cost per call per size);
#   2. the check's cost in alternating blocks and md.data_parallel against DDP (scripts/gpu/round6-check.sh);
#   3. the torch engine's check cost from checkout OLD (default $REPO/.old, e.g. round 12's 5506b23, made by
#      `git archive 5506b23 | tar -x -C .old`) and this one, alternated ROUNDS times
#      (multidev.benchmarks.distributed_check_cost; each tree imported whole: scripts/bench/shadow_tree.sh).
# Each step under a cap (CAP1, CAP2, CAP3 a run of step 3; at most about 510 s by default, inside the
# device tool's 600 s); STEPS picks steps (default 1,2,3), ENGINES step 1's engines (default torch,jax,mpi):
#   OUT=/path/to/out bash scripts/gpu/round14.sh
NAME=round14
source "$(dirname "$0")/prelude.sh"
W="$OUT/w" && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round14.tgz" -C "$OUT" w && rm -rf "$W"' EXIT  # (also after a step's failure)
{ nproc; uptime; "$PY" -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; mpiexec --version | head -1; } > "$W/versions.txt" 2>&1
cat "$W/versions.txt"
export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4
STEPS=",${STEPS:-1,2,3},"
if [[ $STEPS == *,1,* ]]; then
  stamp "1. every engine (${ENGINES:-torch,jax,mpi}) against its own call, 2 processes, the check alternated"
  timeout -k 10 "${CAP1:-200}" "$PY" -m multidev.benchmarks.distributed_run --out "$W/distributed" \
    --processes 2 --reps 10 --faults 0 --engines "${ENGINES:-torch,jax,mpi}" > "$W/distributed.txt" 2>&1; echo "exit $?"
  head -n 30 "$W/distributed.md"
fi
if [[ $STEPS == *,2,* ]]; then
  stamp "2. the check's cost in alternating blocks; data_parallel against DDP"
  BLOCKS=${BLOCKS:-40} OUT="$W/check" timeout -k 10 "${CAP2:-180}" bash scripts/gpu/round6-check.sh > /dev/null 2>&1; echo "exit $?"
  cat "$W/check/summary.md" 2>/dev/null | head -30
fi
OLD=${OLD:-$REPO/.old}
if [[ $STEPS != *,3,* ]]; then
  :
elif [ -d "$OLD/multidev" ]; then
  stamp "3. the torch engine's check cost: $OLD against this checkout, alternated"
  S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
  for i in $(seq "${ROUNDS:-2}"); do
    for t in old new; do
      S=$S_OLD; [ $t = new ] && S=$S_NEW
      echo "-- round $i, $t" | tee -a "$W/ab-torch.txt"
      (cd "$W" && OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 "${CAP3:-30}" "$PY" -m multidev.distributed.launch -n 2 --engine torch \
        -m multidev.benchmarks.distributed_check_cost --blocks "${ABBLOCKS:-30}" --json "$W/ab-torch-$t-$i.json") 2>&1 \
        | tee -a "$W/ab-torch.txt"
    done
  done
else
  stamp "3. skipped: no $OLD/multidev (carry .old, or set OLD)"
fi
uptime
stamp "finished"
