#!/usr/bin/env bash
# The test command (README, second command; .ci/run runs exactly this).
# Sets up the two supported environments in fresh venvs inside the clone and runs every test:
#   .venv     "modern":    numpy 2, torch 2.13.0 (CPU wheel), JAX, TensorFlow   -> numpy, torch, jax, tensorflow
#   .venv-mx  "with MXNet": numpy 1.26.4, JAX 0.7.1, TF 2.21, MXNet 1.9.1        -> all five backends
# MULTIDEV_SKIP_MX=1 skips the second environment (quicker local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore::DeprecationWarning TF_CPP_MIN_LOG_LEVEL=2
start=$(date +%s)

setup() {  # setup VENV PIP-ARGS...: a fresh venv; torch's CPU pin first (anything else pulls CUDA)
  local venv=$1; shift
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q "$@"
  "$venv/bin/pip" check
}

run_tests() {  # run_tests VENV BACKENDS
  # From build/, so that subprocesses (python -m / -c) import the installed package, not the
  # source folder multidev/ (the installed one maps backends/ to multidev.adapters).
  local venv=$PWD/$1 backends=$2
  mkdir -p build
  (cd build &&
    "$venv/bin/pytest" -q -p no:cacheprovider --rootdir=.. ../tests &&
    "$venv/bin/multidev" conformance --backend "$backends" --multiprocess \
      --json "conformance-$(basename "$venv").json")
}

echo "== modern environment: numpy 2, torch, jax, tensorflow =="
setup .venv jax tensorflow-cpu ".[all,test]"
run_tests .venv numpy,torch,jax,tensorflow
echo "modern environment done after $(( $(date +%s) - start )) s"

if [ "${MULTIDEV_SKIP_MX:-0}" != 1 ]; then
  echo "== with MXNet: numpy 1.26.4, JAX 0.7.1, TF 2.21, MXNet 1.9.1 =="
  setup .venv-mx tensorflow-cpu==2.21.0 jax==0.7.1 jaxlib==0.7.1 mxnet==1.9.1 numpy==1.26.4 ".[all,mxnet,test]"
  run_tests .venv-mx numpy,torch,jax,tensorflow,mxnet
fi
echo "all tests passed in $(( $(date +%s) - start )) s"
