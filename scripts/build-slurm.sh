#!/usr/bin/env bash
# Build one Slurm release from source into its own prefix, cached: `build-slurm.sh RELEASE PREFIX`.
# RELEASE 24.11: Debian 13's source tarball (apt-get source checks it against Debian's signed index).
# RELEASE 25.11 / 26.05: SchedMD's tarball from $GANDIVA_SLURM_SRC (a file; a site points it at SchedMD's
# download), else from ../shared/slurm/ beside the checkout (this repository's CI). Its sha256 must match
# scripts/slurm-sources.sha256. A prefix holding .gandiva-built with the tarball's sha256 (and, where
# mysql_config is, slurmdbd's accounting_storage/mysql plugin) is kept as is.
set -euo pipefail
rel=$1
prefix=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
case "$rel" in
  24.11) tarname=slurm-wlm_24.11.5.orig.tar.gz; debver=24.11.5-4+deb13u1 ;;
  25.11) tarname=slurm-25.11.7.tar.gz ;;
  26.05) tarname=slurm-26.05.3.tar.gz ;;
  *) echo "build-slurm: unknown release $rel: use 24.11, 25.11 or 26.05" >&2; exit 2 ;;
esac
work=/var/cache/slurm-gandiva/src
$sudo_ mkdir -p "$work"
tarball=$work/$tarname
if [ "$rel" = 24.11 ]; then
  if [ ! -f "$tarball" ]; then
    list=/etc/apt/sources.list.d/slurm-gandiva-trixie-src.list
    if [ ! -f "$list" ]; then
      # Source only: nothing of Debian 13 gets installed.
      echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        | $sudo_ tee "$list" >/dev/null
    fi
    $sudo_ apt-get update -qq
    (cd "$work" && $sudo_ apt-get source -qq --download-only --tar-only "slurm-wlm=$debver")
  fi
  want=""
else
  src=${GANDIVA_SLURM_SRC:-}
  if [ -z "$src" ]; then
    src=$(dirname "$root")/shared/slurm/$tarname
    [ -f "$src" ] || { echo "build-slurm: no source tarball for Slurm $rel: set GANDIVA_SLURM_SRC=PATH to SchedMD's $tarname" >&2; exit 2; }
  fi
  [ -f "$src" ] || { echo "build-slurm: GANDIVA_SLURM_SRC=$src is not a file: point it at SchedMD's $tarname" >&2; exit 2; }
  want=$(awk -v f="$tarname" '$2 == f {print $1}' "$here/slurm-sources.sha256")
  got=$(sha256sum "$src" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "build-slurm: $src has sha256 $got, not $want ($tarname): download SchedMD's $tarname again" >&2
    exit 2
  fi
  [ "$src" -ef "$tarball" ] || $sudo_ cp "$src" "$tarball"
fi
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
# With MariaDB's client headers (setup.sh installs them) slurmdbd stores accounting in MariaDB: a cached
# build made before them lacks the plugin (devcluster --accounting) and is rebuilt.
mysql=""
command -v mysql_config >/dev/null 2>&1 && mysql=$prefix/lib/slurm/accounting_storage_mysql.so
if [ -f "$prefix/.gandiva-built" ] && [ "$(cat "$prefix/.gandiva-built")" = "$sum" ] && [ -x "$prefix/sbin/slurmctld" ] \
  && { [ -z "$mysql" ] || [ -e "$mysql" ]; }; then
  exit 0
fi
build=$(mktemp -d -t slurm-build.XXXXXX)
# Installed into a stage beside the prefix, then renamed into place: other runs may use the old build
# meanwhile (running daemons keep their open files; a command started between the two renames fails).
$sudo_ mkdir -p "$(dirname "$prefix")"
stage=$($sudo_ mktemp -d "$(dirname "$prefix")/.stage-$(basename "$prefix").XXXXXX")
trap 'rm -rf "$build"; $sudo_ rm -rf "$stage"' EXIT
tar -xzf "$tarball" -C "$build"
srcdir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n1)
cd "$srcdir"
# No static libraries (libtool would compile every file twice) and no debug info: half the build time.
./configure --prefix="$prefix" --sysconfdir="$prefix/etc" --enable-multiple-slurmd --disable-static --disable-debug
make -j"$(nproc)"
$sudo_ make install DESTDIR="$stage"
if [ -n "$mysql" ] && [ ! -e "$stage$mysql" ]; then
  echo "build-slurm: Slurm $rel built without accounting_storage/mysql although mysql_config is there: see $srcdir/config.log" >&2
  trap 'rm -rf "$stage"' EXIT  # keep the build tree for its config.log
  exit 1
fi
echo "$sum" | $sudo_ tee "$stage$prefix/.gandiva-built" >/dev/null
old=""
if [ -e "$prefix" ]; then
  old=$stage/old
  $sudo_ mv -T "$prefix" "$old"
fi
$sudo_ mv -T "$stage$prefix" "$prefix"
