#!/usr/bin/env bash
# The mutation catalogue on a GPU machine (the lead's H200 run): every torch and JAX mutant,
# including those whose defect only shows on a GPU, against the conformance suite on cpu:0 and the
# GPUs; the results per mutant go to $OUT/mutants-*.json, the pytest log to $OUT/gpu_mutants.log.
# Mutants that need 2 GPUs are reported "not run" on a single GPU (use a 2-GPU machine for them).
#   bash scripts/gpu_mutants.sh            (from the repository root; python3 with torch+CUDA, JAX)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build/gpu-mutants}
mkdir -p "$OUT"
DEVICES=cpu:0$(python3 -c 'import torch; print("".join(f",gpu:{i}" for i in range(torch.cuda.device_count())))')
export MULTIDEV_CATALOGUE_DEVICE=$DEVICES MULTIDEV_CATALOGUE_OUT=$OUT MULTIDEV_CATALOGUE_ONLY=${ONLY:-torch,jax}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONWARNINGS=ignore::DeprecationWarning
echo "devices: $DEVICES"
python3 -m pytest -q -p no:cacheprovider tests/test_mutation_catalogue.py \
  -k "every_runnable_mutant or controls_pass" 2>&1 | tee "$OUT/gpu_mutants.log"
rc=${PIPESTATUS[0]}
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
exit $rc
