#!/usr/bin/env bash
# multidev.distributed's GPU paths on a lent H200 box (no internet; torch CUDA, JAX, CuPy, NCCL, mpi4py
# on an Open MPI that is not CUDA-aware), about 2 to 3 minutes:
#   1. what the MPI build says (ompi_info, and what the mpi engine detects: CUDA-aware or not);
#   2. the mpi engine, 2 processes (mpiexec): torch, CuPy and JAX GPU tensors through every collective.
#      On a non-CUDA-aware MPI they must be staged through host memory (transport_path "staged") and
#      never reach MPI as device pointers (which crashes the process);
#   3. the torch engine, 2 processes: NCCL with one GPU each where there are 2 GPUs, else gloo with the
#      CUDA tensors staged (NCCL refuses two ranks on one GPU);
#   4. the jax engine, 2 processes: NCCL with one GPU each where there are 2 GPUs, else transport="gloo"
#      (JAX's CPU collectives; the GPU arrays staged), both processes on GPU 0;
#   5. with 2 GPUs, the distributed bench suite on the torch engine (NCCL) against torch's all_reduce.
# Every worker checks values, the result's backend, device and dtype, in place and async forms, and
# writes $OUT/<step>-rank<R>.json; $OUT/summary.txt and $OUT/log.txt hold the outcome. Exit status 0
# when every check of every step passed.
#   OUT=/tmp/out bash scripts/gpu/distributed.sh
# Knobs: PY (python), CAP (seconds per step, default 90), SKIP_INSTALL=1 (multidev is installed already),
# DRY_RUN=1 (no GPU: the same checks on CPU devices, to try the script on any machine).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${OUT:-$REPO/build/gpu-distributed}" && cd "${OUT:-$REPO/build/gpu-distributed}" && pwd)
PY=${PY:-python3}
CAP=${CAP:-90}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TF_CPP_MIN_LOG_LEVEL=2 XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
exec > >(tee -a "$OUT/log.txt") 2>&1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  stamp "install multidev (editable, no dependencies)"
  (cd "$REPO" && "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 1
fi
cd "$REPO"
nvidia-smi -L || true
NG=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "GPUs: $NG"

stamp "1. the MPI build"
(ompi_info --parsable --all 2>/dev/null | grep -E "mpi_built_with_cuda_support|opal_cuda_support:value|ident" | head -5) || true
"$PY" - <<'EOF' 2>&1 | tee "$OUT/cuda-aware.txt"
import mpi4py
mpi4py.rc.initialize = False
import mpi4py.MPI as MPI
from multidev.adapters.engines.mpi import cuda_aware
print("mpi4py", mpi4py.__version__, "|", MPI.Get_library_version().splitlines()[0])
print("the mpi engine detects: CUDA-aware =", *cuda_aware(MPI))
EOF

WORKER="$OUT/worker.py"
cat > "$WORKER" <<'EOF'
"""One rank: every collective on the GPU tensors of torch, CuPy and JAX, checked; a JSON report."""
import json, os, sys, time, traceback
import numpy as np
import multidev as md
from multidev import distributed as dist

out_dir, step = sys.argv[1], sys.argv[2]
info = dist.init(transport=os.environ.get("MD_TRANSPORT") or None, timeout=60)
r, w, lr = dist.rank(), dist.world_size(), dist.local_rank()
report = {"step": step, "info": str(info), "rank": r, "checks": {}}
for name in ("torch", "cupy", "jax"):
    try:
        b = md.backend(name)
        gpus = [d for d in b.devices() if d.kind == "gpu"] or (b.devices() if os.environ.get("DRY_RUN") else [])
    except Exception as e:  # not installed here
        report["checks"][name] = {"skipped": f"{type(e).__name__}: {e}"[:200]}
        continue
    if not gpus:
        report["checks"][name] = {"skipped": "no GPU device"}
        continue
    dev = gpus[lr % len(gpus)]
    res = report["checks"][name] = {"device": str(dev)}

    def arr(a, dtype="float32"):
        return md.asarray(np.asarray(a), dtype=dtype, device=dev, backend=name)

    def same(y, expect, dtype="float32"):
        assert isinstance(y, b.tensor_types()), type(y)
        assert md.device_of(y) == dev, (md.device_of(y), dev)
        assert md.dtype_of(y) == dtype, md.dtype_of(y)
        np.testing.assert_allclose(np.asarray(md.to_numpy(y), np.float64), expect, rtol=1e-5, atol=1e-5)

    def check(label, fn):
        try:
            fn()
            res[label] = "OK"
        except Exception:
            res[label] = traceback.format_exc()[-1500:]

    vals = [np.arange(12, dtype=np.float64).reshape(3, 4) - k for k in range(w)]
    mine = vals[r]
    def path():
        res["transport_path"] = p = dist.transport_path(arr(mine))
        host_only = dev.kind == "gpu" and ("not CUDA-aware" in info.transport or os.environ.get("MD_TRANSPORT") == "gloo")
        assert p == "staged" if host_only else p in ("native", "dlpack", "copy"), p  # no device pointer to a host-only wire
    check("path", path)
    check("allreduce sum", lambda: same(dist.allreduce(arr(mine)), np.sum(vals, 0)))
    check("allreduce mean", lambda: same(dist.allreduce(arr(mine), op="mean"), np.mean(vals, 0)))
    check("allreduce max int32", lambda: same(dist.allreduce(arr(mine, "int32"), op="max"), np.max(vals, 0), "int32"))
    check("broadcast", lambda: same(dist.broadcast(arr(mine), src=w - 1), vals[w - 1]))
    check("allgather uneven", lambda: same(dist.allgather(arr(np.full((r + 1, 2), r))),
                                          np.concatenate([np.full((k + 1, 2), k) for k in range(w)])))
    check("reduce_scatter", lambda: same(dist.reduce_scatter(arr(mine), axis=1), np.array_split(np.sum(vals, 0), w, 1)[r]))
    check("scatter", lambda: same(dist.scatter(arr(np.arange(10.0)) if r == 0 else None, src=0, backend=name,
                                               device=dev), np.array_split(np.arange(10.0), w)[r]))

    def inplace():
        x = arr(mine)
        if not b.capabilities.mutable:
            try:
                dist.allreduce(x, inplace=True)
            except md.CapabilityError:
                return
            raise AssertionError("inplace on an immutable backend did not raise")
        assert dist.allreduce(x, inplace=True) is x
        same(x, np.sum(vals, 0))
    check("inplace", inplace)
    check("async", lambda: same(dist.allreduce(arr(mine), async_op=True).wait(), np.sum(vals, 0)))

    def big():
        x = md.ones(16 << 20, device=dev, backend=name)  # 64 MiB
        dist.allreduce(x)
        md.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(3):
            y = dist.allreduce(x)
        md.synchronize(dev)
        res["allreduce 64 MiB ms"] = round((time.perf_counter() - t0) / 3 * 1e3, 2)
        same(y[:4], np.full(4, w))
    check("allreduce 64 MiB", big)
dist.shutdown()
with open(os.path.join(out_dir, f"{step}-rank{r}.json"), "w") as f:
    json.dump(report, f, indent=1)
print(f"rank {r}: {info}")
EOF

run_step() {  # run_step NAME ENGINE [ENV...]: the worker on 2 processes of ENGINE
  local name=$1 engine=$2; shift 2
  stamp "$name"
  env "$@" timeout -k 10 "$CAP" "$PY" -m multidev.distributed.launch -n 2 --engine "$engine" --grace 20 \
    "$WORKER" "$OUT" "$name" > "$OUT/$name.txt" 2>&1
  echo "$name: exit status $?"; tail -n 3 "$OUT/$name.txt"
}

run_step 2-mpi-staged mpi
if [ "$NG" -ge 2 ]; then
  run_step 3-torch-nccl torch
  run_step 4-jax-nccl jax
else
  run_step 3-torch-gloo-staged torch MD_TRANSPORT=gloo
  run_step 4-jax-gloo-staged jax MD_TRANSPORT=gloo JAX_LOCAL_DEVICE_IDS=0
fi
if [ "$NG" -ge 2 ]; then
  stamp "5. the distributed bench suite, torch engine over NCCL"
  timeout -k 10 120 "$PY" -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.runner \
    --suite distributed --backend torch --reps 10 --no-progress --json "$OUT/bench-torch-nccl.json" \
    > "$OUT/bench-torch-nccl.txt" 2>&1
  echo "bench exit status $?"; grep -E "^(met|MISSED)" "$OUT/bench-torch-nccl.txt" | head -20
fi

stamp "summary"
"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
bad = 0
for f in sorted(glob.glob(os.path.join(out, "*-rank*.json"))):
    rep = json.load(open(f))
    for name, res in rep["checks"].items():
        if "skipped" in res:
            print(f"{os.path.basename(f)} {name}: skipped ({res['skipped']})")
            continue
        failed = [k for k, v in res.items() if isinstance(v, str) and v not in ("OK",) and "\n" in v]
        bad += len(failed)
        extra = {k: res[k] for k in ("transport_path", "allreduce 64 MiB ms") if k in res}
        print(f"{os.path.basename(f)} {name} on {res['device']}: {'OK' if not failed else 'FAILED ' + ', '.join(failed)} {extra}")
        for k in failed:
            print(f"  {k}: {res[k][-600:]}")
steps = {os.path.basename(f).split("-rank")[0] for f in glob.glob(os.path.join(out, "*-rank*.json"))}
print(f"steps with reports: {sorted(steps)}; failed checks: {bad}")
sys.exit(1 if bad or len(steps) < 3 else 0)
EOF
status=$?
stamp "done (exit status $status)"
exit $status
