#!/usr/bin/env bash
# Round 26's call on a lent GPU machine, checkout OLD (default .old: the round's start) against this one,
# every step under a time cap, all into $OUT/round26.tgz:
#   1. scripts/gpu/round16.sh with ENGINES=mpi ROUNDS=ROUNDS1 (default 3; the consistency check's cost, the two checkouts
#      alternated), its dcc.txt beside;
#   2. scripts/bench/check_parts.py on the mpi engine (this checkout): a 1 MiB call out of place and in
#      place, where the checked call's time goes;
#   3. scripts/bench/percall_real.py on the mpi and torch engines, the two checkouts alternated once;
#   4. multidev.benchmarks.distributed_run on the mpi engine, 2 processes, the two checkouts alternated once;
#   5. the models suite for JAX on cpu:0,gpu:0 (one move a sample, then --sample-time 20; MODELS_ST picks), this checkout;
#   6. scripts/gpu/staged_async_probe.py on gpu:0 (could the staged upload be asynchronous?), this checkout.
#   7. scripts/bench/percall_cold.py on the mpi and torch engines, checks off and on (this checkout; mpi's
#      with OLD's too): multidev's own time when the caches are cold, as after a real collective.
#   8. (round 27) scripts/bench/jax_inline_ab.py at 4 KiB, 64 KiB, 1 MiB, 16 MiB and jax_spin_ab.py at 4 KiB and
#      1 MiB (this checkout), then the jax
#      engine's 2-process bench rows, OLD against this checkout alternated once.
#   9. (round 27) scripts/gpu/staged_list_probe.py on gpu:0: the staged upload by size, threads against one list put.
#   STEPS (default 1,2,3,4,5,6,7) picks the steps.
#   OUT=/path/to/out bash scripts/gpu/round26.sh
set -u
R=$(pwd)
OLD=${OLD:-$R/.old}
W=$OUT/w26 && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round26.tgz" -C "$OUT" w26 && rm -rf "$W"' EXIT
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false COLUMNS=200
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null 2>&1
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh .) || exit 1
{ nproc; uptime; python3 -c "import numpy, torch, jax, mpi4py; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; } > "$W/versions.txt" 2>&1
STEPS=",${STEPS:-1,2,3,4,5,6,7},"
if [[ $STEPS == *,1,* ]]; then
echo "== 1. the check's cost"
CUDA_VISIBLE_DEVICES= OUT=$W OLD=$OLD ENGINES=mpi ROUNDS=${ROUNDS1:-3} CAP=45 timeout -k 5 200 bash scripts/gpu/round16.sh > /dev/null 2>&1
echo "exit $?"; tar xzf "$W/round16.tgz" -C "$W" w/dcc.txt 2>/dev/null && mv "$W/w/dcc.txt" "$W/dcc.txt" && cat "$W/dcc.txt"
fi
if [[ $STEPS == *,2,* ]]; then
echo "== 2. check_parts.py"
for ip in 0 1; do
  (cd "$W" && CUDA_VISIBLE_DEVICES= ELEMS=262144 INPLACE=$ip OMP_NUM_THREADS=1 PYTHONPATH=$S_NEW timeout -k 5 60 \
    mpiexec --allow-run-as-root --oversubscribe -n 2 -x ELEMS -x INPLACE -x OMP_NUM_THREADS -x PYTHONPATH \
    python3 "$R/scripts/bench/check_parts.py") 2>&1 | tee -a "$W/parts.txt"
done
fi
if [[ $STEPS == *,3,* ]]; then
echo "== 3. percall_real.py"
for e in mpi torch; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo "## $e, $t" >> "$W/real.txt"
  (cd "$W" && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 60 python3 -m multidev.distributed.launch -n 2 \
    --engine $e "$R/scripts/bench/percall_real.py" --calls 1 20 --samples 200) 2>&1 | grep -E "sample|[Ee]rror" >> "$W/real.txt"
done; done
cat "$W/real.txt"
fi
if [[ $STEPS == *,4,* ]]; then
echo "== 4. the mpi engine's 2-process rows, $OLD against this checkout"
for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd "$W" && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=4 PYTHONPATH=$S timeout -k 10 120 python3 -m multidev.benchmarks.distributed_run \
    --out "$W/distributed-$t" --processes 2 --reps 10 --faults 0 --engines mpi > "$W/distributed-$t.txt" 2>&1)
  echo "$t exit $?"; grep -E "^\| mpi" "$W/distributed-$t.md" | cut -d'|' -f2,4,7,8,9,10
done
fi
if [[ $STEPS == *,5,* ]]; then
echo "== 5. the models suite, JAX"
for st in ${MODELS_ST:-0 20}; do
  extra=(); [ "$st" != 0 ] && extra=(--sample-time "$st")
  (cd "$W" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S_NEW timeout -k 5 150 python3 -m multidev.cli bench --backend jax --suite models \
    --device cpu:0,gpu:0 "${extra[@]}" --no-progress --markdown "models-jax-st$st.md" > "models-jax-st$st.txt" 2>&1); echo "exit $?"
  grep -E -A3 "^(met|MISSED|UNSTABLE) +md.to\(model\) move" "$W/models-jax-st$st.txt"
  grep -E -A2 "to\(lenet\) move|to\(mlp.*move" "$W/models-jax-st$st.txt"
done
fi
if [[ $STEPS == *,6,* ]]; then
echo "== 6. staged_async_probe.py"
(cd "$W" && PYTHONPATH=$S_NEW timeout -k 5 150 python3 "$R/scripts/gpu/staged_async_probe.py" --device gpu:0 --rounds 20 \
  > "$W/staged_async.txt" 2>&1); echo "exit $?"; cat "$W/staged_async.txt"
fi
if [[ $STEPS == *,7,* ]]; then
echo "== 7. percall_cold.py"
for e in mpi torch; do for c in 0 1; do for t in new old; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  [ $e = torch ] && [ $t = old ] && continue
  echo "## $e, $t, CHECKS=$c" >> "$W/cold.txt"
  (cd "$W" && CUDA_VISIBLE_DEVICES= CHECKS=$c OMP_NUM_THREADS=1 PYTHONPATH=$S timeout -k 5 60 python3 -m multidev.distributed.launch \
    -n 1 --engine $e "$R/scripts/bench/percall_cold.py" --calls 1000) 2>&1 | grep -E "written|[Ee]rror" >> "$W/cold.txt"
done; done; done
cat "$W/cold.txt"
fi
if [[ $STEPS == *,8,* ]]; then
echo "== 8. the jax engine: the caller's dispatch"
for e in 1024 16384 262144 4194304; do
  (cd "$W" && CUDA_VISIBLE_DEVICES= ELEMS=$e PYTHONPATH=$S_NEW timeout -k 5 60 python3 -m multidev.distributed.launch -n 2 \
    --engine jax "$R/scripts/bench/jax_inline_ab.py") 2>&1 | grep -E "caller|[Ee]rror" >> "$W/jax-inline.txt"
done
for e in 1024 262144; do
  (cd "$W" && CUDA_VISIBLE_DEVICES= ELEMS=$e PYTHONPATH=$S_NEW timeout -k 5 60 python3 -m multidev.distributed.launch -n 2 \
    --engine jax "$R/scripts/bench/jax_spin_ab.py") 2>&1 | grep -E "spin/|[Ee]rror" >> "$W/jax-inline.txt"
done
cat "$W/jax-inline.txt"
for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  (cd "$W" && CUDA_VISIBLE_DEVICES= PYTHONPATH=$S timeout -k 10 100 python3 -m multidev.benchmarks.distributed_run \
    --out "$W/distributed-jax-$t" --processes 2 --reps 10 --faults 0 --engines jax > "$W/distributed-jax-$t.txt" 2>&1)
  echo "$t exit $?"; grep -E "^\| jax" "$W/distributed-jax-$t.md" | cut -d'|' -f2,4,5,6,7,10
done
fi
if [[ $STEPS == *,9,* ]]; then
echo "== 9. staged_list_probe.py"
(cd "$W" && PYTHONPATH=$S_NEW timeout -k 5 200 python3 "$R/scripts/gpu/staged_list_probe.py" --device gpu:0 --rounds 8 \
  > "$W/staged_list.txt" 2>&1); echo "exit $?"; cat "$W/staged_list.txt"
fi
