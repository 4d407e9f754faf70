#!/usr/bin/env bash
# Issue 36's per-call rows before and after a change: scripts/bench/percall_ab.py (4-float
# dist.allreduce on the mpi engine, mpi4py beside it) run alternately ROUNDS times from two checkouts
# of this repository, OLD and NEW (every module of each from its own tree: scripts/bench/shadow_tree.sh;
# before round 14 the adapters and engines came from the installed checkout in both), at 1 and 2 ranks:
#   OLD=/path/to/old/checkout NEW=. ROUNDS=3 bash scripts/bench/percall_ab.sh
set -uo pipefail
PY=${PY:-python}
MPIEXEC=${MPIEXEC:-mpiexec}
flags=(--oversubscribe); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
NEW=$(cd "${NEW:-.}" && pwd)
OLD=$(cd "$OLD" && pwd)
declare -A SHADOW
for tree in "$OLD" "$NEW"; do SHADOW[$tree]=$(bash "$NEW/scripts/bench/shadow_tree.sh" "$tree") || exit 1; done
for n in 1 2; do
  for i in $(seq "${ROUNDS:-3}"); do
    for tree in "$OLD" "$NEW"; do
      echo "== $n rank(s), round $i, $(git -C "$tree" rev-parse --short HEAD 2>/dev/null)$(git -C "$tree" diff --quiet 2>/dev/null || echo +changes) ($tree)"
      (cd "$tree" && OMP_NUM_THREADS=1 PYTHONPATH="${SHADOW[$tree]}" "$MPIEXEC" "${flags[@]}" -n "$n" -x OMP_NUM_THREADS -x PYTHONPATH \
        "$PY" "$NEW/scripts/bench/percall_ab.py")
    done
  done
done
