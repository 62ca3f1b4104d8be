"""The contract between the controller (requeue protocol) and the job wrapper.

The job wrapper imports this module and nothing else of slurm_gandiva, so it must stay stdlib-only. It
holds the house's one atomic-write rule too (`write_atomic`), which the wrapper and the rest share.
"""

from __future__ import annotations

import enum
import glob
import json
import math
import os
import pwd
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# The controller's "please stop at the next mini-batch boundary" signal. Not SIGUSR1: NCCL claims it.
DEFAULT_SIGNAL = signal.SIGUSR2
SIGNAL_ENV = "GANDIVA_SIGNAL"  # name of the signal, e.g. "USR2"; the wrapper reads it

# Environment the job script gives the wrapper.
STATE_DIR_ENV = "GANDIVA_STATE_DIR"  # per-job directory on the shared filesystem
# When `gandiva sbatch` wrote the job (its spec's `submitted`): with $SLURM_JOB_ID the job's identity, which
# each checkpoint records; a checkpoint of another identity is refused (see job_wrapper.checkpoint).
JOB_SUBMITTED_ENV = "GANDIVA_JOB_SUBMITTED"
STATE_DIR_MODE = 0o700  # a job's state directory: its user's alone (root, the controller, reads it anyway)
FILE_MODE = 0o600  # checkpoints, progress, status and events in it
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


class StateDirError(Exception):
    """The job's state directory cannot be used safely (one line, says what to do)."""


def _owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_state_dir(path: str | os.PathLike[str], uid: int | None = None) -> Path:
    """Refuse a state directory that another user could have planted or can change: it must be a real
    directory (not a link), owned by `uid` (default: this process's), writable by it and by no one else
    (no group/other write bit). Returns the path; StateDirError with one line otherwise."""
    d = Path(path)
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise StateDirError(f"state directory {d} does not exist") from None
    except OSError as exc:
        raise StateDirError(f"cannot use state directory {d}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(f"state directory {d} is a symbolic link: refused (remove it and resubmit the job)")
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"state directory {d} is not a directory: refused (remove it and resubmit the job)")
    if st.st_uid != uid:
        raise StateDirError(
            f"state directory {d} belongs to {_owner_name(st.st_uid)}, not to {_owner_name(uid)}: refused, "
            "another user may have planted it (ask your admin to remove it, then resubmit the job)"
        )
    if st.st_mode & 0o022:
        raise StateDirError(
            f"state directory {d} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): refused "
            f"(chmod 700 {d}, or remove it and resubmit the job)"
        )
    if not os.access(d, os.W_OK | os.X_OK):
        raise StateDirError(
            f"state directory {d} is not writable (mode {stat.S_IMODE(st.st_mode):04o}, or a read-only "
            f"filesystem): chmod u+rwx {d}, or ask your admin"
        )
    return d


def ensure_state_dir(path: str | os.PathLike[str], uid: int | None = None) -> Path:
    """Create the job's state directory (mode 0700) unless it exists, then `check_state_dir` it.

    Only the directory itself is created: its parent, the jobs root, must exist (the admin makes it).
    """
    d = Path(path)
    try:
        os.mkdir(d, STATE_DIR_MODE)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise StateDirError(f"cannot create state directory {d}: {d.parent} does not exist "
                            "(ask your admin for the jobs directory)") from None
    except OSError as exc:
        raise StateDirError(f"cannot create state directory {d}: {exc.strerror or exc}") from None
    else:
        os.chmod(d, STATE_DIR_MODE)  # mkdir's mode is cut by the umask; this is exact
    return check_state_dir(d, uid)


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes | str | Callable[[int], object],
    *,
    mode: int = FILE_MODE,
    durable: bool = False,
    keep: str | os.PathLike[str] | None = None,
) -> None:
    """Replace `path` with `data` atomically: a reader sees the old file or the new one, never a part.

    The one rule for every file written whole: a temp file `.<name>.<random>.tmp` in the same directory
    (created exclusively, never through a link), given exactly `mode` whatever the umask, renamed over
    `path`. `durable` fsyncs the file before the rename and the directory after it, so the new file
    survives a crash; without it a crash may lose the new contents (one directory fsync after many
    such writes, `fsync_dir`, is the batch form). `data` may be a callable that writes the temp file's
    descriptor itself (large or streamed contents). `keep` names where the file being replaced is kept
    (`replace_atomic`). On any error the temp file is removed and `path` is as it was.
    """
    dest = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(name)
    try:
        try:
            os.fchmod(fd, mode)  # mkstemp's 0600, or the umask's cut
            if callable(data):
                data(fd)
            else:
                view = memoryview(data.encode() if isinstance(data, str) else data)
                while view:
                    view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        _commit(tmp, dest, durable, keep)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_atomic(
    tmp: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    mode: int = FILE_MODE,
    durable: bool = False,
    keep: str | os.PathLike[str] | None = None,
) -> None:
    """Rename `tmp`, written by someone else (a framework's save) in the directory of `path`, over `path`
    under `write_atomic`'s rule. `keep`: the file being replaced becomes `keep` first (a hard link, a copy
    where the filesystem has none), so `path` is never missing. On any error `tmp` is removed."""
    src = Path(tmp)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        _commit(src, Path(path), durable, keep)
    except BaseException:
        src.unlink(missing_ok=True)
        raise


def _commit(tmp: Path, dest: Path, durable: bool, keep: str | os.PathLike[str] | None) -> None:
    if keep is not None and dest.exists():
        prev = Path(keep)
        prev_tmp = prev.with_name(f".{prev.name}.{os.urandom(4).hex()}.tmp")
        try:
            try:
                os.link(dest, prev_tmp)
            except OSError:  # no hard links on this filesystem
                shutil.copyfile(dest, prev_tmp)
                os.chmod(prev_tmp, stat.S_IMODE(os.stat(dest).st_mode))
            os.replace(prev_tmp, prev)
        except BaseException:
            prev_tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, dest)
    if durable:
        fsync_dir(dest.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Temp files `write_atomic` left beside `path` (its writer was killed mid-write)."""
    dest = Path(path)
    return sorted(dest.parent.glob(f".{glob.escape(dest.name)}.*.tmp"))


def write_progress(path: str | os.PathLike[str], progress: Progress) -> None:
    """Replace `path` atomically (temp file in the same directory, then rename), mode 0600."""
    write_atomic(path, progress.to_json() + "\n")


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The job's last progress report, or None when there is none yet (or it is unreadable: not a regular
    file, a link, a FIFO, too big, not UTF-8 JSON; never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return None
        text = os.read(fd, 1 << 20).decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    try:
        return Progress.from_mapping(json.loads(text))
    except ValueError:  # json.JSONDecodeError is a ValueError
        return None
