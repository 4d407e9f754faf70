#!/usr/bin/env bash
# scripts/gpu/tree_move_gap.py on gpu:0, checkout OLD against this one (run from the repository root),
# alternated twice, each into $OUT/gap.txt under a "## old|new, run I" line; then the headline rows.
#   OUT=/path/to/out OLD=/path/to/.old bash scripts/gpu/gap_ab.sh
set -u
R=$(pwd)
S_OLD=$(bash scripts/bench/shadow_tree.sh "$OLD"); S_NEW=$(bash scripts/bench/shadow_tree.sh .)
for i in 1 2; do for t in old new; do S=$S_OLD; [ $t = new ] && S=$S_NEW
  echo "## $t, run $i" >> "$OUT/gap.txt"
  (cd /tmp && PYTHONPATH=$S timeout -k 5 60 python3 "$R/scripts/gpu/tree_move_gap.py" --device gpu:0 >> "$OUT/gap.txt" 2>&1)
  echo "gap $t $i exit $?"
done; done
grep -E "^##|md.to|floor_to|tree, device" "$OUT/gap.txt"
