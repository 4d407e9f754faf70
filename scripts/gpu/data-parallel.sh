#!/usr/bin/env bash
# issue 32's GPU rows for md.data_parallel: torch on one GPU (the wrapped step bitwise the plain
# loop's, and its step time against it: the goal is <= 1.03x), torch over every GPU of one process,
# JAX over every GPU (the sharded step against one GPU), and, with two or more GPUs, the 2-process
# comparison against DistributedDataParallel (benchmarks/baselines/data_parallel_ddp.py: gloo, CPU tensors). A few minutes.
#
#   OUT=/path/to/out bash scripts/gpu/data-parallel.sh
#
# Writes into $OUT: checks.json (every check and figure), ddp.txt/.json (2+ GPUs), versions.txt,
# log.txt. Exit status 0 when every check held. Installs multidev from this checkout (editable, no deps).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-dp}" && cd "${OUT:-$REPO/build/gpu-dp}" && pwd)
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
exec > >(tee -a "$OUT/log.txt") 2>&1
(cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
cd "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  for m in torch jax optax; do "$PY" -c "import $m; print('$m', $m.__version__)" 2>/dev/null || echo "$m missing"; done
} > versions.txt 2>&1
status=0
timeout 300 "$PY" "$REPO/scripts/gpu/data_parallel_check.py" > checks.txt 2>&1 || status=1
grep '^MDRESULT ' checks.txt | sed 's/^MDRESULT //' > checks.json
cat checks.json
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -ge 2 ]; then
  timeout 300 "$PY" -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.baselines.data_parallel_ddp \
    --steps 60 --json "$OUT/ddp.json" > ddp.txt 2>&1 || status=1
  tail -8 ddp.txt
fi
exit $status
