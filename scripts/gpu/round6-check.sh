#!/usr/bin/env bash
# Issue 36's "the consistency check's cost" (and issue 32's last row) on a quiet machine (16 cores,
# nothing else running; no GPU needed): per engine, the check's share of a 1 MiB float32 allreduce
# (checks on against off, the exchange alone, the engine's own primitive; medians of alternating
# blocks, multidev.benchmarks.distributed_check_cost) on torch/gloo (2 processes), MPI (2 and 3) and
# JAX (2); then md.data_parallel against DistributedDataParallel with the default checks
# (multidev.benchmarks.baselines.data_parallel_ddp). About 3 minutes; 7 files under $OUT.
#   OUT=/path/to/out bash scripts/gpu/round6-check.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r6check}" && cd "${OUT:-$REPO/build/gpu-r6check}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS=ignore TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
LOG="$OUT/log.txt"
{ nproc; uptime; git rev-parse HEAD 2>/dev/null
  "$PY" -c "import torch, jax, mpi4py; print('torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"
  mpiexec --version | head -n 1; } > "$LOG" 2>&1
status=0
BENCH=(-m multidev.benchmarks.distributed_check_cost --blocks "${BLOCKS:-60}")
run() {  # name, command...
  local name=$1; shift
  echo "== $name" >> "$LOG"
  timeout 240 "$@" --json "$OUT/$name.json" >> "$LOG" 2>&1 || { status=1; echo "FAILED: $name" >> "$LOG"; }
}
run check-torch "$PY" -m multidev.distributed.launch -n 2 --engine torch "${BENCH[@]}"
run check-mpi2 mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS "$PY" "${BENCH[@]}"
run check-mpi3 mpiexec --allow-run-as-root --oversubscribe -n 3 -x OMP_NUM_THREADS "$PY" "${BENCH[@]}"
run check-jax "$PY" -m multidev.distributed.launch -n 2 --engine jax "${BENCH[@]}"
# the engines' own channels, for comparison (the ranks above share a host: the records went through shared memory)
MULTIDEV_SHARED_EXCHANGE=0 run check-torch-store "$PY" -m multidev.distributed.launch -n 2 --engine torch "${BENCH[@]}"
MULTIDEV_SHARED_EXCHANGE=0 run check-mpi2-messages mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS \
  -x MULTIDEV_SHARED_EXCHANGE "$PY" "${BENCH[@]}"
run ddp "$PY" -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.baselines.data_parallel_ddp \
  --steps "${STEPS:-80}"
uptime >> "$LOG"
"$PY" - "$OUT" > "$OUT/summary.md" <<'PYEOF' || status=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("# The consistency check's cost (round 6, scripts/gpu/round6-check.sh)\n")
print("Medians of alternating blocks, rank 0's clock; share = (checks on - checks off) / checks off.\n")
print("| engine | procs | records through | size | engine primitive us | exchange alone us | checks off us | checks on us | check share | exchange / off |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name in ("check-torch", "check-mpi2", "check-mpi3", "check-jax", "check-torch-store", "check-mpi2-messages"):
    f = out / f"{name}.json"
    if not f.exists():
        print(f"| {name} | - | - | - | missing (see log.txt) | | | | | |")
        continue
    d = json.loads(f.read_text())
    for size, r in d["sizes"].items():
        print(f"| {d['engine']} | {d['world_size']} | {d.get('channel', 'engine')} | {size} | {r['engine primitive']:.1f} | {r['exchange alone']:.1f} | "
              f"{r['allreduce, checks off']:.1f} | {r['allreduce, checks on']:.1f} | {r['check share']:+.1%} | "
              f"{r['exchange share']:.1%} |")
f = out / "ddp.json"
print("\n## md.data_parallel against DistributedDataParallel (2 gloo processes, default checks = one exchange a step)\n")
if f.exists():
    print("| model | variant | md ms | DDP ms | ratio | parameters equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in json.loads(f.read_text())["rows"]:
        print(f"| {r['model']} | {r['variant']} | {r['median_ms']:.2f} | {r['ddp_median_ms']:.2f} | {r['ratio']:.3f} | "
              f"{r['params_equal']} |")
else:
    print("missing (see log.txt)")
PYEOF
cat "$OUT/summary.md"
exit $status
