"""The one place that talks to Slurm. `make_backend()` gives the pyslurm backend where the installed pyslurm was
built for the Slurm in use, else the CLI backend (squeue/sinfo --json); GANDIVA_SLURM_BACKEND=cli|pyslurm picks one."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_gandiva.errors import ConfigError, SlurmError
from slurm_gandiva.slurm.base import SlurmBackend

BACKEND_KINDS = ("auto", "cli", "pyslurm", "auto-pyslurm")


def make_backend(
    env: Mapping[str, str] | None = None, *, timeout: float = 30.0, kind: str = "auto"
) -> SlurmBackend:
    """A backend for the Slurm that `env` names (e.g. {"SLURM_CONF": ...}, added to every Slurm command's
    environment; pyslurm is initialised with the same slurm.conf).

    kind "cli": the CLI backend. "pyslurm": the pyslurm backend, ConfigError (one line) if pyslurm cannot be
    used or was built for another Slurm release than the running slurmctld's. "auto" (and its old name
    "auto-pyslurm"): what GANDIVA_SLURM_BACKEND (in `env`, else the process environment) says if set; else
    pyslurm where it is installed for the release of the Slurm commands on PATH and then imports, binds and
    finds the running slurmctld of its release, the CLI backend otherwise (one bound to another cluster in
    this process included: libslurm holds one per process).
    """
    import os

    from slurm_gandiva.slurm.cli_backend import CliBackend

    if kind == "auto":
        kind = ((env or {}).get("GANDIVA_SLURM_BACKEND") or os.environ.get("GANDIVA_SLURM_BACKEND") or "auto").lower()
    if kind not in BACKEND_KINDS:
        raise ConfigError(
            f"unknown Slurm backend {kind!r} (GANDIVA_SLURM_BACKEND): use one of {', '.join(BACKEND_KINDS)}"
        )
    if kind == "cli" or (kind != "pyslurm" and not _pyslurm_fits(env)):
        return CliBackend(env, timeout=timeout)
    try:
        return _pyslurm_backend(env, timeout)
    except (ConfigError, SlurmError):
        if kind == "pyslurm":
            raise
        return CliBackend(env, timeout=timeout)


def _pyslurm_fits(env: Mapping[str, str] | None) -> bool:
    """Whether pyslurm is installed for the release of the Slurm commands on PATH: asked without importing it
    (package metadata, `scontrol --version`), since libslurm of another release may end the whole process on
    a slurm.conf it does not know."""
    import importlib.metadata
    import importlib.util
    import os
    import shutil
    import subprocess

    from slurm_gandiva.slurm.capabilities import parse_version

    if importlib.util.find_spec("pyslurm") is None:
        return False
    try:
        built = parse_version(importlib.metadata.version("pyslurm"))[:2]
        exe = shutil.which("scontrol", path=(env or {}).get("PATH") or os.environ.get("PATH"))
        if exe is None:
            return False
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
        return parse_version(out.stdout or out.stderr)[:2] == built
    except (importlib.metadata.PackageNotFoundError, SlurmError, OSError, subprocess.TimeoutExpired):
        return False


def _pyslurm_backend(env: Mapping[str, str] | None, timeout: float) -> SlurmBackend:
    """The pyslurm backend if pyslurm imports and matches the running slurmctld's release; else ConfigError
    (or SlurmError when slurmctld cannot be asked)."""
    import importlib.util

    if importlib.util.find_spec("pyslurm") is None:
        raise ConfigError("pyslurm is not installed: pip install 'slurm-gandiva[pyslurm]' (Slurm 25.11 only)")
    from slurm_gandiva.slurm.pyslurm_backend import PyslurmBackend, pyslurm_release, running_release

    backend = PyslurmBackend(env, timeout=timeout)
    built = pyslurm_release(backend._ps)
    running = running_release(backend._ps)
    if built != running[:2]:
        raise ConfigError(
            f"pyslurm is built for Slurm {built[0]}.{built[1]:02d} but slurmctld runs "
            f"{running[0]}.{running[1]:02d}.{running[2]}: use the CLI backend (GANDIVA_SLURM_BACKEND=cli)"
        )
    return backend
