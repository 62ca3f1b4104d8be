#!/usr/bin/env bash
# The whole check, as CI runs it: set-up, ruff, mypy, then the whole pytest suite, which starts a real
# local Slurm cluster (a cluster that cannot start FAILS the run, it never skips). Non-zero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MPLBACKEND=Agg
# Ports of the suite's own cluster (slurmctld = base+17); override when several runs share a machine.
export GANDIVA_TEST_PORT_BASE=${GANDIVA_TEST_PORT_BASE:-16800}
status=0
echo "== ruff"
.venv/bin/ruff check . || status=1
echo "== mypy"
.venv/bin/mypy || status=1
echo "== pytest"
.venv/bin/pytest -ra --strict-markers -p no:cacheprovider --durations=15 tests/ "$@" || status=1
if [ "$status" -ne 0 ]; then
  echo "test.sh: FAILED" >&2
else
  echo "test.sh: all checks passed"
fi
exit "$status"
