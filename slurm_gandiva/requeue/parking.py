"""Park and unpark over Slurm (issue 31): the in-place switch between jobs that co-hold the same GPUs.

A job co-held with others on shards of its GPUs keeps its Slurm allocation while it waits its turn: the
controller asks it to park (stop at a mini-batch boundary, move its device state to host memory, wait using
no CPU) and later to unpark, through the contract's request file and signal (`contract.write_park_request`,
PARK_SIGNAL): no Slurm state changes, no new process. Each operation records its steps like the requeue
protocol's (`Op.PARK`, `Op.UNPARK`), so a controller killed between them finds out where the job is from its
own report (progress.json: "parked" / "running" with the request's seq) and goes on.

A job that does not park (or unpark) within `timeout` is escalated to the requeue path: suspended as by the
protocol's `suspend` (its signal, then root's forced requeue-hold, which ends the process), so a co-held
group never has two jobs computing for longer than the bound.

A job that reports "parked" is then frozen (SIGSTOP to every process of the job, `Step.FREEZE`): its report is
its own word, and a job that said "parked" while it went on computing would take the GPUs from the job it
co-holds them with, another user's. A stopped process computes nothing and uses no CPU; Slurm's state does not
change (it still runs, holding its shard and memory). It is thawed (SIGCONT) before its unpark request, and
before anything stops it (`thaw_if_parked`, called by the protocol's suspend).

The request file is written by root into a directory its job's user owns: it is opened component by
component from the jobs root without following a link (`write_root_file`), so that a user who swaps a
directory for a link cannot make root write anywhere else.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_gandiva.errors import JobFileError, ProtocolError
from slurm_gandiva.requeue.contract import (
    PARK_SIGNAL,
    JobFiles,
    ParkRequest,
    ParkRequestError,
    Progress,
    read_park_request,
)
from slurm_gandiva.requeue.operations import Op, OpResult, Outcome, Phase, Step, phase
from slurm_gandiva.requeue.safe_read import owner_uids, read_job_progress

if TYPE_CHECKING:
    from slurm_gandiva.requeue.protocol import RequeueProtocol, _Run
    from slurm_gandiva.slurm.base import SlurmJob

PARK_TIMEOUT_S = 30.0  # a job has this long to park or unpark before the requeue path takes over
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_root_file(jobs_root: Path, state_dir: Path, name: str, text: str, user: str) -> None:
    """Replace `state_dir/name` with `text` (root's file, mode 0644) atomically. Every directory from
    `jobs_root` down to `state_dir` is opened without following a link and must be owned by `user` or root;
    otherwise JobFileError (one line) and nothing is written."""
    try:
        rel = state_dir.relative_to(jobs_root)
    except ValueError:
        raise JobFileError(f"{state_dir} is not under the jobs root {jobs_root}") from None
    uids = owner_uids(user) | {os.geteuid()}
    fd = os.open(jobs_root, _DIR_FLAGS)
    try:
        for part in rel.parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise JobFileError(f"{state_dir} does not exist yet (the job's wrapper has not started): nothing "
                                   "to park yet") from None
            except OSError as exc:
                raise JobFileError(f"{state_dir}: cannot open {part!r} without following a link "
                                   f"({exc.strerror}); the job's owner should restore its state directory") from None
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if st.st_uid not in uids:
                raise JobFileError(f"{state_dir}: {part!r} is owned by uid {st.st_uid}, not by {user} or root")
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            try:
                os.fchmod(out, 0o644)
                os.write(out, text.encode())
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def _request(files: JobFiles, job_id: str) -> ParkRequest | None:
    """The controller's last request to the job, if the file is still its own (root's; else as if none)."""
    try:
        return read_park_request(files.park_request, owner=os.geteuid(), job_id=job_id)
    except ParkRequestError:
        return None


def _progress(files: JobFiles, user: str) -> Progress | None:
    try:
        return read_job_progress(files.progress, owner=user)
    except JobFileError:
        return None


def _state(prog: Progress | None, seq: int) -> str | None:
    """"parked" / "running" once the job has handled request `seq` (its report names it), else None."""
    if prog is None or prog.request_seq is None or prog.request_seq < seq:
        return None
    return prog.state


def park(proto: RequeueProtocol, job_id: str, *, timeout: float = PARK_TIMEOUT_S) -> OpResult:
    """Park a running job in place (Outcome.PARKED: it keeps its GPUs and computes no more). A job that does
    not park within `timeout` is suspended through the requeue path (ESCALATED, or FINISHED)."""
    return _switch(proto, job_id, Op.PARK, timeout)


def unpark(proto: RequeueProtocol, job_id: str, *, timeout: float = PARK_TIMEOUT_S) -> OpResult:
    """Let a parked job compute again (Outcome.RUNNING). A job that does not unpark within `timeout` is
    suspended through the requeue path (ESCALATED: it checkpoints from host memory, or is forced)."""
    return _switch(proto, job_id, Op.UNPARK, timeout)


def _switch(proto: RequeueProtocol, job_id: str, op: Op, timeout: float) -> OpResult:
    from slurm_gandiva.requeue.protocol import _Run  # the protocol imports this module

    run = _Run(proto, job_id, op, PARK_SIGNAL.name.removeprefix("SIG"))
    job = proto.read_job(job_id)
    if job.finished:
        return run.result(Outcome.FINISHED, detail=f"job is {job.state}")
    if phase(job) is not Phase.RUNNING:
        raise ProtocolError(f"job {job_id} is {job.state}, not running: only a running job parks or unparks")
    files = proto.files(job)
    if files is None or proto.jobs_root is None:
        raise ProtocolError(f"job {job_id}: its state directory is unknown or refused; it cannot be parked")
    action, want = ("park", "parked") if op is Op.PARK else ("unpark", "running")
    last = _request(files, job_id)
    done = (last is not None and last.action == action
            and _state(_progress(files, job.user), last.seq) == want)
    if op is Op.UNPARK:
        run.do(Step.THAW, lambda: _signal_all(proto, job_id, "CONT"))
    if done:  # a controller that died after the job handled it: nothing to do again
        for s in (Step.WRITE_REQUEST, Step.SIGNAL, Step.WAIT_SWITCH):
            run.skip(s, f"already {want} (request {last.seq if last else 0})")
        return _parked(proto, run) if op is Op.PARK else run.result(Outcome.RUNNING)
    # Grows with every request, across controller restarts (the wall clock's milliseconds).
    seq = max(math.floor(proto.wall() * 1000), (last.seq + 1) if last is not None else 0)
    jobs_root, user = proto.jobs_root, job.user

    def write() -> str:
        req = ParkRequest(action, seq, job_id, proto.wall())
        write_root_file(jobs_root, files.root, files.park_request.name, req.to_json() + "\n", user)
        return f"{action} request {seq}"

    run.do(Step.WRITE_REQUEST, write)
    proto._signal(run)

    reported: list[str | None] = [None]  # the job's own state for this request, as last read

    def handled(j: SlurmJob) -> bool:
        reported[0] = _state(_progress(files, user), seq)
        return reported[0] in (want, "done", "failed", "suspended") or phase(j) is not Phase.RUNNING

    def wait() -> str:
        j, ok = proto._wait(job_id, handled, timeout)
        if reported[0] == want:
            return f"{want} (request {seq})"
        if ok and phase(j) is Phase.RUNNING:
            return f"job reports {reported[0]}"
        return f"job is {j.state}" if ok or j.finished else f"timeout after {timeout:.0f} s"

    detail = run.do(Step.WAIT_SWITCH, wait)
    if reported[0] == want:
        return _parked(proto, run) if op is Op.PARK else run.result(Outcome.RUNNING)
    job = proto.read_job(job_id)
    if job.finished:
        return run.result(Outcome.FINISHED, detail=f"job is {job.state}")
    return _escalate(proto, run, job, f"did not {action} ({detail})")


def _signal_all(proto: RequeueProtocol, job_id: str, name: str) -> str:
    proto.backend.signal(job_id, name, batch_only=False)
    return f"SIG{name} to every process of the job"


def _parked(proto: RequeueProtocol, run: _Run) -> OpResult:
    """A job that reported "parked": frozen, so that it computes nothing whatever it does (module docstring)."""
    run.do(Step.FREEZE, lambda: _signal_all(proto, run.job_id, "STOP"))
    return run.result(Outcome.PARKED)


def thaw_if_parked(proto: RequeueProtocol, run: _Run, job: SlurmJob) -> None:
    """SIGCONT to a running job whose own report says it is parked (frozen by `park`), before it is signalled
    to stop: a stopped process would not see the signal until the requeue path's timeout forced it."""
    files = proto.files(job)
    if files is not None and parked_state(files, job.user, job.job_id) == "parked":
        run.do(Step.THAW, lambda: _signal_all(proto, job.job_id, "CONT"))


def _escalate(proto: RequeueProtocol, run: _Run, job: SlurmJob, why: str) -> OpResult:
    """The requeue path for a job that did not switch: suspended as `RequeueProtocol.suspend` does."""
    box: list[OpResult] = []

    def act() -> str:
        res = proto.suspend(job.job_id)
        box.append(res)
        return f"{why}: suspend -> {res.outcome.value}"

    run.do(Step.ESCALATE, act)
    res = box[0]
    outcome = Outcome.FINISHED if res.outcome is Outcome.FINISHED else Outcome.ESCALATED
    return run.result(outcome, detail=f"{why}; suspended through the requeue path ({res.outcome.value})")


def parked_state(files: JobFiles, user: str, job_id: str) -> str | None:
    """What the job's own report says of the controller's last request: "parked", "running" (handled), or
    None (no request, or not handled yet). For recovery after a crash between a park and its unpark."""
    last = _request(files, job_id)
    if last is None:
        return None
    return _state(_progress(files, user), last.seq)


