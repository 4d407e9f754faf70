#!/usr/bin/env bash
# Issue 14 on the GPU machine (image python3: torch cu130, jax, cupy, numpy; no TF/MXNet): the
# adversarial suite with the GPUs among the devices (creation, views, convert, collectives, leak
# loops on torch/jax/numpy), the mismatched-rank scenarios over NCCL with CUDA tensors on 2 GPUs,
# and the torchrun exit check. Results under $OUT (summary.txt, one log per part). A few minutes.
#   pip install --no-deps --no-build-isolation -e . && OUT=/tmp/out bash benchmarks/gpu_adversarial.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/multidev-gpu-adversarial}
mkdir -p "$OUT"
export PYTHONWARNINGS=ignore XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
run() {  # run NAME ARGS...: one pytest selection, its log and its exit status in the summary
  local name=$1; shift
  timeout 540 python3 -m pytest -p no:cacheprovider -q -rs "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(tail -1 "$OUT/$name.txt")" >> "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
run ranks tests/adversarial/test_ranks.py -k "nccl or torch-2ranks or torchrun"
run adversarial tests/adversarial/test_adversarial.py -k "torch or jax or numpy"
# the cost of the cross-rank consistency checks on 2 GPUs (NCCL for CUDA tensors, gloo for the check)
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  timeout 300 python3 -m torch.distributed.run --nproc_per_node=2 --master_port=29533 \
    -m multidev.benchmarks.distributed_check_cost > "$OUT/check_cost.txt" 2>&1
  echo "check_cost rc=$?" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
