"""Where a managed job's files are: a private directory per submission, which no other user can squat.

`gandiva sbatch`, as the submitting user, makes one directory per submission directly under the jobs root
(world-writable and sticky, like /tmp) with mkdtemp: created exclusively under a name no one can guess
(`<user>.<random>`), mode 0700, owned by the user. It names it in the job's Slurm comment,
`gandiva:<name>`, which job_submit.lua lets no owner change. In it are the state directory of the job (or
of each array task "ARRAY_TASK"), `<name>/<job id>/`, and its spec, `<name>/<job id>.json`.

The controller accepts the directory only if it is a real directory (not a link) directly under the jobs
root, owned by the job's user (uid), writable by no one else; otherwise that job alone waits, held, with
the reason. A job marked plain `gandiva` (submitted before this layout) keeps the old shared one:
`<jobs root>/<job id>` and `<jobs root>/spec/<job id>.json`.

Stdlib only (and the project's errors).
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slurm_gandiva.errors import JobFileError
from slurm_gandiva.requeue.contract import JOB_MARK, STATE_DIR_MODE
from slurm_gandiva.requeue.spec import SPEC_DIR, spec_file, spec_path

MARK_SEP = ":"  # the comment of a job with a private directory: gandiva:<name>
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # one path component, never "." or ".."
_USER_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def job_comment(private: str) -> str:
    """The Slurm comment that marks a job and names its private directory."""
    return f"{JOB_MARK}{MARK_SEP}{private}"


def is_marked(comment: str) -> bool:
    """Whether a Slurm comment marks a job the controller owns (`gandiva`, or `gandiva:<name>`)."""
    c = comment.strip()
    return c == JOB_MARK or c.startswith(JOB_MARK + MARK_SEP)


def private_name(comment: str) -> str | None:
    """The private directory a marked comment names; None for the old plain mark (or no mark)."""
    c = comment.strip()
    return c[len(JOB_MARK) + 1 :] if c.startswith(JOB_MARK + MARK_SEP) else None


def make_private_dir(jobs_root: str | os.PathLike[str], user: str) -> Path:
    """Create this submission's private directory under the jobs root (exclusively, an unguessable name,
    mode 0700 exactly, owned by the caller); OSError when it cannot be made. Never follows a link: the
    name is new, and mkdir does not create through one."""
    prefix = _USER_SAFE.sub("_", user)[:32] or "user"
    d = Path(tempfile.mkdtemp(prefix=f"{prefix}.", dir=jobs_root))
    os.chmod(d, STATE_DIR_MODE)  # mkdtemp's 0700 cut by the umask; this is exact
    return d


def check_private_dir(jobs_root: str | os.PathLike[str], name: str, uid: int) -> Path:
    """The private directory `name` under the jobs root, if it is safe for a job of `uid`: one path
    component, a real directory (lstat: not a link), owned by `uid`, no group/other write bit.
    JobFileError (one line) otherwise."""
    if not _NAME.match(name) or name == SPEC_DIR:
        raise JobFileError(f"the job's comment names {name!r}, not a gandiva directory: refused; resubmit the "
                           "job with gandiva sbatch")
    d = Path(jobs_root) / name
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise JobFileError(f"the job's directory {d} does not exist: resubmit the job with gandiva sbatch") from None
    except OSError as exc:
        raise JobFileError(f"cannot use the job's directory {d}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):  # a link is S_IFLNK under lstat
        raise JobFileError(f"the job's directory {d} is not a directory (a link?): refused; resubmit the job")
    if st.st_uid != uid:
        raise JobFileError(f"the job's directory {d} belongs to uid {st.st_uid}, not to the job's user (uid "
                           f"{uid}): refused; resubmit the job with gandiva sbatch")
    if st.st_mode & 0o022:
        raise JobFileError(f"the job's directory {d} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                           f"refused; chmod 700 {d}")
    return d


@dataclass(frozen=True)
class JobPaths:
    """Where one managed job's state directory and spec file are."""

    state_dir: Path
    spec: Path


def job_paths(jobs_root: str | os.PathLike[str], job_id: str, comment: str, user: str) -> JobPaths:
    """The job's paths from its Slurm comment: in its private directory (checked as `check_private_dir`,
    for the uid of `user`), else the old shared layout. JobFileError (one line) when refused."""
    root = Path(jobs_root)
    name = private_name(comment)
    if name is None:
        try:
            return JobPaths(root / job_id, spec_path(root, job_id))
        except ValueError as exc:
            raise JobFileError(f"{exc}: a spec is named after its Slurm job id") from None
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise JobFileError(f"user {user!r} is unknown on the controller's host: its job's directory "
                           "cannot be checked; ask your admin") from None
    d = check_private_dir(root, name, uid)
    try:
        spec = spec_file(d, job_id)
    except ValueError as exc:
        raise JobFileError(f"{exc}: a spec is named after its Slurm job id") from None
    return JobPaths(d / job_id, spec)



def old_layout_note(jobs_root: str | os.PathLike[str]) -> str | None:
    """One line for `gandiva controller --check` when the jobs root still holds the old shared spec
    directory (any user can delete or plant specs there); None when it does not."""
    old = Path(jobs_root) / SPEC_DIR
    if not os.path.lexists(old):
        return None
    return (f"warning: {old} is the old shared spec directory, which other users can change: gandiva sbatch no "
            "longer writes there (each submission has a private directory); once no job submitted before the "
            f"upgrade is waiting (gandiva squeue), remove it: rm -r {old}")
