#!/usr/bin/env bash
# The test command (README, second command; .ci/run runs exactly this on a fresh clone).
# Three lanes, each a fresh venv inside the clone with an editable install (`pip install -e .`), the
# tests run from the repository root:
#   1. fast       .venv-fast  numpy + rich + test/lint/docs tools: ruff, mypy, the docs site (mkdocs
#                             --strict), the tests (framework tests skip), the conformance suite on NumPy
#                             and array-api-strict. A few minutes.
#   2. modern     .venv       numpy 2, torch 2.13.0 (CPU wheel), JAX, TensorFlow, array-api-strict, mpi4py
#                             with Open MPI from PyPI: multidev.distributed on its three engines (torch,
#                             mpiexec -n 3, 2 JAX processes x 2 CPU devices)
#   3. with MXNet .venv-mx    numpy 1.26.4, JAX 0.7.1, TF 2.21, MXNet 1.9.1 (all five backends; the torch
#                             and jax engines)
# MULTIDEV_LANES=fast,modern,mx picks lanes (default: all three, in that order).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LANES=",${MULTIDEV_LANES:-fast,modern,mx},"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore::DeprecationWarning TF_CPP_MIN_LOG_LEVEL=2
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

setup() {  # setup VENV PIP-ARGS...: a fresh venv; torch's CPU pin first where torch is wanted
  local venv=$1; shift
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade "pip>=23.1" setuptools
  if [ "${TORCH:-1}" = 1 ]; then "$venv/bin/pip" install -q torch==2.13.0; fi
  "$venv/bin/pip" install -q "$@"
  "$venv/bin/pip" check
}

conformance() {  # conformance VENV BACKENDS [extra args]: the suite with its matrix as JSON
  local venv=$1 backends=$2; shift 2
  "$venv/bin/multidev" conformance --backend "$backends" --json "build/conformance-$(basename "$venv").json" "$@"
}

mkdir -p build

if [[ $LANES == *,fast,* ]]; then
  stamp "fast lane: lint, types, NumPy-only tests and conformance"
  TORCH=0 setup .venv-fast -e ".[test,lint,docs]"
  .venv-fast/bin/ruff check .
  .venv-fast/bin/mypy
  .venv-fast/bin/mkdocs build --strict -q   # the API reference: a renamed or undocumented public name fails
  .venv-fast/bin/pytest -q
  conformance .venv-fast numpy,array_api:array_api_strict --multiprocess
  stamp "fast lane done"
fi

if [[ $LANES == *,modern,* ]]; then
  stamp "modern environment: numpy 2, torch, jax, tensorflow, mpi4py + Open MPI (the distributed engines)"
  setup .venv jax tensorflow-cpu mpi4py openmpi -e ".[all,mpi,test]"
  .venv/bin/pytest -q --durations=15
  conformance .venv numpy,torch,jax,tensorflow,array_api:array_api_strict --multiprocess
  stamp "modern environment done"
fi

if [[ $LANES == *,mx,* ]]; then
  stamp "with MXNet: numpy 1.26.4, JAX 0.7.1, TF 2.21, MXNet 1.9.1"
  setup .venv-mx tensorflow-cpu==2.21.0 jax==0.7.1 jaxlib==0.7.1 mxnet==1.9.1 numpy==1.26.4 -e ".[all,mxnet,test]"
  # Left to the modern lane (CI time): the mutation catalogue (the suite against its broken adapters,
  # none of them MXNet's; this lane's suite run below checks the real adapters on these versions).
  # Everything else runs here again, on NumPy 1.26, JAX 0.7.1 and MXNet.
  .venv-mx/bin/pytest -q --durations=15 --ignore=tests/test_mutation_catalogue.py
  # the modern lane runs every engine with every backend; here JAX 0.7.1's engine with JAX's and MXNet's
  # tensors (and its fault cases), the torch engine with all
  MULTIDEV_DISTRIBUTED_ENGINES="torch,jax=jax+mxnet" conformance .venv-mx numpy,torch,jax,tensorflow,mxnet --multiprocess
  stamp "with-MXNet environment done"
fi
stamp "all tests passed"
