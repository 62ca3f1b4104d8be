#!/usr/bin/env bash
# The README's main job: set up (idempotent), then run the end-to-end demo on a local Slurm cluster.
# GANDIVA_SLURM picks the Slurm release (default 24.11; 22.05, 25.11, 26.05: scripts/slurm-release.sh).
# Options go to `gandiva demo` (e.g. --keep-cluster, --state-dir DIR, --quantum 20); see --help.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/slurm-release.sh
. scripts/slurm-release.sh
releases=$(gandiva_slurm_releases) || exit 2
rel=${releases%%$'\n'*}
[ "$rel" = "$releases" ] || { echo "demo.sh: GANDIVA_SLURM=$GANDIVA_SLURM names several releases: pick one (e.g. 24.11)" >&2; exit 2; }
bash scripts/setup.sh
gandiva_slurm_use "$rel"
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo env PATH=$PATH"
exec $sudo_ "$root/.venv/bin/gandiva" demo "$@"
