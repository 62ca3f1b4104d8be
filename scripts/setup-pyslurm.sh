#!/usr/bin/env bash
# Build pyslurm into the project's venv against one Slurm release built by build-slurm.sh (pyslurm 25.11.2
# builds against Slurm 25.11 only): `setup-pyslurm.sh 25.11`. Cached: an installed pyslurm of that release
# is kept. The pyslurm backend then needs LD_LIBRARY_PATH=PREFIX/lib at run time (test.sh sets it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=scripts/slurm-release.sh
. scripts/slurm-release.sh
rel=$1
case "$rel" in
  25.11) version=25.11.2 ;;
  *) echo "setup-pyslurm: no pyslurm release builds against Slurm $rel (pyslurm 25.11.2 needs 25.11)" >&2; exit 2 ;;
esac
prefix=$(gandiva_slurm_prefix "$rel")
[ -f "$prefix/include/slurm/slurm.h" ] || { echo "setup-pyslurm: Slurm $rel is not built in $prefix: run GANDIVA_SLURM=$rel bash scripts/setup.sh" >&2; exit 2; }
if [ "$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyslurm"))' 2>/dev/null)" = "$version" ]; then
  exit 0
fi
SLURM_INCLUDE_DIR=$prefix/include SLURM_LIB_DIR=$prefix/lib PIP_DISABLE_PIP_VERSION_CHECK=1 \
  .venv/bin/pip install -q "pyslurm==$version"
echo "setup-pyslurm: pyslurm $version against Slurm $(gandiva_slurm_version "$rel") in $prefix"
