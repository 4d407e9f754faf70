#!/usr/bin/env bash
# The mutation catalogue on a GPU machine (the lead's H200 run), in three steps, a few minutes on one
# H200 (no internet; python3 with torch+CUDA, JAX and CuPy):
#   1. a probe of JAX's synchronize (issue 21): 200 jitted 6000x6000 matmuls queued with their results
#      dropped, then each spelling of synchronize, old (live arrays only) and new (markers): how long
#      it waited and how much work was left after it; its idle cost; that a marker is queued behind
#      a GPU's work ($OUT/jax-sync-probe.json);
#   2. the checks that only a GPU exercises, on the real adapters, for every GPU producer/consumer
#      pair (torch, JAX, CuPy): the DLPack stream hand-off, non-blocking moves whose sources were
#      dropped, staged transfers with the adapters' own plans, synchronize of dropped work, copy=False
#      at every alignment ($OUT/gpu-checks.json, $OUT/gpu-checks.log);
#   3. every torch, JAX and CuPy mutant, including those whose defect only shows on a GPU, against the
#      conformance suite on cpu:0 and the GPUs; the results per mutant go to $OUT/mutants-*.json, the
#      pytest log to $OUT/gpu_mutants.log. Mutants that need 2 GPUs are reported "not run" on one GPU.
#   bash scripts/gpu/mutants.sh            (from the repository root)
#   OUT=DIR ONLY=torch,jax,cupy STEPS=1,2,3 bash scripts/gpu/mutants.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build/gpu-mutants}
mkdir -p "$OUT"
STEPS=",${STEPS:-1,2,3},"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
# cpu:0-3 too: the JAX adapter's four virtual CPU devices (the suite asks for 4), which its multi-device
# mutants need (torch and CuPy have cpu:0 alone); then every GPU.
DEVICES=cpu:0,cpu:1,cpu:2,cpu:3$(python3 -c 'import torch; print("".join(f",gpu:{i}" for i in range(torch.cuda.device_count())))')
export MULTIDEV_CATALOGUE_DEVICE=$DEVICES MULTIDEV_CATALOGUE_OUT=$OUT MULTIDEV_CATALOGUE_ONLY=${ONLY:-torch,jax,cupy}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore::DeprecationWarning PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
echo "devices: $DEVICES"
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
rc=0

if [[ $STEPS == *,1,* ]]; then
  stamp "1. JAX synchronize probe"
  timeout 120 python3 - "$OUT/jax-sync-probe.json" <<'PY' || rc=1
import json, sys, time, timeit
sys.path.insert(0, "tests")
import jax
import multidev as md
from mutants import JaxSynchronizeLiveOnly

b, old = md.backend("jax"), JaxSynchronizeLiveOnly()
gpu = next(d for d in b.devices() if d.is_gpu)
x = md.rand((6000, 6000), device=gpu, backend="jax", seed=0)
f = jax.jit(lambda a: a @ a)
f(x).block_until_ready()
t0 = time.perf_counter(); f(x).block_until_ready(); one = time.perf_counter() - t0
doc = {"device": str(gpu), "jax": jax.__version__, "one_matmul_ms": one * 1e3, "dropped": {}, "idle_us": {}}
spellings = {"md.synchronize()": md.synchronize, "md.synchronize(device)": lambda: md.synchronize(gpu),
             "md.synchronize(device, backend=)": lambda: md.synchronize(gpu, backend="jax"),
             "old synchronize(None)": lambda: old.synchronize(None),
             "old synchronize(device)": lambda: old.synchronize(gpu)}
for name, sync in spellings.items():
    for _ in range(200):
        f(x)  # D2L 12.2's run(x): the results are dropped
    t0 = time.perf_counter(); sync(); t1 = time.perf_counter()
    f(x).block_until_ready(); t2 = time.perf_counter()  # one more matmul: what was still queued shows
    doc["dropped"][name] = {"waited_ms": (t1 - t0) * 1e3, "left_ms": max(0.0, (t2 - t1 - one)) * 1e3}
for name, sync in spellings.items():
    sync()
    doc["idle_us"][name] = min(timeit.repeat(sync, number=2000, repeat=5)) / 2000 * 1e6
ys = [f(x) for _ in range(20)]
jax.block_until_ready(b._markers(b.to_native_device(gpu)))
doc["marker_behind_20_kept_matmuls"] = f"{sum(y.is_ready() for y in ys)}/20 ready when the marker was"
print(json.dumps(doc, indent=2))
open(sys.argv[1], "w").write(json.dumps(doc, indent=2))
PY
fi

if [[ $STEPS == *,2,* ]]; then
  stamp "2. the GPU checks on the real adapters, every pair"
  timeout 240 python3 -m multidev.cli conformance --backend torch,jax,cupy --device "$DEVICES" \
    --json "$OUT/gpu-checks.json" -- -q -p no:cacheprovider -rfs -k "ordered_after_the_producers or \
survive_their_dropped or staged_transfers or results_were_dropped or copy_false_never" \
    > "$OUT/gpu-checks.log" 2>&1 || rc=1
  grep -E "^(feature|[a-z_]+ +[0-9]+/)|passed|failed|FAILED" "$OUT/gpu-checks.log" | tail -20
fi

if [[ $STEPS == *,3,* ]]; then
  stamp "3. the mutation catalogue ($MULTIDEV_CATALOGUE_ONLY)"
  timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_mutation_catalogue.py \
    -k "every_runnable_mutant or controls_pass" 2>&1 | tee "$OUT/gpu_mutants.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("mutants-*.json")):
    doc = json.loads(f.read_text())
    for r in doc["rows"]:
        if "mutant" in r:
            print(f"{r['mutant']:32s} gpus={r['gpus']} {r['outcome']:10s} {r['caught_by']}")
        else:
            print(f"{r['control']:32s} control: {r['passed']} passed, {r['failed']} failed")
PY
fi
stamp "done (exit status $rc)"
exit $rc
