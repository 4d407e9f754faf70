#!/usr/bin/env bash
# md.data_parallel against DistributedDataParallel (2 gloo processes) and a Horovod-style mpi4py loop
# (2 MPI ranks) on the quiet lent host, three runs each; CPU tensors, one thread per process (the
# baselines set it).   OUT=/path/to/out bash scripts/gpu/round5-ddp.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r5ddp}" && cd "${OUT:-$REPO/build/gpu-r5ddp}" && pwd)
PY=${PY:-python3}
export PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES=
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
status=0
for i in $(seq 1 "${RUNS:-3}"); do
  timeout 240 "$PY" -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.baselines.data_parallel_ddp \
    --steps 80 --json "$OUT/ddp-$i.json" > "$OUT/ddp-$i.log" 2>&1 || status=1
  tail -n 7 "$OUT/ddp-$i.log"
  timeout 240 mpiexec --allow-run-as-root --oversubscribe -n 2 "$PY" -m multidev.benchmarks.baselines.data_parallel_mpi \
    --steps 80 --json "$OUT/mpi-$i.json" > "$OUT/mpi-$i.log" 2>&1 || status=1
  tail -n 5 "$OUT/mpi-$i.log"
done
exit $status
