"""Reading a job's own files (progress.json, status.json, events.jsonl, the spec) as untrusted input.

The controller runs as root; every file under a job's state directory is written by the job's user, who
may replace it with anything. `read_job_bytes` opens it without following a link (the file, nor the
job's directory) and without blocking (O_NONBLOCK: a FIFO is refused, not waited on), fstat()s the open
file and accepts only a regular file owned by the job's user (or root) of bounded size. Every refusal
is a `JobFileError` with a one-line reason, so a bad file affects that job alone.

A missing file (or state directory) is not an error: it is read as None (no report yet).
Stdlib only, like the contract.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pwd
import stat
from pathlib import Path

from slurm_gandiva.errors import JobFileError
from slurm_gandiva.requeue.contract import Progress

MAX_JSON_BYTES = 1 << 20  # progress.json, status.json and spec files are a few hundred bytes
MAX_TAIL_BYTES = 1 << 20  # of an append-only file (events.jsonl), only this much of its end is read
# The largest counts and rates a progress report may hold: far above any real run (2^53: exact in a float),
# low enough that no sum or product of them overflows or loses the units.
MAX_COUNT = 1 << 53
MAX_RATE = 1e12  # samples/s
MAX_WORLD = 1 << 20  # training processes
_STATES = ("running", "parked", "suspended", "done", "failed")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def owner_uids(owner: str | int) -> frozenset[int]:
    """The uids whose files count as the job's: its user's (when known on this host) and root's."""
    if isinstance(owner, int):
        return frozenset({0, owner})
    try:
        return frozenset({0, pwd.getpwnam(owner).pw_uid})
    except KeyError:
        return frozenset({0})


def _refused(path: Path, why: str) -> JobFileError:
    return JobFileError(f"{path} {why}: refused; the job's owner should remove or rewrite it")


def _open_error(path: Path, exc: OSError) -> JobFileError:
    if exc.errno == errno.ELOOP:
        return _refused(path, "is a symbolic link (never followed)")
    if exc.errno == errno.ENXIO:
        return _refused(path, "is a socket or a device without a reader")
    if exc.errno == errno.ENOTDIR:
        return _refused(path, "is in a state directory that is not a directory (or is a link)")
    return JobFileError(f"{path}: cannot open it ({exc.strerror}); check the job's state directory")


def _open(path: Path) -> int | None:
    """An fd of `path` opened read-only without following links or blocking; None when it is missing."""
    try:
        dfd = os.open(path.parent, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _open_error(path, exc) from None
    try:
        return os.open(path.name, _FILE_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _open_error(path, exc) from None
    finally:
        os.close(dfd)


def read_job_bytes(
    path: str | os.PathLike[str], *, owner: str | int | None, max_bytes: int = MAX_JSON_BYTES, tail: bool = False
) -> bytes | None:
    """The bytes of a job's file, or None when it does not exist; JobFileError when it is refused.

    `owner` is the job's user (name or uid); root's files are accepted too (None: any owner, for a
    caller reading its own files, never for root). A file larger than `max_bytes` is refused, or with
    `tail` only its last `max_bytes` are read (from the first whole line).
    """
    p = Path(path)
    fd = _open(p)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = next((w for test, w in _KINDS if test(st.st_mode)), "not a regular file")
            raise _refused(p, f"is {what}")
        if owner is not None and st.st_uid not in owner_uids(owner):
            raise _refused(p, f"is owned by uid {st.st_uid}, not by the job's user {owner} (or root)")
        start = 0
        if st.st_size > max_bytes:
            if not tail:
                raise _refused(p, f"is {st.st_size} bytes, more than the {max_bytes} a job file may have")
            start = st.st_size - max_bytes
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.pread(fd, min(65536, max_bytes + 1 - got), start + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        cut = start > 0
        if len(data) > max_bytes:
            if not tail:
                raise _refused(p, f"grew past the {max_bytes} bytes a job file may have")
            data, cut = data[-max_bytes:], True
        return data.partition(b"\n")[2] if cut else data  # a cut first line is dropped
    finally:
        os.close(fd)


def read_job_text(path: str | os.PathLike[str], *, owner: str | int | None, max_bytes: int = MAX_JSON_BYTES,
                  tail: bool = False) -> str | None:
    """`read_job_bytes` decoded as UTF-8 (JobFileError when it is not)."""
    data = read_job_bytes(path, owner=owner, max_bytes=max_bytes, tail=tail)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refused(Path(path), "is not UTF-8 text") from None


def read_job_json(path: str | os.PathLike[str], *, owner: str | int | None, max_bytes: int = MAX_JSON_BYTES) -> object:
    """The decoded JSON of a job's file, or None when the file does not exist (JobFileError if refused)."""
    text = read_job_text(path, owner=owner, max_bytes=max_bytes)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        raise _refused(Path(path), f"is not JSON ({why})") from None


def read_job_progress(path: str | os.PathLike[str], *, owner: str | int) -> Progress | None:
    """The job's progress.json, or None when there is none yet; JobFileError when it is refused or malformed."""
    data = read_job_json(path, owner=owner)
    if data is None:
        return None
    try:
        prog = Progress.from_mapping(data)
    except (ValueError, OverflowError) as exc:
        raise _refused(Path(path), f"is {exc}") from None
    why = progress_problem(prog)
    if why is not None:
        raise _refused(Path(path), f"is malformed progress: {why}")
    return prog


def progress_problem(prog: Progress) -> str | None:
    """Why a parsed progress report cannot be believed (a number not finite, negative or absurd, an unknown
    state), or None. The whole report is refused: it affects that job alone."""
    counts = {"step": prog.step, "epoch": prog.epoch, "samples": prog.samples, "total_samples": prog.total_samples}
    for name, n in counts.items():
        if n is not None and not 0 <= n <= MAX_COUNT:
            return f"{name} = {n} is not a count between 0 and {MAX_COUNT}"
    rates = {"samples_per_s": (prog.samples_per_s, MAX_RATE), "batch_time_avg": (prog.batch_time_avg, MAX_RATE)}
    for name, (x, top) in rates.items():
        if not (math.isfinite(x) and 0.0 <= x <= top):
            return f"{name} = {x} is not a finite number between 0 and {top:g}"
    if not 0 <= prog.world_size <= MAX_WORLD:
        return f"world_size = {prog.world_size} is not between 0 and {MAX_WORLD}"
    for name, t in (("updated", prog.updated), ("started", prog.started)):
        if t is not None and not (math.isfinite(t) and 0.0 <= t <= 1e11):
            return f"{name} = {t} is not a unix time"
    if prog.state not in _STATES:
        return f"state {prog.state[:40]!r} is not one of {', '.join(_STATES)}"
    return None


def read_job_outcome(path: str | os.PathLike[str], *, owner: str | int) -> str | None:
    """The "outcome" of the job's status.json ("done", "suspended", "failed"), None when there is none."""
    data = read_job_json(path, owner=owner)
    out = data.get("outcome") if isinstance(data, dict) else None
    return out if isinstance(out, str) else None
