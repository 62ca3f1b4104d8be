"""The contract between the controller (requeue protocol) and the job wrapper.

The job wrapper imports this module and nothing else of slurm_gandiva, so it must stay stdlib-only.
"""

from __future__ import annotations

import enum
import json
import math
import os
import signal
from dataclasses import asdict, dataclass
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
    def checkpoint_prev(self) -> Path:
        """The previous complete checkpoint, kept until a newer one is complete."""
        return self.root / "checkpoint.prev.pt"

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
        try:
            return signal.Signals(int(name))
        except ValueError:
            raise ValueError(f"unknown signal number {name}: use a name like USR2") from None
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}: use a name like USR2") from None


# Signals the controller may not suspend a job with, and why. The suspend signal must be one the wrapper
# catches and nothing else in the job uses: KILL and STOP cannot be caught; NCCL installs its own SIGUSR1
# handler; the wrapper ends the job on TERM, INT and HUP (Slurm's scancel sends TERM); Slurm resumes
# suspended jobs with CONT; the wrapper reaps its processes on CHLD; the rest report faults.
REFUSED_SIGNALS: dict[signal.Signals, str] = {
    signal.SIGKILL: "cannot be caught",
    signal.SIGSTOP: "cannot be caught",
    signal.SIGUSR1: "NCCL installs its own SIGUSR1 handler",
    signal.SIGTERM: "the wrapper ends the job on it (scancel sends it)",
    signal.SIGINT: "the wrapper ends the job on it",
    signal.SIGHUP: "the wrapper ends the job on it",
    signal.SIGCONT: "Slurm resumes suspended jobs with it",
    signal.SIGCHLD: "the wrapper's processes report their exit with it",
    **{s: "it reports a fault" for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                                          signal.SIGTRAP, signal.SIGABRT, signal.SIGSYS)},
}


def suspend_signal(name: str | None) -> signal.Signals:
    """`signal_from_name`, refusing a signal a job cannot be suspended with (ValueError, one line)."""
    sig = signal_from_name(name)
    why = REFUSED_SIGNALS.get(sig)
    if why is not None:
        raise ValueError(
            f"signal {sig.name.removeprefix('SIG')} cannot suspend a job: {why}; use USR2 (the default)"
        )
    return sig


def job_files(state_dir: str | os.PathLike[str] | None = None) -> JobFiles:
    """The job's files, from the argument or $GANDIVA_STATE_DIR."""
    d = state_dir or os.environ.get(STATE_DIR_ENV)
    if not d:
        raise ValueError(f"no state directory: set {STATE_DIR_ENV} or pass one")
    return JobFiles(Path(d))


PROGRESS_INTERVAL_ENV = "GANDIVA_PROGRESS_INTERVAL"  # seconds between progress.json updates


@dataclass(frozen=True)
class Progress:
    """What the training job reports in progress.json (replaced atomically every few seconds)."""

    step: int  # mini-batches done since the job first started (over all restarts)
    epoch: int  # current epoch (0-based)
    samples: int  # samples done since the job first started (global, all ranks)
    total_samples: int | None  # samples the whole job will do, when known
    batch_time_avg: float  # seconds per mini-batch, moving average (0.0 until measured)
    samples_per_s: float  # moving average (0.0 until measured)
    world_size: int  # training processes
    updated: float  # unix time of this report
    state: str = "running"  # "running", "suspended", "done"
    started: float | None = None  # unix time this incarnation began training (after its restore)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: object) -> Progress:
        """Parse a decoded progress.json; raises ValueError on a malformed one."""
        if not isinstance(data, dict):
            raise ValueError("progress is not a JSON object")
        try:
            total = data.get("total_samples")
            started = data.get("started")
            prog = cls(
                step=int(data["step"]),
                epoch=int(data["epoch"]),
                samples=int(data["samples"]),
                total_samples=None if total is None else int(total),
                batch_time_avg=float(data["batch_time_avg"]),
                samples_per_s=float(data["samples_per_s"]),
                world_size=int(data["world_size"]),
                updated=float(data["updated"]),
                state=str(data.get("state", "running")),
                started=None if started is None else float(started),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed progress: {exc}") from None
        numbers = (prog.batch_time_avg, prog.samples_per_s, prog.updated, prog.started or 0.0)
        if not all(math.isfinite(x) for x in numbers):
            raise ValueError("malformed progress: non-finite number")
        return prog


def write_progress(path: str | os.PathLike[str], progress: Progress) -> None:
    """Replace `path` atomically (temp file in the same directory, then rename)."""
    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_text(progress.to_json() + "\n")
    os.replace(tmp, dest)


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The job's last progress report, or None when there is none yet (or it is unreadable)."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return Progress.from_mapping(json.loads(text))
    except ValueError:  # json.JSONDecodeError is a ValueError
        return None
