"""The suspend / resume / migrate / resize protocol over Slurm's held requeue.

suspend: signal the batch shell -> the wrapper checkpoints at a mini-batch boundary, writes status.json and
requeue-holds its own job -> wait for PENDING+held -> turn the owner's hold into an admin hold.
resume: (admin-hold a free-floating pending job) -> set node list and per-GPU typed gres -> clear the
requeue begin-time delay -> release -> wait for RUNNING -> verify Slurm gave exactly the chosen GPUs.

Every operation looks at where the job is first (`phase`) and skips the steps already done, so a caller
that died half-way can simply run the same operation again.

Where Slurm merges a gres update into the job's earlier request (22.05), the CLI backend clears the old
request first, so whole GPUs are replaced exactly; there shards cannot be cleared and a job cannot switch
between gpu and shard (see `gres_plan.plan_gres`). What the running Slurm does is `backend.capabilities()`.
The operations' types (results, steps, phases) are in operations.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slurm_gandiva.errors import (
    InvalidRequest,
    JobFileError,
    LimitRefusal,
    PermissionDenied,
    ProtocolError,
    SlurmError,
    UnknownJob,
)
from slurm_gandiva.model import Placement
from slurm_gandiva.requeue import parking
from slurm_gandiva.requeue.contract import JobFiles
from slurm_gandiva.requeue.gres_plan import check_placement, gres_kind, gres_refusal, node_fields, plan_gres
from slurm_gandiva.requeue.namespace import job_paths
from slurm_gandiva.requeue.operations import (
    Journal,
    Op,
    OpResult,
    Outcome,
    Phase,
    Step,
    StepEvent,
    StepEventKind,
    StepRecord,
    is_held,
    phase,
    placement_of,
)
from slurm_gandiva.requeue.parking import PARK_TIMEOUT_S
from slurm_gandiva.requeue.safe_read import read_job_outcome
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SlurmJob
from slurm_gandiva.slurm.coalesce import CoalescedReads


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def _read_outcome(path: Path, owner: str) -> str | None:
    """The wrapper's outcome in status.json, None when there is none or the file is refused (a file its
    user can write is untrusted input: `safe_read`)."""
    try:
        return read_job_outcome(path, owner=owner)
    except JobFileError:
        return None


class _Run:
    """Bookkeeping of one operation: records steps and feeds the journal."""

    def __init__(self, proto: RequeueProtocol, job_id: str, op: Op, signal: str | None = None) -> None:
        self.proto = proto
        self.job_id = job_id
        self.op = op
        self.signal = signal or proto.signal_name  # what stops the job (suspend and moves)
        self.steps: list[StepRecord] = []
        # The job as read once it was admin-held: nothing but the controller changes it after that, so the
        # resume half of a move starts from it instead of reading it again.
        self.held: SlurmJob | None = None
        # Wall time just after the first read that showed the job stopped (requeued): Slurm revoked its
        # credential before that read was answered, so the credential guard counts from here, not from the
        # end of the operation (the checkpoint wait and the admin hold that follow can cross a second).
        self.stopped_at: float | None = None

    def _emit(self, step: Step, kind: StepEventKind, seconds: float = 0.0, detail: str = "") -> None:
        if self.proto.journal is not None:
            self.proto.journal(StepEvent(self.job_id, self.op, step, kind, seconds, detail))

    def skip(self, step: Step, detail: str) -> None:
        self.steps.append(StepRecord(step, 0.0, detail, skipped=True))
        self._emit(step, StepEventKind.SKIP, 0.0, detail)

    def do(self, step: Step, action: Callable[[], str]) -> str:
        """Run `action` as `step`; its return value is the step's detail."""
        self._emit(step, StepEventKind.START)
        t0 = self.proto.clock()
        try:
            detail = action()
        except BaseException as exc:
            secs = self.proto.clock() - t0
            self.steps.append(StepRecord(step, secs, f"error: {exc}"))
            self._emit(step, StepEventKind.END, secs, f"error: {exc}")
            raise
        secs = self.proto.clock() - t0
        self.steps.append(StepRecord(step, secs, detail))
        self._emit(step, StepEventKind.END, secs, detail)
        return detail

    def result(
        self,
        outcome: Outcome,
        placement: Placement | None = None,
        detail: str = "",
        rest: Callable[[], OpResult] | None = None,
    ) -> OpResult:
        return OpResult(self.job_id, self.op, outcome, tuple(self.steps), placement, detail, rest)


# Seconds of clock skew between the controller, slurmctld and slurmd hosts that the credential guard allows
# for (see RequeueProtocol); NTP keeps a cluster's clocks within milliseconds.
CREDENTIAL_MARGIN_S = 0.25
# A job held back by a begin time is released this long before it, so that slurmctld's next tick runs it.
RELEASE_LEAD_S = 0.2
# slurmctld's periodic pass runs at each whole second, but reads the time with time(), the kernel's coarse
# clock, which is a few milliseconds behind then: the pass at the begin time's own second mostly still sees
# the second before and skips the job, and no pass follows until something asks for one (the backfill pass,
# bf_interval: 30 s by default). So a job not running this long after its begin time gets a no-op update
# (starttime=now: a successful update asks for the next pass), again every NUDGE_EVERY_S while it waits.
NUDGE_AFTER_S = 0.05
NUDGE_EVERY_S = 1.0


class RequeueProtocol:
    """Suspend, resume, migrate and resize jobs through Slurm's held requeue.

    Must run as root / SlurmUser (admin holds, updates of other users' jobs). A job is stopped with the signal
    its operation names (the one it catches), else with `signal_name`. `jobs_root` is the directory
    that holds each job's state directory (see `namespace.job_paths`); with it, suspend also checks the wrapper's
    status.json. `clock` and `sleep` are injected (monotonic seconds); `wall` is the wall clock Slurm's
    job credentials are dated by.

    The slurmd of a node where a job's incarnation was killed revokes its credential and refuses a new
    launch there whose credential is dated (in whole seconds) no later than the revocation; slurmctld then
    fails the job for good ("Job credential revoked"). So a job that goes back to a node it just left gets a
    begin time in the first whole second after it was seen stopped (`credential_margin` allows for clock
    skew); other nodes never saw its credential, and a move there may begin at once. Slurm itself delays
    requeued jobs by cred_expire (120 s); the protocol sets that begin time instead.
    """

    def __init__(
        self,
        backend: SlurmBackend,
        *,
        signal_name: str = "USR2",
        suspend_timeout: float = 120.0,
        start_timeout: float = 60.0,
        requeue_timeout: float = 30.0,
        checkpoint_grace: float = 5.0,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        journal: Journal | None = None,
        jobs_root: str | os.PathLike[str] | None = None,
        wall: Callable[[], float] = time.time,
        credential_margin: float = CREDENTIAL_MARGIN_S,
        reads: CoalescedReads | None = None,
    ) -> None:
        self.backend = backend
        # Several operations at once (the actor's threads) share one query per poll instead of one each.
        self.read_job: Callable[[str], SlurmJob] = reads.job if reads is not None else backend.job
        self.wall = wall
        self.credential_margin = credential_margin
        # job id -> (wall time its last incarnation was seen stopped, the nodes it ran on; empty: unknown)
        self._stopped: dict[str, tuple[float, frozenset[str]]] = {}
        self.signal_name = signal_name
        self.suspend_timeout = suspend_timeout
        self.start_timeout = start_timeout
        self.requeue_timeout = requeue_timeout
        self.checkpoint_grace = checkpoint_grace
        self.poll_interval = poll_interval
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.jobs_root = Path(jobs_root) if jobs_root is not None else None

    # -- queries -----------------------------------------------------------------------------------

    def phase(self, job: SlurmJob) -> Phase:
        """Where `job` is in the cycle (see `Phase`)."""
        return phase(job)

    def files(self, job: SlurmJob) -> JobFiles | None:
        """The job's files, where its comment says (`namespace.job_paths`); None when refused or unknown."""
        if self.jobs_root is None:
            return None
        try:
            return JobFiles(job_paths(self.jobs_root, job.job_id, job.comment, job.user).state_dir)
        except JobFileError:
            return None

    def _wait(
        self,
        job_id: str,
        done: Callable[[SlurmJob], bool],
        timeout: float,
        between: Callable[[], None] | None = None,
    ) -> tuple[SlurmJob, bool]:
        """Poll the job until `done` or a finished state; returns the last view and whether it got there.
        `between` runs after each read that is not the last."""
        deadline = self.clock() + timeout
        while True:
            job = self.read_job(job_id)
            if done(job) or job.finished:
                return job, done(job)
            if self.clock() >= deadline:
                return job, False
            if between is not None:
                between()
            self.sleep(self.poll_interval)

    # -- suspend -----------------------------------------------------------------------------------

    def suspend(self, job_id: str, *, signal: str | None = None) -> OpResult:
        """Stop a job at a mini-batch boundary into an admin-held requeue.

        A running job is signalled (`signal`, else `signal_name`); if it has not requeue-held itself within
        `suspend_timeout`, root requeue-holds it (Outcome.ESCALATED: progress since its last checkpoint is
        lost). A pending job is just held. A job that finishes instead is reported as Outcome.FINISHED.
        """
        run = _Run(self, job_id, Op.SUSPEND, signal)
        return self._suspend(run)

    def _suspend(self, run: _Run) -> OpResult:
        job_id = run.job_id
        job = self.read_job(job_id)
        ph = phase(job)
        if ph is Phase.FINISHED:
            return run.result(Outcome.FINISHED, detail=f"job is {job.state}")
        if ph is Phase.REQUEUED:
            run.stopped_at = self.wall()
        outcome = Outcome.SUSPENDED
        # An incarnation stops now (or just did: the wrapper requeue-held itself) on these nodes.
        stops = frozenset(job.nodes) if ph in (Phase.RUNNING, Phase.STOPPING, Phase.REQUEUED) else None
        files = self.files(job)
        before = _file_id(files.status) if files is not None else None
        signalled = False
        if ph is Phase.RUNNING:
            parking.thaw_if_parked(self, run, job)
            self._signal(run)
            signalled = True
            # The wait's first read is the one that tells whether the job finished as the signal came.
            job, ok = self._wait_requeue(run, self.suspend_timeout)
            if job.finished:
                return self._finished(run, job, files, before)
            if not ok:
                job = self._escalate(run)
                if job.finished:
                    return run.result(Outcome.FINISHED, detail=f"job is {job.state}")
                outcome = Outcome.ESCALATED
        elif ph is Phase.STOPPING:
            run.skip(Step.SIGNAL, f"job is {job.state}: already stopping")
            job, ok = self._wait_requeue(run, self.requeue_timeout)
            if job.finished:
                return self._finished(run, job, files, before)
            if not ok:
                raise ProtocolError(
                    f"job {job_id} stayed {job.state} for {self.requeue_timeout:.0f} s; check slurmctld's log"
                )
        else:
            run.skip(Step.SIGNAL, f"job is {ph.value}: not running")
            run.skip(Step.WAIT_REQUEUE, f"job is {ph.value}")
        if signalled and outcome is Outcome.SUSPENDED and files is not None:
            status = self._wait_checkpoint(run, files, before, job.user)
            if status in ("done", "failed"):
                # Finished as the signal came; Slurm still shows it held only if the wrapper requeued it.
                job = self.read_job(job_id)
                if job.finished:
                    return run.result(Outcome.FINISHED, detail=f"wrapper reported {status}")
        elif files is None:
            run.skip(Step.WAIT_CHECKPOINT, "no jobs root given: status.json not checked")
        elif outcome is Outcome.ESCALATED:
            run.skip(Step.WAIT_CHECKPOINT, "escalated: no clean checkpoint")
        else:
            run.skip(Step.WAIT_CHECKPOINT, "not signalled")
        self._admin_hold(run, job)
        now = self.wall()
        # Only stops younger than the guard matter; a long-running controller must not keep them all.
        self._stopped = {j: v for j, v in self._stopped.items() if self._begin_after(v[0]) > now}
        if stops is not None:
            self._stopped[job_id] = (run.stopped_at if run.stopped_at is not None else now, stops)
        detail = ""
        if outcome is Outcome.ESCALATED:
            detail = (
                f"did not stop within {self.suspend_timeout:.0f} s of the signal; forced a requeue-hold: "
                "progress since its last checkpoint is lost"
            )
        return run.result(outcome, detail=detail)

    def _signal(self, run: _Run) -> None:
        """Signal the batch shell; retries while Slurm refuses because the job is still starting."""
        deadline = self.clock() + self.requeue_timeout

        def act() -> str:
            while True:
                try:
                    self.backend.signal(run.job_id, run.signal, batch_only=True)
                    return f"SIG{run.signal.upper().removeprefix('SIG')} to the batch shell"
                except (PermissionDenied, UnknownJob):
                    raise
                except SlurmError as exc:
                    job = self.read_job(run.job_id)
                    if job.finished or phase(job) is not Phase.RUNNING:
                        return f"not sent: job is {job.state}"
                    if self.clock() >= deadline:
                        raise ProtocolError(f"cannot signal job {run.job_id}: {exc}") from exc
                    self.sleep(self.poll_interval)

        run.do(Step.SIGNAL, act)

    def _wait_requeue(self, run: _Run, timeout: float) -> tuple[SlurmJob, bool]:
        box: list[tuple[SlurmJob, bool]] = []

        def held(j: SlurmJob) -> bool:
            return j.pending and is_held(j)

        def act() -> str:
            job, ok = self._wait(run.job_id, held, timeout)
            box.append((job, ok))
            if ok:
                run.stopped_at = self.wall()
                return f"PENDING, {job.reason}"
            if job.finished:
                return f"finished: {job.state}"
            return f"timeout after {timeout:.0f} s: {job.state} ({job.reason})"

        run.do(Step.WAIT_REQUEUE, act)
        return box[0]

    def _escalate(self, run: _Run) -> SlurmJob:
        box: list[SlurmJob] = []

        def act() -> str:
            job = self.read_job(run.job_id)
            if phase(job) is Phase.RUNNING:
                try:
                    self.backend.requeue_hold(run.job_id)
                except SlurmError:
                    job = self.read_job(run.job_id)
                    if not (job.finished or (job.pending and is_held(job))):
                        raise
            job, ok = self._wait(run.job_id, lambda j: j.pending and is_held(j), self.requeue_timeout)
            box.append(job)
            if ok:
                run.stopped_at = self.wall()
            if job.finished:
                return f"finished: {job.state}"
            if not ok:
                raise ProtocolError(
                    f"job {run.job_id} is still {job.state} after a forced requeue-hold; "
                    "check slurmctld's log and cancel it if it hangs"
                )
            return "forced requeue-hold (root): progress since the last checkpoint is lost"

        run.do(Step.ESCALATE, act)
        return box[0]

    def _wait_checkpoint(
        self, run: _Run, files: JobFiles, before: tuple[int, int] | None, owner: str
    ) -> str | None:
        box: list[str | None] = []

        def act() -> str:
            deadline = self.clock() + self.checkpoint_grace
            while True:
                now_id = _file_id(files.status)
                fresh = now_id is not None and now_id != before
                outcome = _read_outcome(files.status, owner) if fresh else None
                if outcome is not None or self.clock() >= deadline:
                    break
                self.sleep(self.poll_interval)
            box.append(outcome)
            if outcome is None:
                return f"no fresh {files.status.name}: the wrapper did not report a clean suspend"
            ck = "checkpoint present" if files.checkpoint.exists() else "no checkpoint file"
            return f"wrapper reported {outcome}, {ck}"

        run.do(Step.WAIT_CHECKPOINT, act)
        return box[0]

    def _finished(self, run: _Run, job: SlurmJob, files: JobFiles | None, before: tuple[int, int] | None) -> OpResult:
        status = None
        if files is not None and _file_id(files.status) != before:
            status = _read_outcome(files.status, job.user)
        detail = f"job is {job.state}" + (f", wrapper reported {status}" if status else "")
        return run.result(Outcome.FINISHED, detail=detail)

    def _admin_hold(self, run: _Run, job: SlurmJob) -> None:
        if job.hold is HoldKind.ADMIN:
            run.held = job
            run.skip(Step.ADMIN_HOLD, "already admin-held")
            return

        def act() -> str:
            self.backend.hold(run.job_id)
            j = self.read_job(run.job_id)
            run.held = j
            if j.hold is not HoldKind.ADMIN and not j.finished:
                raise ProtocolError(
                    f"job {run.job_id} is not admin-held after scontrol hold ({j.reason}); "
                    "run this as root or the SlurmUser"
                )
            return f"admin hold ({j.reason})"

        run.do(Step.ADMIN_HOLD, act)

    # -- resume ------------------------------------------------------------------------------------

    def resume(
        self,
        job_id: str,
        placement: Placement,
        *,
        until_free: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        """Start a held job (suspended, or never started) on exactly `placement` and wait until it runs.

        `until_free`: the placement's GPUs are still held by jobs that are being stopped. The job is set up
        and released at once (Slurm holds it back until those GPUs are free, and starts it in the pass that
        the last one's completion runs), then `until_free()` blocks until they have stopped and raises if
        one of them will not; the job is then held again (unless it already runs) and the error passes on.
        The start timeout counts from when `until_free` returns.

        `defer`: return STARTING once nothing but Slurm's start is left, the result's `rest()` waiting for
        it (and returning the final result): when the job must wait for a begin time ahead (its old
        credential on the placement's nodes, see the class docstring) and no `until_free`, once it is set up,
        still held (`rest()` releases it just before that time); else once it is released and its GPUs are
        free."""
        return self._resume(_Run(self, job_id, Op.RESUME), placement, until_free, defer=defer)

    def _resume(
        self,
        run: _Run,
        placement: Placement,
        until_free: Callable[[], None] | None = None,
        known: SlurmJob | None = None,
        *,
        defer: bool = False,
    ) -> OpResult:
        check_placement(placement)
        job_id = run.job_id
        job = known if known is not None else self.read_job(job_id)
        ph = phase(job)
        if ph is Phase.FINISHED:
            return run.result(Outcome.FINISHED, detail=f"job is {job.state}")
        if ph is Phase.RUNNING:
            current = placement_of(job)
            if current == placement:
                for s in (Step.SET_PLACEMENT, Step.CLEAR_BEGIN, Step.RELEASE, Step.WAIT_RUNNING, Step.VERIFY):
                    run.skip(s, "already running there")
                return run.result(Outcome.RUNNING, placement)
            raise ProtocolError(f"job {job_id} is running on {current}: suspend it first, or use migrate / resize")
        if ph is Phase.STOPPING:
            raise ProtocolError(f"job {job_id} is {job.state}: suspend it (or wait) before resuming")
        node = ",".join(placement.nodes)
        kind = gres_kind(job.tres_per_node)
        gres = plan_gres(job, placement, self.backend.capabilities())
        if ph is Phase.RELEASED:
            # Freeze it so Slurm cannot start it on the old request between the updates below.
            self._admin_hold(run, job)

        begin = self._credential_begin(job, placement)
        # Without a credential to wait for, the begin time requeue left goes in the placement's own update
        # (one scontrol call fewer before the release); a begin time in the future is set just before the
        # release, as scontrol counts now+N from its own clock.
        at_once = {"starttime": "now"} if begin is None else {}

        def set_placement() -> str:
            try:
                self.backend.update(job_id, **node_fields(placement, job), gres=gres, **at_once)
            except InvalidRequest as exc:
                if "gres" not in str(exc).lower() and "generic resource" not in str(exc).lower():
                    raise
                raise ProtocolError(gres_refusal(job_id, kind, placement, str(exc))) from exc
            return f"nodelist={node} gres={gres}" + (" starttime=now" if begin is None else "")

        run.do(Step.SET_PLACEMENT, set_placement)
        self._stopped.pop(job_id, None)

        def clear_begin(lapse: int) -> str:
            # scontrol (or libslurm) adds N to its own whole-second now, at least floor(now) here.
            later = max(0, lapse - math.floor(self.wall()))
            when = f"now+{later}" if later else "now"
            self.backend.update(job_id, starttime=when)
            return f"starttime={when}" + (f" (the old job credential on {node} lapses then)" if later else "")

        if begin is None:
            run.skip(Step.CLEAR_BEGIN, "starttime=now, set with the placement")
        else:
            run.do(Step.CLEAR_BEGIN, functools.partial(clear_begin, begin))
        if defer and begin is not None and until_free is None:
            # Nothing but the clock stands between the job and its start: the caller need not wait for it.
            start = functools.partial(self._start, run, placement, begin, None)
            return run.result(Outcome.STARTING, placement, f"held until just before its begin time {begin}", start)
        return self._start(run, placement, begin, until_free, defer=defer)

    def _start(
        self,
        run: _Run,
        placement: Placement,
        begin: int | None,
        until_free: Callable[[], None] | None,
        *,
        defer: bool = False,
    ) -> OpResult:
        """The end of a resume, from a job set up on `placement`: release, (`until_free`), wait until it runs,
        verify. `defer`: return STARTING once it is released and its GPUs are free, `rest` waiting for it."""
        run.do(Step.RELEASE, functools.partial(self._release, run.job_id, begin))
        if until_free is not None:
            self._until_free(run, until_free)
        rest = functools.partial(self._run_up, run, placement, begin)
        if defer:
            return run.result(Outcome.STARTING, placement, "released: Slurm starts it in its next pass", rest)
        return rest()

    def _release(self, job_id: str, begin: int | None) -> str:
        # slurmctld runs the pass a release asks for at its next whole-second tick: a release long before
        # the begin time would spend that pass and wait for the next periodic one instead.
        early = begin - RELEASE_LEAD_S - self.wall() if begin is not None else 0.0
        if early > 0:
            self.sleep(early)
        self.backend.release(job_id)
        return f"released ({early:.2f} s before, just ahead of its begin time)" if early > 0 else "released"

    def _run_up(self, run: _Run, placement: Placement, begin: int | None) -> OpResult:
        """Wait until a released job runs (asking slurmctld for a pass when one is missed), then verify that
        Slurm gave it exactly `placement`."""
        job_id = run.job_id

        box: list[SlurmJob] = []
        nudges = [0]
        next_nudge = [begin + NUDGE_AFTER_S if begin is not None else math.inf]

        def nudge() -> None:
            if self.wall() < next_nudge[0]:
                return
            next_nudge[0] = self.wall() + NUDGE_EVERY_S
            with contextlib.suppress(SlurmError):  # it may have started meanwhile
                self.backend.update(job_id, starttime="now")
                nudges[0] += 1

        def wait_running() -> str:
            # A limit of Slurm's accounting lifts only when usage or the limits change: no use waiting for it.
            j, ok = self._wait(job_id, lambda j: phase(j) is Phase.RUNNING or j.accounting_limited,
                               self.start_timeout, nudge)
            box.append(j)
            if ok and not j.accounting_limited:
                asked = f" (after {nudges[0]} no-op update(s) to ask slurmctld for a pass)" if nudges[0] else ""
                return f"RUNNING on {','.join(j.nodes)}{asked}"
            if j.finished:
                return f"finished: {j.state}"
            # Do not leave it free to start later where the controller no longer expects it.
            with contextlib.suppress(SlurmError):
                self.backend.hold(job_id)
            if ok:
                raise LimitRefusal(
                    f"job {job_id}: Slurm's accounting holds it back ({j.reason}: a QOS or association limit); "
                    "it is held again until the controller has read the limits"
                )
            raise ProtocolError(
                f"job {job_id} did not start within {self.start_timeout:.0f} s (still {j.state}, {j.reason}); "
                "it is held again: free those GPUs or pick others"
            )

        run.do(Step.WAIT_RUNNING, wait_running)
        job = box[0]
        if job.finished:
            return run.result(Outcome.FINISHED, detail=f"job is {job.state}")

        def verify() -> str:
            # The read that saw it running names its GPUs already (Slurm allocates them at the start).
            got = placement_of(job) if (job.gpus or job.shards) else placement_of(self.read_job(job_id))
            if got != placement:
                raise ProtocolError(
                    f"job {job_id} runs on {got}, not on {placement} as asked; check gres.conf for the node"
                )
            return f"Slurm gave {got}"

        run.do(Step.VERIFY, verify)
        return run.result(Outcome.RUNNING, placement)

    def _until_free(self, run: _Run, until_free: Callable[[], None]) -> None:
        def act() -> str:
            try:
                until_free()
            except Exception:
                # Not to start later where the controller no longer expects it; unless it already runs.
                with contextlib.suppress(SlurmError):
                    self.backend.hold(run.job_id)
                try:
                    running = phase(self.read_job(run.job_id)) is Phase.RUNNING
                except SlurmError:
                    running = False
                if not running:
                    raise
                return "its GPUs' holder did not stop cleanly, but the job runs"
            return "the jobs that held its GPUs have stopped"

        run.do(Step.WAIT_FREE, act)

    def _begin_after(self, stopped: float) -> int:
        """The first whole second (wall time) at which a job seen stopped at `stopped` may start again on the
        same node: a credential dated then is later than any revocation dated (by a clock up to
        `credential_margin` ahead) in the second of the stop."""
        return math.floor(stopped + self.credential_margin) + 1

    def _credential_begin(self, job: SlurmJob, placement: Placement) -> int | None:
        """The whole second (wall time) before which the job must not begin on the placement's nodes, for its
        old credential there to lapse; None when nothing stands in the way. Set as the job's begin time, it
        holds the job back in every scheduling pass, the immediate ones after a job's epilog included.

        Without this protocol's own record of the stop (a controller restart, a requeue by Slurm itself)
        the stop time is Slurm's end time (whole seconds, slurmctld's clock) and every node counts.
        """
        now = self.wall()
        last: float | None = None
        record = self._stopped.get(job.job_id)
        if record is not None:
            stopped, nodes = record
            if not nodes or nodes & set(placement.nodes):
                last = stopped
        elif job.restart_count and now - 5.0 <= job.end_time <= now:
            last = job.end_time + 1.0  # the revocation may fall in the second after the recorded end
        if last is None:
            return None
        begin = self._begin_after(last)
        return begin if begin > math.floor(now) else None

    # -- migrate / resize --------------------------------------------------------------------------

    def migrate(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        """Move a job to `placement` (same GPU count): suspend (with `signal`), then resume there. `on_stopped`
        is called once the job holds no GPU any more (after the suspend half, or at once if it was not
        running); `defer` as for `resume`."""
        return self._move(Op.MIGRATE, job_id, placement, signal, on_stopped, defer)

    def resize(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        """Give a job another GPU count: suspend, then resume on `placement` (world-size independent ckpt);
        `signal`, `on_stopped` and `defer` as for `migrate`."""
        return self._move(Op.RESIZE, job_id, placement, signal, on_stopped, defer)

    def park(self, job_id: str, *, timeout: float = PARK_TIMEOUT_S) -> OpResult:
        """Park a running job in place: it keeps its GPUs, its state in host memory (`parking.park`)."""
        return parking.park(self, job_id, timeout=timeout)

    def unpark(self, job_id: str, *, timeout: float = PARK_TIMEOUT_S) -> OpResult:
        """Let a parked job compute again (`parking.unpark`)."""
        return parking.unpark(self, job_id, timeout=timeout)

    def _move(
        self,
        op: Op,
        job_id: str,
        placement: Placement,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        check_placement(placement)
        run = _Run(self, job_id, op, signal)
        job = self.read_job(job_id)
        ph = phase(job)
        if ph is Phase.RUNNING and placement_of(job) == placement:
            run.skip(Step.SIGNAL, "already running there")
            return run.result(Outcome.RUNNING, placement)
        if ph is not Phase.FINISHED:
            plan_gres(job, placement, self.backend.capabilities())  # refuse before stopping the job, not after
        if ph in (Phase.RUNNING, Phase.STOPPING, Phase.REQUEUED, Phase.RELEASED):
            first = self._suspend(run)
            if first.outcome is Outcome.FINISHED:
                return first
            escalated = first.outcome is Outcome.ESCALATED
        else:
            escalated = False
        if on_stopped is not None:
            on_stopped()
        res = self._resume(run, placement, known=run.held, defer=defer)
        if not escalated:
            return res
        return _escalated(res)


def _escalated(res: OpResult) -> OpResult:
    """A move's result, noting that its suspend half was forced (for STARTING: once it runs)."""
    if res.outcome is Outcome.STARTING and res.rest is not None:
        return replace(res, rest=functools.partial(_escalated_rest, res.rest))
    if res.outcome is Outcome.RUNNING:
        return replace(res, detail="suspend escalated: progress since its last checkpoint was lost")
    return res


def _escalated_rest(rest: Callable[[], OpResult]) -> OpResult:
    return _escalated(rest())
