# Sourced by setup.sh, test.sh and demo.sh: which Slurm release(s) GANDIVA_SLURM names, and where each lives.
#   GANDIVA_SLURM=24.11 (default) | 22.05 | 25.11 | 26.05 | all
# 22.05 is Debian 12's packages (/usr); the others are built from source into /opt/slurm-gandiva/RELEASE.
# `gandiva_slurm_use REL` puts a release's commands first on PATH for this shell and its children.
GANDIVA_SLURM_DEFAULT=24.11
GANDIVA_SLURM_ALL="22.05 24.11 25.11 26.05"

gandiva_slurm_releases() {  # the releases GANDIVA_SLURM names, default first
  local want=${GANDIVA_SLURM:-$GANDIVA_SLURM_DEFAULT}
  case "$want" in
    all) echo "$GANDIVA_SLURM_DEFAULT"; for r in $GANDIVA_SLURM_ALL; do [ "$r" = "$GANDIVA_SLURM_DEFAULT" ] || echo "$r"; done ;;
    22.05|24.11|25.11|26.05) echo "$want" ;;
    *) echo "GANDIVA_SLURM=$want is not a supported Slurm release: use one of $GANDIVA_SLURM_ALL, or all" >&2; return 2 ;;
  esac
}

gandiva_slurm_prefix() {
  if [ "$1" = 22.05 ]; then echo /usr; else echo "/opt/slurm-gandiva/$1"; fi
}

gandiva_slurm_use() {  # PATH with the release's commands first (22.05: Debian's, in /usr)
  local prefix
  prefix=$(gandiva_slurm_prefix "$1")
  # Another release's prefix already on PATH would shadow this one.
  PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v '^/opt/slurm-gandiva/' | paste -sd: -)
  export PATH
  if [ "$1" != 22.05 ]; then
    export PATH="$prefix/sbin:$prefix/bin:$PATH"
  fi
}

gandiva_slurm_version() {  # what the release's slurmctld says of itself, e.g. 24.11.5
  local prefix
  prefix=$(gandiva_slurm_prefix "$1")
  "$prefix/sbin/slurmctld" -V 2>/dev/null | awk '{print $2}' || echo "?"
}
