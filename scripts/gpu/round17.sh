#!/usr/bin/env bash
# Issue 36's structure and model moves after round 17 (BaseBackend.move_all: JAX moves a structure's
# arrays in one device_put; a plain list, tuple or dict of tensors is mapped without the walk; to_host
# walks once), on a lent GPU (torch and JAX; no TF or MXNet in the image), every step under a time cap:
#   1. the models suite (md.to(model) resident and a real move, cpu:0 <-> gpu:0, against module.to and
#      jax.device_put(tree, device); the train steps) for each backend of BACKENDS (default jax,torch),
#      checkout OLD (default $REPO/.old) and this one alternated ROUNDS (default 2) times, a fresh process
#      each, into models-BACKEND-{old,new}-I.{txt,md,json} of $OUT/round17.tgz (one file: the lent machine
#      hands back a few files only);
#   2. the suite's checks of this change on cpu:0,gpu:0: structures, every dtype's move, to_numpy (CHECKS=0
#      skips them);
#   3. with PROBE_INNER="1 20" (round 18), scripts/gpu/tree_move_probe.py on gpu:0 with --inner 1, then 20
#      (ROUNDS_PROBE rounds, default 200), this checkout, into the same archive.
#   OUT=/path/to/out bash scripts/gpu/round17.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-round17}" && cd "${OUT:-$REPO/build/gpu-round17}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore COLUMNS=200
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
stamp "install multidev (editable, no dependencies) at $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; nvidia-smi -L; "$PY" -c "import numpy, torch, jax; print('numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__)"; } 2>&1 | tee "$OUT/versions.txt"
OLD=${OLD:-$REPO/.old}
[ -d "$OLD/multidev" ] || { stamp "no $OLD/multidev (carry .old, or set OLD)"; exit 1; }
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD") && S_NEW=$(bash scripts/bench/shadow_tree.sh "$REPO") || exit 1
W="$OUT/w" && rm -rf "$W" && mkdir -p "$W"
trap 'tar czf "$OUT/round17.tgz" -C "$W" . && rm -rf "$W"' EXIT
IFS=, read -r -a backends <<< "${BACKENDS:-jax,torch}"
stamp "1. the models suite, $OLD against this checkout"
for i in $(seq "${ROUNDS:-2}"); do
  for b in "${backends[@]}"; do
    for t in old new; do
      S=$S_OLD; [ $t = new ] && S=$S_NEW
      stamp "round $i, $b, $t"
      (cd "$W" && PYTHONPATH=$S timeout -k 5 "${CAP:-150}" "$PY" -m multidev.cli bench --backend "$b" --suite models \
        --device cpu:0,gpu:0 --no-progress --json "models-$b-$t-$i.json" --markdown "models-$b-$t-$i.md" \
        > "models-$b-$t-$i.txt" 2>&1); echo "exit $?"
      grep -E -A2 "^(met|MISSED|UNSTABLE) +md.to\(model\) move" "$W/models-$b-$t-$i.txt"
    done
  done
done
if [ "${CHECKS:-1}" = 1 ]; then
  stamp "2. the suite's structure, dtype-move and to_numpy checks on cpu:0,gpu:0"
  timeout -k 5 "${CAP2:-240}" "$PY" -m multidev.cli conformance --backend jax,torch --device cpu:0,gpu:0 -- -q \
    -k "move_keeps_every_dtype or structures_move or to_numpy_gives or start_to_numpy" > "$OUT/conformance.txt" 2>&1
  echo "exit $?"; tail -n 5 "$OUT/conformance.txt"
fi
for n in ${PROBE_INNER:-}; do
  stamp "3. the tree move probe on gpu:0, --inner $n"
  (cd "$W" && PYTHONPATH=$S_NEW timeout -k 5 "${CAP3:-120}" "$PY" "$REPO/scripts/gpu/tree_move_probe.py" --device gpu:0 \
    --rounds "${ROUNDS_PROBE:-200}" --inner "$n" > "tree-move-gpu-inner$n.txt" 2>&1); echo "exit $?"
  head -n 8 "$W/tree-move-gpu-inner$n.txt"
done
stamp "finished"
