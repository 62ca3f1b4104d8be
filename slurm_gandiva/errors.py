"""The small exception hierarchy. Every message says what to do next (one line, no traceback)."""

from __future__ import annotations


class GandivaError(Exception):
    """Base of every error a user or admin can cause; the CLI prints it as one line and exits non-zero."""

    exit_code = 1


class ConfigError(GandivaError):
    """A broken config file or option."""

    exit_code = 2


class BadRequest(GandivaError):
    """A request that can never be satisfied (more GPUs than exist, MIN > MAX, ...)."""

    exit_code = 2


class SlurmError(GandivaError):
    """Slurm refused or failed a command."""


class SlurmUnreachable(SlurmError):
    """slurmctld cannot be reached."""

    exit_code = 3


class AccountingUnavailable(SlurmError):
    """Slurm's accounting (slurmdbd) cannot be read: down, or off (AccountingStorageType=none)."""

    exit_code = 3


class PermissionDenied(SlurmError):
    """The caller may not act on this job."""

    exit_code = 4


class UnknownJob(SlurmError):
    """No such job."""

    exit_code = 5


class InvalidRequest(SlurmError):
    """Slurm rejected the request as invalid."""

    exit_code = 2


class ProtocolError(GandivaError):
    """A suspend / resume step did not complete (timeout, job gone, checkpoint missing)."""

    exit_code = 6


class LimitRefusal(ProtocolError):
    """Slurm's accounting holds a released job back (a QOS or association limit the controller had not read)."""


class TraceError(GandivaError):
    """A malformed trace file."""

    exit_code = 2


class JobFileError(GandivaError):
    """A job's own file (progress, status, spec, events) that the controller refuses to read: a link, a
    FIFO, a directory, too big, owned by someone else, or not UTF-8 JSON. Affects that job only."""


class ControllerRunning(GandivaError):
    """Another controller already holds this state (its database)."""

    exit_code = 7
