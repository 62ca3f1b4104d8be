#!/usr/bin/env bash
# The whole check, as CI runs it: set-up, ruff, mypy, the unit and simulator tests once, then the real-Slurm
# suite once per Slurm release that GANDIVA_SLURM names (default here: all, i.e. 24.11, 22.05, 25.11 and 26.05;
# GANDIVA_SLURM=24.11 runs just that one). Each real-Slurm run starts a real local cluster of that release (a
# cluster that cannot start FAILS the run, it never skips). Non-zero on any failure. Extra arguments go to pytest.
#
# Two releases are tested at a time, each on its own cluster and ports (GANDIVA_TEST_PORT_BASE and +1000):
# the suite mostly waits on training jobs, so two runs take about 11 minutes where one takes 9 (2 cores);
# the unit and simulator tests run beside the first two.
# GANDIVA_TEST_PARALLEL=1 tests one release at a time. Releases after the first build in the background.
# These runs use the CLI backend. Where 25.11 is tested, pyslurm 25.11.2 is built against it (background too)
# and, beside the batch that tests 25.11, the pyslurm backend is tested there: the real-Slurm suite through
# it (without the job-side framework tests, ports from base+3000) and its own tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export GANDIVA_SLURM=${GANDIVA_SLURM:-all}
# shellcheck source=scripts/slurm-release.sh
. scripts/slurm-release.sh
releases=$(gandiva_slurm_releases) || exit 2
parallel=${GANDIVA_TEST_PARALLEL:-2}
bash scripts/setup.sh --build-first-only
logs=.ci-logs
mkdir -p "$logs"
later=()
for rel in $(echo "$releases" | tail -n +2); do
  [ "$rel" = 22.05 ] || later+=("$rel")
done
pyslurm_rel=""
[[ $'\n'"$releases"$'\n' == *$'\n25.11\n'* ]] && pyslurm_rel=25.11
builds_pid=""
pyslurm_pid=""
if [ ${#later[@]} -gt 0 ]; then
  (
    for rel in "${later[@]}"; do
      nice -n 10 bash scripts/build-slurm.sh "$rel" "$(gandiva_slurm_prefix "$rel")" >"$logs/build-$rel.log" 2>&1 \
        || { echo "test.sh: building Slurm $rel failed: see $logs/build-$rel.log" >&2; exit 1; }
    done
  ) &
  builds_pid=$!
fi
if [ -n "$pyslurm_rel" ]; then
  (
    [ -z "$builds_pid" ] || while kill -0 "$builds_pid" 2>/dev/null; do sleep 5; done
    nice -n 10 bash scripts/setup-pyslurm.sh "$pyslurm_rel" >"$logs/pyslurm.log" 2>&1 \
      || { echo "test.sh: installing pyslurm failed: see $logs/pyslurm.log" >&2; exit 1; }
  ) &
  pyslurm_pid=$!
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MPLBACKEND=Agg
# Ports of the suite's own cluster (slurmctld = base+17); override when several runs share a machine.
base=${GANDIVA_TEST_PORT_BASE:-16800}
status=0
failed=()
echo "== ruff"
.venv/bin/ruff check . || { status=1; failed+=(ruff); }
echo "== mypy"
.venv/bin/mypy || { status=1; failed+=(mypy); }
pytest_=(.venv/bin/pytest -ra --strict-markers -p no:cacheprovider --durations=10)
suite() {  # suite RELEASE PORT_BASE: the real-Slurm suite on that release's own cluster, CLI backend
  gandiva_slurm_use "$1"
  export GANDIVA_TEST_PORT_BASE=$2 GANDIVA_SLURM_BACKEND=cli
  echo "== pytest: real-Slurm tests on Slurm $(gandiva_slurm_version "$1") ($(gandiva_slurm_prefix "$1"), ports from $2), CLI backend"
  exec "${pytest_[@]}" -m slurm tests/integration/ "${@:3}"
}

# The suites' ordinary users, made here once: two suites making them at the same moment could collide on
# /etc/passwd's lock (tests/helpers.py ensure_user, tests/integration/test_hostile.py).
if [ "$(id -u)" -eq 0 ]; then
  for u in gandiva-test gandiva-test2; do
    id -u "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$u"
  done
fi
pyslurm_run() {  # pyslurm_run NAME PORT_BASE PYTEST-ARGS...: a pytest run through the pyslurm backend on $pyslurm_rel
  gandiva_slurm_use "$pyslurm_rel"
  prefix=$(gandiva_slurm_prefix "$pyslurm_rel")
  export GANDIVA_TEST_PORT_BASE=$2 GANDIVA_SLURM_BACKEND=pyslurm LD_LIBRARY_PATH=$prefix/lib
  echo "== pytest: $1 through the pyslurm backend on Slurm $(gandiva_slurm_version "$pyslurm_rel") ($prefix)"
  exec "${pytest_[@]}" "${@:3}"
}
pys_suite_pid=""
pys_own_pid=""
start_pyslurm() {  # the pyslurm runs, in the background beside the batch that tests $pyslurm_rel
  # The whole real-Slurm suite again, every in-process query and action and the controller's through
  # pyslurm, on its own cluster (ports from base+3000); beside it (another process: libslurm holds one
  # cluster per process) the backend's own tests on theirs (GANDIVA_PYSLURM_PORT_BASE, 18800).
  # The job-side integrations (DataLoader, Lightning, HF Trainer) and the jobs on several nodes (their node
  # count goes through scontrol with either backend) reach Slurm only through the protocol calls the rest
  # of the suite makes: left out here for CI's time, run on every release with the CLI. So is the controller
  # driving co-held GPUs (test_cohold.py): its Slurm calls are test_parking.py's (park, freeze, thaw), run here.
  echo "== real-Slurm tests through pyslurm on Slurm $pyslurm_rel running (logs: $logs/pytest-pyslurm*.log)"
  (pyslurm_run "the real-Slurm suite" $((base + 3000)) -m slurm tests/integration/ \
    --ignore=tests/integration/test_loader.py --ignore=tests/integration/test_frameworks.py \
    --ignore=tests/integration/test_multinode.py --ignore=tests/integration/test_cohold.py "$@") \
    >"$logs/pytest-pyslurm.log" 2>&1 &
  pys_suite_pid=$!
  (pyslurm_run "the pyslurm backend's own tests" "$base" -m pyslurm tests/integration/test_pyslurm_backend.py "$@") \
    >"$logs/pytest-pyslurm-own.log" 2>&1 &
  pys_own_pid=$!
}
# Folders and markers agree (tests/conftest.py stops a run where they do not): tests/unit/ needs no Slurm,
# every test in tests/integration/ is marked slurm, pyslurm or postgres. This pass is tests/unit/ and the
# PostgreSQL tests (they start their own server), hence the marker rather than the folder.
# They run beside the first real-Slurm batch (which mostly waits on training jobs); their log is printed once
# that batch is done.
echo "== pytest: unit and simulator tests running (log: $logs/pytest-unit.log)"
("${pytest_[@]}" -m "not slurm and not pyslurm" tests/ "$@") >"$logs/pytest-unit.log" 2>&1 &
unit_pid=$!
unit_done() {  # wait for the unit tests once and print their log
  [ -n "$unit_pid" ] || return 0
  local rc=0
  wait "$unit_pid" || rc=$?
  unit_pid=""
  echo "== pytest: unit and simulator tests"
  cat "$logs/pytest-unit.log"
  [ "$rc" -eq 0 ] || { status=1; failed+=("unit tests"); }
}

mapfile -t todo < <(echo "$releases")
while [ ${#todo[@]} -gt 0 ]; do
  batch=("${todo[@]:0:$parallel}")
  todo=("${todo[@]:$parallel}")
  for rel in "${batch[@]}"; do
    if [ -n "$builds_pid" ] && [[ " ${later[*]} " == *" $rel "* ]]; then
      wait "$builds_pid" || { status=1; failed+=("building Slurm ${later[*]}"); todo=(); batch=(); break; }
      builds_pid=""
    fi
  done
  [ ${#batch[@]} -gt 0 ] || break
  pids=()
  for i in "${!batch[@]}"; do
    rel=${batch[$i]}
    echo "== real-Slurm tests on Slurm $rel running (log: $logs/pytest-$rel.log)"
    (suite "$rel" $((base + 1000 * i)) "$@") >"$logs/pytest-$rel.log" 2>&1 &
    pids+=($!)
  done
  # The pyslurm runs go beside the batch that tests its release (the suites mostly wait on training jobs).
  if [ -n "$pyslurm_pid" ] && [[ " ${batch[*]} " == *" $pyslurm_rel "* ]]; then
    if wait "$pyslurm_pid"; then
      start_pyslurm "$@"
    else
      status=1
      failed+=("installing pyslurm")
    fi
    pyslurm_pid=""
  fi
  for i in "${!batch[@]}"; do
    rel=${batch[$i]}
    rc=0
    wait "${pids[$i]}" || rc=$?
    cat "$logs/pytest-$rel.log"
    [ "$rc" -eq 0 ] || { status=1; failed+=("real-Slurm tests on $rel"); }
  done
  unit_done
done
unit_done
if [ -n "$pys_suite_pid" ]; then
  suite_rc=0
  wait "$pys_suite_pid" || suite_rc=$?
  own_rc=0
  wait "$pys_own_pid" || own_rc=$?
  cat "$logs/pytest-pyslurm.log" "$logs/pytest-pyslurm-own.log"
  [ "$suite_rc" -eq 0 ] || { status=1; failed+=("real-Slurm tests through pyslurm on $pyslurm_rel"); }
  [ "$own_rc" -eq 0 ] || { status=1; failed+=("pyslurm backend's own tests on $pyslurm_rel"); }
elif [ -n "$pyslurm_pid" ]; then
  status=1
  failed+=("the pyslurm runs (Slurm $pyslurm_rel was not tested)")
fi
if [ "$status" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}" >&2
else
  echo "test.sh: all checks passed (Slurm releases: $(echo $releases))"
fi
exit "$status"
