#!/usr/bin/env bash
# Issue 32's across-process and several-device CPU benchmarks on a quiet machine (the lent H200's
# host: 16 cores, nothing else running; the shared 2-core VM is too loaded to separate a 5%
# overhead from its noise): md.data_parallel against DistributedDataParallel (2 gloo processes),
# against a Horovod-style mpi4py loop (2 MPI ranks) and against JAX's own jit + NamedSharding over
# 4 XLA host devices. Each twice. CPU tensors only; 4 threads per process.
#   OUT=/path/to/out bash scripts/gpu/round5-dp-cpu.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r5cpu}" && cd "${OUT:-$REPO/build/gpu-r5cpu}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 PYTHONWARNINGS=ignore TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; "$PY" -c "import torch, jax, mpi4py; print('torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"; } > "$OUT/versions.txt" 2>&1
status=0
for i in 1 2; do
  timeout 240 "$PY" -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.baselines.data_parallel_ddp \
    --steps 60 --json "$OUT/ddp-$i.json" > "$OUT/ddp-$i.txt" 2>&1 || status=1
  tail -n 12 "$OUT/ddp-$i.txt"
  timeout 240 mpiexec --allow-run-as-root --oversubscribe -n 2 -x OMP_NUM_THREADS "$PY" -m multidev.benchmarks.baselines.data_parallel_mpi \
    --steps 60 --json "$OUT/mpi-$i.json" > "$OUT/mpi-$i.txt" 2>&1 || status=1
  tail -n 8 "$OUT/mpi-$i.txt"
  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu timeout 240 "$PY" -m multidev.benchmarks.baselines.data_parallel_jax \
    --devices 4 --steps 60 --json "$OUT/jax-$i.json" > "$OUT/jax-$i.txt" 2>&1 || status=1
  tail -n 8 "$OUT/jax-$i.txt"
done
uptime >> "$OUT/versions.txt"
exit $status
