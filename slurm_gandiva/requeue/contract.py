"""The contract between the controller (requeue protocol) and the job wrapper.

The job wrapper imports this module and nothing else of slurm_gandiva, so it must stay stdlib-only. It
holds the house's one atomic-write rule too (`write_atomic`), which the wrapper and the rest share.

Park and unpark (the in-place switch, issue 31): the controller, as root, asks a running job to park (stop at
the next mini-batch boundary, move its device state to host memory and wait, using no CPU) or to unpark
(move it back and go on), in two steps:

1. `write_park_request(files.park_request, "park"|"unpark", seq, job_id)`: `park-request.json` in the job's
   state directory, written atomically by root, mode 0644. `seq` must grow with every request to the job (a
   request whose seq the job has already handled is ignored, so re-sending is harmless).
2. Signal the job's batch shell (the wrapper) with PARK_SIGNAL (SIGURG), e.g. `scancel --batch -s URG JOB`;
   the wrapper forwards it to its training processes, which read the request at their next boundary (or,
   parked, at once). The signal only wakes them: the file says what to do.

Each rank accepts the file only through `read_park_request`: a regular file (not a link), owned by root and
writable by no one else, of this job (`job_id` = $SLURM_JOB_ID inside Slurm). Anything else is refused (an
event `park_refused` with the reason) and the job trains on. Why SIGURG and not the suspend signal: its
default action is to be ignored, so a process that does not listen (a script without a Session, a rank still
importing torch, a DataLoader worker) is never killed by a park request, and the suspend signal's meaning
(stop, checkpoint, requeue) stays as it was; Slurm, NCCL, the wrapper and Python use SIGURG for nothing.

The job reports in progress.json (`Progress`): `state` "parked" with `parked_bytes` (bytes of model, gradient,
optimizer and buffer state the ranks now hold in host memory, summed over the ranks) and `request_seq` (the
seq of the last request handled), then "running" again after the unpark with the same `request_seq`. A
suspend signal while parked checkpoints from host memory and exits as a suspend does.
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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# The controller's "please stop at the next mini-batch boundary" signal. Not SIGUSR1: NCCL claims it.
DEFAULT_SIGNAL = signal.SIGUSR2
SIGNAL_ENV = "GANDIVA_SIGNAL"  # name of the signal, e.g. "USR2"; the wrapper reads it

# The controller's "read your park request" signal (see the module docstring): ignored by default, so harmless.
PARK_SIGNAL = signal.SIGURG
PARK_ACTIONS = ("park", "unpark")

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
    def park_request(self) -> Path:
        """Written by the controller (root) only: {"action": "park"|"unpark", "seq": N, "job_id": ...}."""
        return self.root / "park-request.json"

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
    signal.SIGURG: "the controller parks and unparks jobs with it",
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
    state: str = "running"  # "running", "parked", "suspended", "done"
    started: float | None = None  # unix time this incarnation began training (after its restore)
    parked_bytes: int | None = None  # parked: state bytes the ranks hold in host memory (all ranks)
    request_seq: int | None = None  # seq of the last park/unpark request the job handled

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
            parked, seq = data.get("parked_bytes"), data.get("request_seq")
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
                parked_bytes=None if parked is None else int(parked),
                request_seq=None if seq is None else int(seq),
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


@dataclass(frozen=True)
class ParkRequest:
    """The controller's park or unpark request (park-request.json)."""

    action: str  # "park" or "unpark"
    seq: int  # grows with every request to the job
    job_id: str | None  # the Slurm job it is for (None outside Slurm)
    time: float = 0.0  # when the controller wrote it

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class ParkRequestError(Exception):
    """A park request file refused (one line: why)."""


def write_park_request(path: str | os.PathLike[str], action: str, seq: int, job_id: str | None,
                       *, now: float | None = None) -> ParkRequest:
    """The controller's side (as root): replace the job's park-request.json (mode 0644: the job reads it,
    only its owner may change it); then signal the job with PARK_SIGNAL."""
    if action not in PARK_ACTIONS:
        raise ValueError(f"park request action {action!r}: use one of {', '.join(PARK_ACTIONS)}")
    req = ParkRequest(action, int(seq), job_id, time.time() if now is None else now)
    write_atomic(path, req.to_json() + "\n", mode=0o644)
    return req


def read_park_request(path: str | os.PathLike[str], *, owner: int = 0, job_id: str | None = None) -> ParkRequest | None:
    """The job's side: the park request in `path`, None when there is none. Refused (ParkRequestError, one
    line) unless it is a regular file, not a link, owned by `owner` (root: only the controller can park a job),
    writable by no one else, well-formed, and for `job_id` when one is given. Never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ParkRequestError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
            raise ParkRequestError(f"{path} is not a small regular file")
        if st.st_uid != owner:
            raise ParkRequestError(f"{path} belongs to {_owner_name(st.st_uid)}, not {_owner_name(owner)}")
        if st.st_mode & 0o022:
            raise ParkRequestError(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
        text = os.read(fd, 1 << 16).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ParkRequestError(f"cannot read {path}: {exc}") from None
    finally:
        os.close(fd)
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        raw_job = data.get("job_id")
        req = ParkRequest(str(data["action"]), int(data["seq"]), None if raw_job is None else str(raw_job),
                          float(data.get("time", 0.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ParkRequestError(f"{path} is malformed: {exc}") from None
    if req.action not in PARK_ACTIONS:
        raise ParkRequestError(f"{path} asks for {req.action!r}, not park or unpark")
    if job_id is not None and req.job_id != job_id:
        raise ParkRequestError(f"{path} is for job {req.job_id}, not {job_id}")
    return req
