#!/usr/bin/env bash
# Round 24 on a lent GPU machine, one call (issue 36), checkout OLD (default .old: the round's start)
# against this one, every step under a time cap:
#   1. scripts/gpu/round17.sh with BACKENDS=jax (the models suite, JAX's LeNet cpu:0 <-> gpu:0 against
#      jax.device_put(tree, device), the two checkouts alternated ROUNDS times, default 2; the suite's
#      structure, dtype-move and to_numpy checks on cpu:0,gpu:0) into $OUT/round17.tgz;
#   2. scripts/gpu/tree_move_gap.py on gpu:0, the two checkouts alternated twice: where md.to's time goes
#      against the tree put, split at the transfer's start, into $OUT/gap.txt;
#   3. scripts/gpu/round16.sh with ENGINES=mpi,torch (the consistency check's cost on the host, the two
#      checkouts alternated twice) into $OUT/round16.tgz;
#   4. scripts/gpu/round22b.sh (the three engines' 2-process rows, this checkout) into $OUT/round22b.tgz.
#   OUT=/path/to/out bash scripts/gpu/round24.sh
set -u
R=$(pwd)
OLD=${OLD:-$R/.old}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=$OUT OLD=$OLD BACKENDS=jax ROUNDS=${ROUNDS:-2} PROBE_INNER="" CAP=${CAP:-110} timeout -k 5 ${CAP1:-240} \
  bash scripts/gpu/round17.sh
OUT=$OUT OLD=$OLD bash scripts/gpu/gap_ab.sh
OUT=$OUT OLD=$OLD ENGINES=mpi,torch ROUNDS=2 CAP=45 timeout -k 5 ${CAP3:-150} bash scripts/gpu/round16.sh
OUT=$OUT CAP2=150 timeout -k 5 170 bash scripts/gpu/round22b.sh
