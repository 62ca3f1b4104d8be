#!/usr/bin/env bash
# The whole check, as CI runs it: set-up, ruff, mypy, the unit and simulator tests once, then the real-Slurm
# suite once per Slurm release that GANDIVA_SLURM names (default here: all, i.e. 24.11, 22.05, 25.11 and 26.05;
# GANDIVA_SLURM=24.11 runs just that one). Each real-Slurm run starts a real local cluster of that release (a
# cluster that cannot start FAILS the run, it never skips). Non-zero on any failure. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export GANDIVA_SLURM=${GANDIVA_SLURM:-all}
# shellcheck source=scripts/slurm-release.sh
. scripts/slurm-release.sh
releases=$(gandiva_slurm_releases) || exit 2
bash scripts/setup.sh --build-first-only
# The other releases build in the background (niced) while the first ones are tested.
later=()
for rel in $(echo "$releases" | tail -n +2); do
  [ "$rel" = 22.05 ] || later+=("$rel")
done
builds_pid=""
if [ ${#later[@]} -gt 0 ]; then
  mkdir -p .ci-logs
  (
    for rel in "${later[@]}"; do
      nice -n 10 bash scripts/build-slurm.sh "$rel" "$(gandiva_slurm_prefix "$rel")" >".ci-logs/build-$rel.log" 2>&1 \
        || { echo "test.sh: building Slurm $rel failed: see .ci-logs/build-$rel.log" >&2; exit 1; }
    done
  ) &
  builds_pid=$!
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MPLBACKEND=Agg
# Ports of the suite's own cluster (slurmctld = base+17); override when several runs share a machine.
export GANDIVA_TEST_PORT_BASE=${GANDIVA_TEST_PORT_BASE:-16800}
status=0
failed=()
echo "== ruff"
.venv/bin/ruff check . || { status=1; failed+=(ruff); }
echo "== mypy"
.venv/bin/mypy || { status=1; failed+=(mypy); }
pytest_=(.venv/bin/pytest -ra --strict-markers -p no:cacheprovider --durations=10)
echo "== pytest: unit and simulator tests"
"${pytest_[@]}" -m "not slurm" tests/ "$@" || { status=1; failed+=("unit tests"); }
for rel in $releases; do
  if [ -n "$builds_pid" ] && [[ " ${later[*]} " == *" $rel "* ]]; then
    wait "$builds_pid" || { status=1; failed+=("building Slurm ${later[*]}"); break; }
    builds_pid=""
  fi
  (
    gandiva_slurm_use "$rel"
    echo "== pytest: real-Slurm tests on Slurm $(gandiva_slurm_version "$rel") ($(gandiva_slurm_prefix "$rel"))"
    exec "${pytest_[@]}" -m slurm tests/ "$@"
  ) || { status=1; failed+=("real-Slurm tests on $rel"); }
done
if [ "$status" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}" >&2
else
  echo "test.sh: all checks passed (Slurm releases: $(echo $releases))"
fi
exit "$status"
