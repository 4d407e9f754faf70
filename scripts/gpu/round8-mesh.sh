#!/usr/bin/env bash
# Issue 34's rows on the quiet H200 host (no GPU used; the image's torch 2.11, JAX 0.11.2, Open MPI 4.1):
# the tests of point-to-point messages, subgroups and FSDP over a process mesh on these versions, then
# the distributed suite at 4 processes per engine (allreduce along a process-mesh axis against the
# engine's own subgroup call, with the whole-group rows beside it) and md.data_parallel over a process
# mesh against FSDP2 by hand at 4 and 2 processes. About 8 minutes; prints everything.
#   OUT=/path/to/out bash scripts/gpu/round8-mesh.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r8mesh}" && cd "${OUT:-$REPO/build/gpu-r8mesh}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
export MULTIDEV_JAX_CPU_DEVICES=1 TF_CPP_MIN_LOG_LEVEL=3
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; "$PY" -c "import torch, jax, mpi4py; print('torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"
  mpiexec --version | head -n 1
  echo "== tests"
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_mesh_distributed.py tests/test_sharded_processes.py
  for e in torch jax mpi; do
    b=$e; [ $e = mpi ] && b=numpy
    echo "== distributed suite, $e engine, 4 processes"
    if [ $e = mpi ]; then
      timeout 300 mpiexec --allow-run-as-root --oversubscribe -n 4 -x OMP_NUM_THREADS -x MULTIDEV_JAX_CPU_DEVICES \
        "$PY" -m multidev.benchmarks.runner --suite distributed --backend $b --reps 15 --no-progress \
        --json "$OUT/dist-$e.json" --markdown "$OUT/dist-$e.md" | tail -n 60
    else
      timeout 300 "$PY" -m multidev.distributed.launch -n 4 --engine $e -m multidev.benchmarks.runner --suite distributed \
        --backend $b --reps 15 --no-progress --json "$OUT/dist-$e.json" --markdown "$OUT/dist-$e.md" | tail -n 60
    fi
  done
  for n in 4 2; do
    echo "== data_parallel over a process mesh against FSDP2, $n processes"
    timeout 300 "$PY" -m multidev.distributed.launch -n $n --engine torch -m multidev.benchmarks.baselines.data_parallel_fsdp \
      --steps 40 --json "$OUT/fsdp-$n.json"
  done
  uptime
} 2>&1 | tee "$OUT/mesh.txt"
