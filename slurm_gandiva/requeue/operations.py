"""The requeue protocol's operations as its callers see them: their signatures (`Operations`, declared once),
where a job is (`Phase`, `phase`), the operations and their steps, what the journal receives, and each
operation's result."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.slurm.base import HoldKind, SlurmJob

REQUEUE_HELD_REASON = "job_requeued_in_held_state"


class Phase(enum.Enum):
    """Where a job is in the cycle, as far as Slurm shows it."""

    RUNNING = "running"  # holds its allocation
    STOPPING = "stopping"  # completing / being requeued: wait, do not act
    REQUEUED = "requeued"  # pending with the owner's hold (requeue-hold, or job_submit.lua's): not yet admin-held
    HELD = "held"  # pending with the admin hold, ran before: suspended, ready to resume
    QUEUED_HELD = "queued-held"  # pending with the admin hold, never ran: ready for its first start
    RELEASED = "released"  # pending without a hold: Slurm may start it (begin time, resources)
    FINISHED = "finished"  # completed, failed or cancelled


class Op(enum.Enum):
    SUSPEND = "suspend"
    RESUME = "resume"
    MIGRATE = "migrate"
    RESIZE = "resize"
    PARK = "park"  # in place: the job keeps its GPUs and waits, its state in host memory (`parking`)
    UNPARK = "unpark"


class Step(enum.Enum):
    """One idempotent step of an operation."""

    SIGNAL = "signal"  # scancel --signal=SIG --batch JOB
    WAIT_REQUEUE = "wait-requeue"  # until PENDING + held (the wrapper requeue-held itself)
    ESCALATE = "escalate"  # timeout: root requeuehold; progress since the last checkpoint is lost
    WAIT_CHECKPOINT = "wait-checkpoint"  # the wrapper's fresh status.json says "suspended"
    ADMIN_HOLD = "admin-hold"  # scontrol hold: the owner can no longer release it
    SET_PLACEMENT = "set-placement"  # scontrol update nodelist=N gres=gpu:gK:1,...
    CLEAR_BEGIN = "clear-begin"  # starttime=now+N, for a credential to lapse (else set with the placement)
    RELEASE = "release"  # scontrol release
    WAIT_FREE = "wait-free"  # released ahead: until the jobs that hold its GPUs have stopped (`resume`)
    WAIT_RUNNING = "wait-running"  # until RUNNING
    VERIFY = "verify"  # Slurm's GPUs == the placement
    WRITE_REQUEST = "write-request"  # park-request.json, root's, in the job's state directory
    WAIT_SWITCH = "wait-switch"  # the job's report names the request: "parked", or "running" again
    FREEZE = "freeze"  # scancel --signal=STOP --full: a parked job's processes cannot compute, whatever it says
    THAW = "thaw"  # scancel --signal=CONT --full: before a parked job is unparked or stopped


class Outcome(enum.Enum):
    SUSPENDED = "suspended"  # held, clean checkpoint (or never ran)
    ESCALATED = "escalated"  # held, but forced: progress since the last checkpoint is lost
    RUNNING = "running"  # running on the requested placement
    STARTING = "starting"  # set up (held until its begin time, or released): `OpResult.rest` waits until it runs
    FINISHED = "finished"  # the job ended (done, failed, cancelled) instead
    PARKED = "parked"  # in place: holds its GPUs, computes no more, its state in host memory


class StepEventKind(enum.Enum):
    START = "start"
    END = "end"
    SKIP = "skip"


@dataclass(frozen=True)
class StepEvent:
    """What the journal callback receives: a step starting, ending or being skipped (already done)."""

    job_id: str
    op: Op
    step: Step
    kind: StepEventKind
    seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class StepRecord:
    """One step as carried out: how long it took and what it found."""

    step: Step
    seconds: float
    detail: str = ""
    skipped: bool = False


@dataclass(frozen=True)
class OpResult:
    """The outcome of one operation and each of its steps, in order."""

    job_id: str
    op: Op
    outcome: Outcome
    steps: tuple[StepRecord, ...]
    placement: Placement | None = None
    detail: str = ""
    # STARTING only: the rest of the start (the release at its begin time if still held, the wait until it runs,
    # the GPU check); returns the operation's final result (its steps include these), raises as it would have.
    rest: Callable[[], OpResult] | None = field(default=None, compare=False, repr=False)

    @property
    def escalated(self) -> bool:
        return self.outcome is Outcome.ESCALATED

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def step(self, step: Step) -> StepRecord | None:
        """The last record of `step`, if it ran or was skipped."""
        return next((s for s in reversed(self.steps) if s.step is step), None)

    def describe(self) -> str:
        """Human-readable lines: one per step with its duration, then the outcome."""
        lines = []
        for s in self.steps:
            what = "skipped" if s.skipped else f"{s.seconds:7.3f} s"
            lines.append(f"  {s.step.value:<16} {what:>10}  {s.detail}".rstrip())
        where = f" on {self.placement}" if self.placement else ""
        tail = f": {self.detail}" if self.detail else ""
        lines.append(f"job {self.job_id}: {self.op.value} -> {self.outcome.value}{where}{tail}")
        lines.append(f"  total {self.seconds:.3f} s")
        return "\n".join(lines)


Journal = Callable[[StepEvent], None]


class Operations(Protocol):
    """The operations (`RequeueProtocol`'s; the controller's fakes in tests). Each stops a running job
    with `signal`, the one that job catches (None: the protocol's configured one); all are idempotent."""

    def suspend(self, job_id: str, *, signal: str | None = None) -> OpResult: ...

    def resume(
        self,
        job_id: str,
        placement: Placement,
        *,
        until_free: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult: ...

    def migrate(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult: ...

    def resize(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult: ...

    def park(self, job_id: str) -> OpResult:
        """Park a running job on its co-held GPUs (PARKED; ESCALATED / FINISHED as `parking.park` says)."""
        ...

    def unpark(self, job_id: str) -> OpResult:
        """Let a parked job compute again (RUNNING; ESCALATED / FINISHED as `parking.unpark` says)."""
        ...


def is_held(job: SlurmJob) -> bool:
    return job.hold is not HoldKind.NONE or job.reason == REQUEUE_HELD_REASON


def phase(job: SlurmJob) -> Phase:
    """Where `job` is in the suspend/resume cycle."""
    if job.finished:
        return Phase.FINISHED
    if job.state == "RUNNING" or job.state == "CONFIGURING":
        return Phase.RUNNING
    if job.pending:
        if job.hold is HoldKind.ADMIN:
            return Phase.HELD if job.restart_count > 0 else Phase.QUEUED_HELD
        if is_held(job):
            return Phase.REQUEUED
        return Phase.RELEASED
    return Phase.STOPPING


def placement_of(job: SlurmJob) -> Placement | None:
    """The GPUs Slurm gave a running job, as a Placement (None when it holds none)."""
    whole = [GpuRef(n, i) for n, idx in job.gpus.items() for i in idx]
    shards = [GpuRef(n, i) for n, idx in job.shards.items() for i in idx]
    if whole:
        return Placement(tuple(whole))  # a mix is never booked by the controller; report the whole GPUs
    if shards:
        return Placement(tuple(shards), shared=True)
    return None


def as_mapping(result: OpResult) -> Mapping[str, object]:
    """A JSON-ready view of a result (for --json output and benchmarks)."""
    return {
        "job_id": result.job_id,
        "op": result.op.value,
        "outcome": result.outcome.value,
        "placement": str(result.placement) if result.placement else None,
        "detail": result.detail,
        "seconds": result.seconds,
        "steps": [
            {"step": s.step.value, "seconds": s.seconds, "detail": s.detail, "skipped": s.skipped} for s in result.steps
        ],
    }
