#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine: Slurm + munge (+ PostgreSQL for the store tests, MariaDB and
# slurmdbd for `gandiva devcluster up --accounting`),
# a venv in .venv with torch==2.13.0 (CPU) installed first, then the project with its extras.
# GANDIVA_SLURM picks the Slurm release(s) (scripts/slurm-release.sh): 22.05 is Debian 12's packages;
# 24.11, 25.11 and 26.05 are built from source into /opt/slurm-gandiva/RELEASE (cached); "all" sets up
# every release. With --build-first-only only the first release is built (test.sh builds the others in
# the background while it tests). Quiet when there is nothing to do; the output of a failed step is shown.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/slurm-release.sh
. scripts/slurm-release.sh
releases=$(gandiva_slurm_releases) || exit 2
build=$releases
if [ "${1:-}" = --build-first-only ]; then
  build=$(echo "$releases" | head -n1)
fi
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
# Slurm runs jobs as their owners (the demo's and the tests' users): they exec this checkout's venv, so
# other users must be able to reach it. Directories above it that keep others out (mktemp -d makes 0700
# ones) get traverse permission only (o+x: no listing); a home directory is left alone, with what to do.
d=$root
while [ "$d" != "/" ]; do
  if [ $((0$(stat -c %a "$d") & 1)) -eq 0 ]; then
    if getent passwd | cut -d: -f6 | grep -qxF "$d"; then
      echo "setup: jobs run as other users, who cannot enter $d (a home directory): clone the project elsewhere (e.g. under /srv) or run: chmod o+x $d" >&2
      exit 1
    fi
    step "chmod o+x $d" $sudo_ chmod o+x "$d"
    echo "setup: gave other users traverse permission (o+x, no listing) on $d: jobs run as them reach the checkout through it"
  fi
  d=$(dirname "$d")
done
need=()
pkgs=(slurm-wlm slurmctld slurmd slurm-client munge postgresql lua5.1 python3-venv mariadb-server slurmdbd)
for rel in $releases; do
  # What Slurm's configure needs for the plugins the devcluster uses (Debian 13's Slurm build, trimmed).
  [ "$rel" = 22.05 ] || pkgs+=(build-essential libmunge-dev libjson-c-dev libyaml-dev libhttp-parser-dev
    libjwt-dev liblua5.1-0-dev libhwloc-dev libdbus-1-dev libpam0g-dev libcurl4-openssl-dev libreadline-dev
    libmariadb-dev libmariadb-dev-compat)  # MariaDB's client: slurmdbd's accounting_storage/mysql
done
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  step "apt-get update" $sudo_ apt-get update -qq
  step "apt-get install" $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  # The packages start system daemons; the project runs its own, so stop those.
  for s in slurmctld slurmd slurmdbd postgresql mariadb; do $sudo_ systemctl stop "$s" >/dev/null 2>&1 || true; done
fi
for rel in $build; do
  [ "$rel" = 22.05 ] && continue
  prefix=$(gandiva_slurm_prefix "$rel")
  if [ ! -x "$prefix/sbin/slurmctld" ]; then
    echo "setup: building Slurm $rel from source into $prefix (about 3 minutes on 2 cores)"
  elif [ ! -e "$prefix/lib/slurm/accounting_storage_mysql.so" ]; then
    echo "setup: rebuilding Slurm $rel in $prefix with slurmdbd's MariaDB plugin (about 3 minutes on 2 cores)"
  fi
  step "building Slurm $rel" bash scripts/build-slurm.sh "$rel" "$prefix"
done
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
  step "project install" .venv/bin/pip install -q -e ".[controller,dev,lightning,hf]"
  touch "$stamp"
fi
if [ "$(id -u)" -eq 0 ] && ! runuser -u nobody -- test -x "$root/.venv/bin/python" 2>/dev/null; then
  echo "setup: other users cannot run $root/.venv/bin/python (jobs run as them): make the checkout readable, e.g. chmod -R o+rX $root" >&2
  exit 1
fi
torch_v=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
for rel in $build; do
  echo "setup: ok: Slurm $(gandiva_slurm_version "$rel") in $(gandiva_slurm_prefix "$rel"), torch $torch_v"
done
