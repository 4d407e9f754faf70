#!/usr/bin/env bash
# The test command (README, second command; .ci/run runs exactly this on a fresh clone).
#
# Three environments, each a fresh venv inside the clone with an editable install (`pip install -e .`),
# made with uv (pip where uv cannot be had); the tests run from the repository root:
#   fast       .venv-fast  numpy + rich + test/lint/docs tools: ruff, mypy, the docs site (mkdocs
#                          --strict), the tests with no framework installed (what must work, or skip
#                          saying why, on NumPy alone), the conformance suite on NumPy and array-api-strict
#   modern     .venv       numpy 2, torch 2.13.0 (CPU wheel), JAX with flax and optax, TensorFlow, array-api-strict, mpi4py with
#                          Open MPI: every test, the suite on torch, JAX and TensorFlow (NumPy and
#                          array-api-strict are partners there), multidev.distributed on its three engines,
#                          the mutation catalogue
#   with MXNet .venv-mx    numpy 1.26.4, JAX 0.7.1, TF 2.21, MXNet 1.9.1: what differs there and nowhere
#                          else: MXNet's tests and suite, and the NumPy and JAX adapters on NumPy 1.26 and
#                          JAX 0.7.1 (their suite, their adapter tests, the tests that take every backend
#                          except whole programs and tools over NumPy and JAX: the modern lane runs those)
# Each thing is tested once, in the environment that adds information. The environments are made
# side by side, and a lane's jobs start as soon as its own is ready (the fast one, without torch, in
# about a third of the others' time). The jobs run side by side (JOBS at a time, default 2, the
# longest first), each into build/ci/NAME.log with its JUnit XML beside it (per-test times), printed
# whole when it fails and as its last lines when it passes; each job's wall and processor time and
# each environment's time are printed, then one closing line adding up every pytest run. The
# multi-process tests that time how soon a fault surfaces (marker `timing`) run after them, alone;
# the suite's checks of that kind (15 s of slack past each timeout) and the adversarial ranks' (20 s)
# run among phase 1's last jobs.
#   MULTIDEV_LANES=fast,modern,mx picks environments (default all three); JOBS=N; PYTHON=python3.11.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LANES=",${MULTIDEV_LANES:-fast,modern,mx},"
JOBS=${JOBS:-2}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "JOBS must be a positive integer, got $JOBS" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore::DeprecationWarning TF_CPP_MIN_LOG_LEVEL=2
export MULTIDEV_CACHE_DIR="$PWD/build/cache"  # the devices cache stays in the clone
# Bytecode: nothing is compiled at install (pip's and uv's compile steps took about 70 of the modern
# environment's 105 s, mostly on modules no test imports); the interpreter caches each module's
# bytecode at its first import instead, frameworks included (~15 s once per environment for torch,
# JAX and TensorFlow). PYTHONDONTWRITEBYTECODE is unset for that: a machine that sets it would
# recompile them from source in every process, ~12 s of each child's start-up.
export UV_COMPILE_BYTECODE=0
unset PYTHONDONTWRITEBYTECODE
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
mkdir -p build/ci && rm -f build/ci/*.log build/ci/*.rc build/ci/*.time build/ci/*.cpu

# -- environments -----------------------------------------------------------------------------------
UV=""
if command -v uv >/dev/null 2>&1; then UV=$(command -v uv)
elif "$PY" -m pip install -q --target build/uv uv >/dev/null 2>&1 && [ -x build/uv/bin/uv ]; then UV=$PWD/build/uv/bin/uv
fi
setup() {  # setup VENV PACKAGES...: a fresh venv; torch's CPU pin first (pip finds the local wheel) where wanted
  local venv=$1; shift
  rm -rf "$venv"
  if [ -n "$UV" ]; then
    "$UV" venv -q --seed -p "$PY" "$venv" || return 1
  else
    "$PY" -m venv "$venv" && "$venv/bin/pip" install -q --upgrade "pip>=23.1" setuptools || return 1
  fi
  if [ "${TORCH:-1}" = 1 ]; then "$venv/bin/python" -m pip install -q --no-compile torch==2.13.0 || return 1; fi
  if [ -n "$UV" ]; then
    "$UV" pip install -q -p "$venv/bin/python" "$@" && "$UV" pip check -q -p "$venv/bin/python"
  else
    "$venv/bin/pip" install -q "$@" && "$venv/bin/pip" check
  fi
}
t0=$(date +%s)
stamp "environments (uv: ${UV:-no, pip}), made side by side; a lane's jobs start as soon as its own is ready"
made() {  # made LANE VENV PACKAGES...: LANE's environment, its status in build/ci/setup-LANE.rc (written whole)
  local lane=$1; shift
  setup "$@" >"build/ci/setup-$lane.log" 2>&1
  echo $? >"build/ci/setup-$lane.rc.tmp" && mv "build/ci/setup-$lane.rc.tmp" "build/ci/setup-$lane.rc"
}
declare -A setup_pid=()
if [[ $LANES == *,fast,* ]]; then (TORCH=0 made fast .venv-fast -e ".[test,lint,docs]") & setup_pid[fast]=$!; fi
if [[ $LANES == *,modern,* ]]; then
  (made modern .venv jax tensorflow-cpu mpi4py openmpi flax optax -e ".[all,mpi,test]") & setup_pid[modern]=$!
fi
if [[ $LANES == *,mx,* ]]; then
  (made mx .venv-mx tensorflow-cpu==2.21.0 jax==0.7.1 jaxlib==0.7.1 mxnet==1.9.1 numpy==1.26.4 \
    -e ".[all,mxnet,test]") & setup_pid[mx]=$!
fi
ready() {  # ready LANE: status 0 when LANE's environment is made, 1 while it is being made, 2 when it
  # failed (or its maker ended without writing a status: killed, or the disk full)
  local f="build/ci/setup-$1.rc"
  if [ ! -f "$f" ]; then
    kill -0 "${setup_pid[$1]:-}" 2>/dev/null && return 1
    [ -f "$f" ] || return 2
  fi
  [ "$(cat "$f")" = 0 ] && return 0
  return 2
}
envs_failed=""

# -- jobs ---------------------------------------------------------------------------------------------
# Two phases: first every job but one (side by side, JOBS at a time), then the project's multi-process
# tests that measure time-outs with little slack (marker `timing`), alone on a quiet machine.
names=(); cmds=(); phases=()
job() {  # job PHASE NAME COMMAND; a pytest command also writes build/ci/NAME.xml (JUnit: per-test times)
  names+=("$2"); cmds+=("${3/\/bin\/pytest /\/bin\/pytest --junitxml=build/ci/$2.xml }"); phases+=("$1"); }
conformance() {  # conformance VENV BACKENDS [extra args]: the suite, its matrix as JSON in build/
  local venv=$1 backends=$2; shift 2
  echo "$venv/bin/multidev conformance --backend $backends --json build/conformance-$(basename "$venv")-${backends//[,:]/_}-\$RANDOM.json $*"
}
# Phase 1 is listed longest first (a job starts when one of the JOBS before it ends). The tests that
# run a whole suite in a child process form their own job, so that the two halves of the modern
# tests run side by side.
HEAVY="tests/adversarial tests/test_author_path.py tests/test_cli.py tests/test_adapter_api.py \
tests/test_adapter_array_api.py tests/test_adapter_cupy.py tests/test_certification.py"
IGNORE_HEAVY="--ignore=tests/test_mutation_catalogue.py $(for f in $HEAVY; do printf -- '--ignore=%s ' "$f"; done)"
if [[ $LANES == *,modern,* ]]; then
  job 1 modern-tests ".venv/bin/pytest -q --durations=15 -m 'not multiprocess' $IGNORE_HEAVY"
  # the tests that re-run an adapter's whole suite in a child run its checks with partner frameworks
  # here (tests/_workers.child_suite); the fast lane runs those suites whole
  job 1 modern-tests-children "MULTIDEV_CHILD_SUITES=partners .venv/bin/pytest -q --durations=15 -m 'not multiprocess' \
$HEAVY"
fi
if [[ $LANES == *,mx,* ]]; then
  # What differs here: MXNet, and the NumPy and JAX adapters on NumPy 1.26 and JAX 0.7.1: every test
  # that names MXNet; the tests that name NumPy or JAX (MXNet's and JAX's adapter tests whole, the
  # adversarial children that probe the adapters), except the whole programs and tools run over them
  # (the book's programs, the examples, the docs' snippets, the CLI), which the modern lane runs.
  job 1 mx-tests ".venv-mx/bin/pytest -q --durations=10 -m 'not multiprocess' --ignore=tests/test_mutation_catalogue.py \
-k 'mxnet or ((jax or numpy) and not (test_book or test_examples or test_docs or test_cli))'"
fi
if [[ $LANES == *,modern,* ]]; then
  job 1 modern-catalogue ".venv/bin/pytest -q tests/test_mutation_catalogue.py"
  # the multi-process tests and checks that time nothing (the ones that do: the suite's below, the
  # project's own in phase 2)
  job 1 modern-multiprocess ".venv/bin/pytest -q --durations=10 -m 'multiprocess and not timing' \
--ignore=tests/test_mutation_catalogue.py"
  job 1 modern-suite-multiprocess "$(conformance .venv numpy,torch,jax,tensorflow --multiprocess \
-- -m "'multiprocess and not timing'")"
  for b in jax tensorflow torch; do job 1 "modern-suite-$b" "$(conformance .venv $b)"; done
fi
if [[ $LANES == *,fast,* ]]; then
  job 1 fast-tests ".venv-fast/bin/pytest -q -m 'not multiprocess'"
  job 1 fast-suite "$(conformance .venv-fast numpy,array_api:array_api_strict)"
  job 1 fast-lint ".venv-fast/bin/ruff check . && .venv-fast/bin/mypy && .venv-fast/bin/mkdocs build --strict -q"
fi
if [[ $LANES == *,mx,* ]]; then
  job 1 mx-suite "$(conformance .venv-mx mxnet,numpy,jax)"
fi
# The suite's checks that time how soon a fault surfaces (marker `timing`) in both environments, among
# the last jobs of phase 1: their bounds are 15 s past each timeout (they bound a hang; the bench
# times time-to-error), which another job beside them does not approach.
if [[ $LANES == *,modern,* ]]; then
  job 1 modern-suite-timing "$(conformance .venv numpy,torch,jax,tensorflow --multiprocess -- -m "'multiprocess and timing'")"
  # (and the adversarial ranks' timing tests: a mismatch must raise well before the workers' 20 s timeout)
  job 1 modern-timing-ranks ".venv/bin/pytest -q -m 'multiprocess and timing' tests/adversarial/test_ranks.py"
fi
if [[ $LANES == *,mx,* ]]; then
  job 1 mx-suite-timing "MULTIDEV_DISTRIBUTED_ENGINES='jax=jax+mxnet' $(conformance .venv-mx mxnet,jax --multiprocess \
-- -m "'multiprocess and timing'")"
  # the JAX engine of JAX 0.7.1 with JAX's and MXNet's tensors (the modern lane runs every engine)
  job 1 mx-data-parallel ".venv-mx/bin/pytest -q -m multiprocess tests/test_data_parallel_processes.py \
tests/test_sharded_processes.py -k mxnet"
  job 1 mx-multiprocess "MULTIDEV_DISTRIBUTED_ENGINES='jax=jax+mxnet' $(conformance .venv-mx mxnet,jax --multiprocess \
-- -m "'multiprocess and not timing'")"
fi
# Phase 2: the project's own tests that time how soon a fault surfaces (marker `timing`), alone
# (test_faults_engines starts every scenario at once, ~15 processes, with 2.5 s of slack beyond 1.2x
# a 3 s timeout).
if [[ $LANES == *,modern,* ]]; then
  job 2 modern-timing ".venv/bin/pytest -q --durations=10 -m 'multiprocess and timing' --ignore=tests/test_mutation_catalogue.py \
--ignore=tests/adversarial/test_ranks.py"
fi

run_job() {  # run_job I: job I into build/ci/NAME.log, its status and seconds beside it
  local name=${names[$1]} t
  t=$(date +%s)
  bash -c "${cmds[$1]}" >"build/ci/$name.log" 2>&1
  echo $? >"build/ci/$name.rc"
  echo $(( $(date +%s) - t )) >"build/ci/$name.time"
  cpu_seconds >"build/ci/$name.cpu"  # this subshell's children: the job's processor time
}
cpu_seconds() {  # user + system seconds of the finished children of this shell (`times` run here, not
  # in a pipe or $(...): a subshell has no children of its own)
  times >"build/ci/.times.$BASHPID"
  awk 'function sec(x) { split(x, a, "m"); return a[1] * 60 + a[2] } END { printf "%d", sec($1) + sec($2) }' \
    "build/ci/.times.$BASHPID"
  rm -f "build/ci/.times.$BASHPID"
}
for phase in 1 2; do
  limit=$JOBS; [ $phase = 2 ] && limit=1
  pending=()
  for i in "${!names[@]}"; do [ "${phases[$i]}" = $phase ] && pending+=("$i"); done
  slots=()  # the pids of the jobs running now (polled: `wait -n` can return for an earlier child)
  while [ "${#pending[@]}" -gt 0 ]; do
    live=()
    for p in "${slots[@]}"; do kill -0 "$p" 2>/dev/null && live+=("$p"); done
    slots=("${live[@]}")
    pick=""; rest=()
    if [ "${#slots[@]}" -lt "$limit" ]; then  # a free slot: the first job (longest first) whose lane is ready
      for i in "${pending[@]}"; do
        lane=${names[$i]%%-*}
        if [ -z "$pick" ]; then
          ready "$lane"; st=$?
          if [ $st = 0 ]; then pick=$i; continue; fi
          if [ $st = 2 ]; then  # its environment failed: its jobs never start (the run fails below)
            [[ $envs_failed == *" $lane "* ]] || { envs_failed+=" $lane "; cat "build/ci/setup-$lane.log"
              stamp "FAILED: the $lane environment (its log above); its jobs do not run"; }
            continue
          fi
        fi
        rest+=("$i")
      done
      pending=("${rest[@]}")
    fi
    if [ -z "$pick" ]; then sleep 1; continue; fi
    stamp "start ${names[$pick]}: ${cmds[$pick]}"
    if [ "$limit" = 1 ]; then (run_job "$pick"); continue; fi  # alone (a subshell: its own children's times)
    run_job "$pick" &
    slots+=($!)
  done
  wait
  if [ $phase = 1 ]; then
    for f in build/ci/setup-*.rc; do
      [ -f "$f" ] || continue
      f2=${f#build/ci/setup-}; echo "== environment ${f2%.rc}: $(( $(stat -c %Y "$f") - t0 )) s"
    done
  fi
  stamp "phase $phase done"
done

# -- report -------------------------------------------------------------------------------------------
failed=0; passed=0; nfailed=0; skipped=0
[ -n "$envs_failed" ] && failed=1
for name in "${names[@]}"; do
  if [[ $envs_failed == *" ${name%%-*} "* ]] && [ ! -f "build/ci/$name.rc" ]; then
    echo; echo "== $name: not run (the ${name%%-*} environment failed; its log above)"; continue
  fi
  rc=$(cat "build/ci/$name.rc" 2>/dev/null || echo 99)
  secs=$(cat "build/ci/$name.time" 2>/dev/null || echo "?")
  secs="$secs s (processor $(cat "build/ci/$name.cpu" 2>/dev/null || echo "?") s)"
  echo
  if [ "$rc" = 0 ]; then
    echo "== $name: passed in $secs"
    tail -n 25 "build/ci/$name.log"
  else
    echo "== $name: FAILED (exit $rc) in $secs; its whole log:"
    cat "build/ci/$name.log"
    failed=1
  fi
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?)' "build/ci/$name.log" | tail -n 1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+')
  e=$(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+')
  passed=$((passed + ${p:-0})); nfailed=$((nfailed + ${f:-0} + ${e:-0})); skipped=$((skipped + ${s:-0}))
done
echo
for lane in fast modern mx; do
  [[ $LANES == *,$lane,* ]] || continue
  total=0
  for name in "${names[@]}"; do [[ $name == $lane-* ]] && total=$((total + $(cat "build/ci/$name.time" 2>/dev/null || echo 0))); done
  echo "== $lane: $total s of jobs"
done
stamp "done: $( [ $failed = 0 ] && echo 'all jobs passed' || echo 'SOME JOBS FAILED')"
echo "$passed passed, $nfailed failed, $skipped skipped"
exit $failed
