#!/usr/bin/env bash
# Round 10 on the quiet H200 host (16 cores; no GPU used): issue 32/36's check and page-fault rows.
#   1. scripts/gpu/round6-check.sh: the consistency check's share of a 1 MiB allreduce per engine, and
#      md.data_parallel against DistributedDataParallel (dp.step's record now goes ahead of the forward
#      pass and settles before the first bucket: no exchange of its own);
#   2. the same check-cost bench on MPI (2 ranks) with multidev.hostpool off (MULTIDEV_HOST_POOL_MB=0):
#      the out-of-place allreduce's page faults, A/B in the same lease;
#   3. single-process NumPy collectives over 8 virtual CPU devices up to 16 MiB, the pool on and off.
# About 7 minutes. Writes into $OUT: log.txt, check-summary.md, details.tar.gz.
#   OUT=/path/to/out bash scripts/gpu/round10-host.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r10}" && cd "${OUT:-$REPO/build/gpu-r10}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS=ignore TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
export COLUMNS=200
W=$(mktemp -d)
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
cd "$REPO"
stamp "check cost and DDP (scripts/gpu/round6-check.sh) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
OUT="$W/check" bash scripts/gpu/round6-check.sh; echo "round6-check exit $?"
cat "$W/check/log.txt"; cp "$W/check/summary.md" "$OUT/check-summary.md" 2>/dev/null
stamp "MPI check cost with the host pool off"
MULTIDEV_HOST_POOL_MB=0 timeout 240 mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS \
  -x MULTIDEV_HOST_POOL_MB "$PY" -m multidev.benchmarks.distributed_check_cost --blocks 60 --json "$W/check-mpi2-nopool.json"
for pool in 256 0; do
  stamp "NumPy collectives on 8 virtual CPU devices, MULTIDEV_HOST_POOL_MB=$pool"
  MULTIDEV_HOST_POOL_MB=$pool timeout -k 10 150 "$PY" -m multidev.cli bench --no-progress --max-time 135 \
    --backend numpy --suite collectives --cpu-devices 8 --max-bytes 16MiB --reps 7 --budget 0.25 \
    --json "$W/collectives-pool$pool.json" > "$W/collectives-pool$pool.txt" 2>&1
  echo "exit $?"; grep -E "^(met|MISSED|INVALID|UNSTABLE)" "$W/collectives-pool$pool.txt" | grep -i "allreduce" | head -40
done
uptime
tar -czf "$OUT/details.tar.gz" -C "$W" . && stamp "done"
