#!/usr/bin/env bash
# Issue 36's consistency-check row after round 16, on a lent GPU machine's quiet host (CPU tensors only),
# every step under a time cap, all into $OUT/round16.tgz beside log.txt:
#   1. multidev.benchmarks.distributed_check_cost in ABBLOCKS alternating blocks (default: 300 on mpi, 100
#      on torch, 40 on jax, whose 4-float call takes over 1 ms on a host: 300 ran past a call's cap), checkout
#      OLD (default $REPO/.old) against this one, alternated ROUNDS (default 2) times, on each engine of
#      ENGINES (default torch,jax,mpi), 2 processes under the engine's own launcher;
#   2. where STEPS names it, multidev.benchmarks.distributed_run on ENGINES2 (default torch,jax), 2 processes.
#   OUT=/path/to/out bash scripts/gpu/round16.sh
NAME=round16
source "$(dirname "$0")/prelude.sh"
W="$OUT/w" && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round16.tgz" -C "$OUT" w && rm -rf "$W"' EXIT
{ nproc; uptime; "$PY" -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; } > "$W/versions.txt" 2>&1
cat "$W/versions.txt"
STEPS=",${STEPS:-1},"
OLD=${OLD:-$REPO/.old}
if [[ $STEPS == *,1,* ]]; then
  [ -d "$OLD/multidev" ] || { stamp "1. no $OLD/multidev (carry .old, or set OLD)"; exit 1; }
  stamp "1. the check's cost in alternating blocks, $OLD against this checkout"
  S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
  IFS=, read -r -a engines <<< "${ENGINES:-torch,jax,mpi}"
  for i in $(seq "${ROUNDS:-2}"); do
    for e in "${engines[@]}"; do
      for t in old new; do
        S=$S_OLD; [ $t = new ] && S=$S_NEW
        case $e in mpi) blocks=300 ;; torch) blocks=100 ;; *) blocks=40 ;; esac
        args=(-m multidev.benchmarks.distributed_check_cost --blocks "${ABBLOCKS:-$blocks}" --json "$W/dcc-$e-$t-$i.json")
        case $e in
          torch) launch=("$PY" -m torch.distributed.run --nproc_per_node=2 "${args[@]}") ;;
          jax) launch=("$PY" -m multidev.distributed.launch -n 2 --engine jax "${args[@]}") ;;
          mpi) launch=(mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS -x PYTHONPATH "$PY" "${args[@]}") ;;
        esac
        echo "-- round $i, $e, $t" | tee -a "$W/dcc.txt"
        (cd "$W" && OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 "${CAP:-60}" "${launch[@]}") 2>&1 | grep -E "check share|engine \(|[Ee]rror" | tee -a "$W/dcc.txt"
      done
    done
  done
fi
if [[ $STEPS == *,2,* ]]; then
  stamp "2. the engines against their own calls, 2 processes"
  OMP_NUM_THREADS=4 timeout -k 10 "${CAP2:-240}" "$PY" -m multidev.benchmarks.distributed_run --out "$W/distributed" \
    --processes 2 --reps 10 --faults 0 --engines "${ENGINES2:-torch,jax}" > "$W/distributed.txt" 2>&1; echo "exit $?"
  head -n 30 "$W/distributed.md"
fi
uptime
stamp "finished"
