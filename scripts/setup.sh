#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine: Slurm + munge (+ PostgreSQL for the store tests),
# a venv in .venv with torch==2.13.0 (CPU) installed first, then the project with its extras.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
need=()
for pkg in slurm-wlm slurmctld slurmd slurm-client munge postgresql lua5.1 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
  # The packages start system daemons; the project runs its own, so stop those.
  for s in slurmctld slurmd postgresql; do $sudo_ systemctl stop "$s" >/dev/null 2>&1 || true; done
fi
# Debian's python, not a per-user one (pyenv under /root): jobs run as other users must exec it.
py=${PYTHON:-/usr/bin/python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=.venv/.gandiva-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # The pin first: a looser torch requirement would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[controller,dev]"
  touch "$stamp"
fi
echo "setup: ok ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'); slurm $(dpkg-query -W -f "${Version}" slurm-client))"
