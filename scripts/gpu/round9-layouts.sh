#!/usr/bin/env bash
# Issue 34's layouts across processes and JAX's sharded training across processes on the quiet H200 host
# (no GPU used; the image's torch 2.11, JAX 0.11.2, Open MPI 4.1): the tests on these versions, then the
# distributed suite at 4 processes per engine (dist layout place/gather against torch's distribute_tensor and
# full_tensor and JAX's make_array_from_callback and jitted replication; the along and allreduce rows beside
# them), each engine's run capped at CAP_SUITE (300) s, the tests at CAP_TESTS (400). About 12 minutes; prints everything.
#   OUT=/path/to/out bash scripts/gpu/round9-layouts.sh
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-r9layouts}" && cd "${OUT:-$REPO/build/gpu-r9layouts}" && pwd)
PY=${PY:-python3}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS=ignore CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu
export MULTIDEV_JAX_CPU_DEVICES=1 TF_CPP_MIN_LOG_LEVEL=3
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$REPO"
{ nproc; uptime; "$PY" -c "import torch, jax, mpi4py; print('torch', torch.__version__, 'jax', jax.__version__, 'mpi4py', mpi4py.__version__)"
  mpiexec --version | head -n 1
  echo "== tests"
  timeout "${CAP_TESTS:-400}" "$PY" -m pytest -q -p no:cacheprovider tests/test_layouts_distributed.py tests/test_sharded_processes.py
  for e in torch jax mpi; do
    b=$e; [ $e = mpi ] && b=numpy
    echo "== distributed suite, $e engine, 4 processes"
    if [ $e = mpi ]; then
      timeout "${CAP_SUITE:-300}" mpiexec --allow-run-as-root --oversubscribe -n 4 -x OMP_NUM_THREADS -x MULTIDEV_JAX_CPU_DEVICES \
        "$PY" -m multidev.benchmarks.runner --suite distributed --backend $b --reps 15 --max-bytes 16MiB --max-time $(( ${CAP_SUITE:-300} - 25 )) --no-progress \
        --json "$OUT/dist-$e.json" --markdown "$OUT/dist-$e.md" | tail -n 80
    else
      timeout "${CAP_SUITE:-300}" "$PY" -m multidev.distributed.launch -n 4 --engine $e -m multidev.benchmarks.runner --suite distributed \
        --backend $b --reps 15 --max-bytes 16MiB --max-time $(( ${CAP_SUITE:-300} - 25 )) --no-progress --json "$OUT/dist-$e.json" --markdown "$OUT/dist-$e.md" \
        | tail -n 80
    fi
  done
  uptime
} 2>&1 | tee "$OUT/layouts.txt"
