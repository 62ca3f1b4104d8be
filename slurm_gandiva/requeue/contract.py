"""The contract between the controller (requeue protocol) and the job wrapper.

The job wrapper imports this module and nothing else of slurm_gandiva, so it must stay stdlib-only.
"""

from __future__ import annotations

import enum
import os
import signal
from dataclasses import dataclass
from pathlib import Path

# The controller's "please stop at the next mini-batch boundary" signal. Not SIGUSR1: NCCL claims it.
DEFAULT_SIGNAL = signal.SIGUSR2
SIGNAL_ENV = "GANDIVA_SIGNAL"  # name of the signal, e.g. "USR2"; the wrapper reads it

# Environment the job script gives the wrapper.
STATE_DIR_ENV = "GANDIVA_STATE_DIR"  # per-job directory on the shared filesystem
JOB_MARK = "gandiva"  # value of the Slurm job comment that marks a job the controller owns


class ExitCode(enum.IntEnum):
    """How the wrapper (and the batch script) exit; the controller reads these."""

    DONE = 0  # training finished
    FAILED = 1  # the training command failed
    SUSPENDED = 75  # checkpointed cleanly and asked Slurm for a held requeue (EX_TEMPFAIL)
    USAGE = 64  # the wrapper was called wrongly (EX_USAGE)


@dataclass(frozen=True)
class JobFiles:
    """Where one job's wrapper keeps its files, under the job's state directory."""

    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.pt"

    @property
    def progress(self) -> Path:
        return self.root / "progress.json"

    @property
    def status(self) -> Path:
        """Written by the wrapper as it exits: {"outcome": "done"|"suspended"|"failed", ...}."""
        return self.root / "status.json"

    @property
    def events(self) -> Path:
        """Append-only JSON lines the wrapper writes (signal received, checkpoint written, exit)."""
        return self.root / "events.jsonl"


def signal_from_name(name: str | None) -> signal.Signals:
    """Parse "USR2", "SIGUSR2" or "12" into a signal; None gives the default."""
    if not name:
        return DEFAULT_SIGNAL
    name = name.strip().upper()
    if name.isdigit():
        return signal.Signals(int(name))
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}: use a name like USR2 or TERM") from None


def job_files(state_dir: str | os.PathLike[str] | None = None) -> JobFiles:
    """The job's files, from the argument or $GANDIVA_STATE_DIR."""
    d = state_dir or os.environ.get(STATE_DIR_ENV)
    if not d:
        raise ValueError(f"no state directory: set {STATE_DIR_ENV} or pass one")
    return JobFiles(Path(d))
