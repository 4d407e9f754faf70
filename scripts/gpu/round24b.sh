#!/usr/bin/env bash
# Round 24, second call on a lent GPU machine (issue 36's JAX model move, after the review's fix):
# scripts/gpu/round17.sh with BACKENDS=jax ROUNDS=3 CHECKS=0 PROBE_INNER=1 (the models suite, checkout OLD,
# default .old, and this one alternated three times; the tree probe on gpu:0, this checkout) into
# $OUT/round17.tgz, then scripts/gpu/tree_move_gap.py twice per checkout, alternated, into $OUT/gap.txt.
#   OUT=/path/to/out bash scripts/gpu/round24b.sh
set -u
R=$(pwd)
OLD=${OLD:-$R/.old}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=$OUT OLD=$OLD BACKENDS=jax ROUNDS=${ROUNDS:-3} CHECKS=0 PROBE_INNER=1 ROUNDS_PROBE=300 CAP=110 \
  timeout -k 5 ${CAP1:-380} bash scripts/gpu/round17.sh
OUT=$OUT OLD=$OLD bash scripts/gpu/gap_ab.sh
