#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine: Slurm + munge (+ PostgreSQL for the store tests),
# a venv in .venv with torch==2.13.0 (CPU) installed first, then the project with its extras.
# Quiet when there is nothing to do; the output of a failed step is shown.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log=$(mktemp -t gandiva-setup.XXXXXX)
trap 'rm -f "$log"' EXIT
step() {  # step DESCRIPTION CMD...: run quietly, show the output if it fails
  local what=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: $what failed:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
need=()
for pkg in slurm-wlm slurmctld slurmd slurm-client munge postgresql lua5.1 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  step "apt-get update" $sudo_ apt-get update -qq
  step "apt-get install" $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  # The packages start system daemons; the project runs its own, so stop those.
  for s in slurmctld slurmd postgresql; do $sudo_ systemctl stop "$s" >/dev/null 2>&1 || true; done
fi
# Debian's python, not a per-user one (pyenv under /root): jobs run as other users must exec it.
py=${PYTHON:-/usr/bin/python3}
if [ ! -x .venv/bin/python ]; then
  step "creating the venv" "$py" -m venv .venv
fi
stamp=.venv/.gandiva-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  step "pip upgrade" .venv/bin/pip install -q --upgrade pip
  # The pin first: a looser torch requirement would pull a multi-GB CUDA build.
  step "torch install" .venv/bin/pip install -q torch==2.13.0
  step "project install" .venv/bin/pip install -q -e ".[controller,dev]"
  touch "$stamp"
fi
torch_v=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
slurm_v=$(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null || echo "?")
echo "setup: ok (torch $torch_v, slurm $slurm_v)"
