#!/usr/bin/env bash
# The README's main job: set up (idempotent), then run the end-to-end demo on a local Slurm cluster.
# Options go to `gandiva demo` (e.g. --keep-cluster, --state-dir DIR, --quantum 20); see --help.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
exec $sudo_ "$root/.venv/bin/gandiva" demo "$@"
