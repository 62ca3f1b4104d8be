"""In-memory stand-ins for Slurm and the requeue protocol (pure unit tests only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from slurm_gandiva.errors import ProtocolError, UnknownJob
from slurm_gandiva.model import GpuRef, Placement, Tenants
from slurm_gandiva.requeue.operations import Op, Operations, OpResult, Outcome, Step, StepRecord
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import HoldKind, SlurmJob, SlurmNode, Snapshot, SubmitRequest
from slurm_gandiva.slurm.capabilities import SlurmCapabilities

GRES = ",".join(f"gpu:g{i}:1" for i in range(4))


def sjob(
    jid: str,
    state: str = "PENDING",
    *,
    hold: HoldKind = HoldKind.ADMIN,
    gpus: dict[str, tuple[int, ...]] | None = None,
    user: str = "alice",
    comment: str = "gandiva",
    partition: str = "gpu",
    restarts: int = 0,
    submit: float = 1000.0,
    start: float = 0.0,
    tres: str = "gres:gpu:1",
    nodes: tuple[str, ...] = (),
) -> SlurmJob:
    return SlurmJob(
        job_id=jid,
        name=f"job{jid}",
        user=user,
        state=state,
        reason="JobHeldAdmin" if hold is HoldKind.ADMIN else "None",
        hold=hold,
        nodes=nodes or tuple(sorted((gpus or {}).keys())),
        gpus=gpus or {},
        restart_count=restarts,
        comment=comment,
        partition=partition,
        submit_time=submit,
        start_time=start,
        tres_per_node=tres,
    )


def nodes(n: int = 2) -> tuple[SlurmNode, ...]:
    return tuple(SlurmNode(f"n{i}", "IDLE", ("gpu",), GRES, "") for i in range(1, n + 1))


class FakeBackend:
    """Jobs in a dict; records every mutating call."""

    def __init__(self, jobs: list[SlurmJob], clock: Callable[[], float] = time.time) -> None:
        self.jobs_by_id = {j.job_id: j for j in jobs}
        self.calls: list[tuple[str, str]] = []
        self.clock = clock
        self.lock = threading.Lock()
        self.caps = SlurmCapabilities.for_release((22, 5, 8))
        self.lose_cancels = 0  # how many of the next cancels Slurm loses
        self.accounting: Tenants | Exception = Tenants()  # what tenants() returns, or raises

    def set(self, job: SlurmJob) -> None:
        with self.lock:
            self.jobs_by_id[job.job_id] = job

    def capabilities(self) -> SlurmCapabilities:
        return self.caps

    def submit(self, req: SubmitRequest) -> str:
        raise NotImplementedError("the fake takes no new jobs")

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(tuple(self.jobs_by_id.values()), nodes(), self.clock())

    def jobs(self) -> tuple[SlurmJob, ...]:
        return self.snapshot().jobs

    def nodes(self) -> tuple[SlurmNode, ...]:
        return nodes()

    def job(self, job_id: str) -> SlurmJob:
        with self.lock:
            if job_id not in self.jobs_by_id:
                raise UnknownJob(f"no job {job_id}")
            return self.jobs_by_id[job_id]

    def hold(self, job_id: str) -> None:
        """As Slurm: holding an array's id holds every waiting task of it."""
        self.calls.append(("hold", job_id))
        tasks = [j for j in self.jobs_by_id.values() if j.array_id == job_id and j.pending]
        for j in tasks or [self.job(job_id)]:
            self.set(replace(j, hold=HoldKind.ADMIN, reason="JobHeldAdmin"))

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id))

    def update(self, job_id: str, **fields: str) -> None:
        self.calls.append(("update", job_id))

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        self.calls.append(("signal", job_id))

    def requeue_hold(self, job_id: str) -> None:
        self.calls.append(("requeuehold", job_id))

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        """As Slurm: the job (an array's id: each unfinished task) is CANCELLED, except the first
        `lose_cancels` ones, which are lost (a cancel Slurm did not carry out)."""
        self.calls.append(("cancel", job_id))
        with self.lock:
            if self.lose_cancels > 0:
                self.lose_cancels -= 1
                return
            for jid, j in list(self.jobs_by_id.items()):
                if (jid == job_id or j.array_id == job_id) and not j.finished:
                    self.jobs_by_id[jid] = replace(j, state="CANCELLED")

    def tenants(self) -> Tenants:
        self.calls.append(("tenants", ""))
        if isinstance(self.accounting, Exception):
            raise self.accounting
        return self.accounting

    def user_associations(self, user: str) -> UserAssociations | None:
        return None


class FakeProtocol(Operations):
    """Moves jobs in a FakeBackend as the real protocol would; `delay` per operation; `fail` job ids."""

    def __init__(self, backend: FakeBackend, delay: float = 0.0, fail: frozenset[str] = frozenset()) -> None:
        self.backend = backend
        self.delay = delay
        self.resume_delay = 0.0  # a move: seconds between the job's stop (on_stopped) and its new start
        self.ran_at: dict[str, float] = {}  # job id -> time.monotonic() when it was set running
        self.fail = set(fail)
        self.calls: list[tuple[str, str, Placement | None]] = []
        self.on_call: Callable[[str, str], None] | None = None
        self.lock = threading.Lock()
        # Jobs whose start waits for a begin time (a pack back onto their node): with `defer` the operation
        # returns STARTING, the job held, and its `rest` starts it once `gate` is set.
        self.later: set[str] = set()
        self.gate = threading.Event()
        self.deferred: list[str] = []  # job ids the actor asked to defer, in call order
        self.signals: dict[str, str | None] = {}  # job id -> the signal its last suspend or move was given
        self.parked: set[str] = set()  # jobs parked in place (their Slurm state does not change)
        self.decline: set[str] = set()  # jobs that do not park when asked: suspended through the requeue path

    def _enter(self, op: str, job_id: str, placement: Placement | None) -> None:
        with self.lock:
            self.calls.append((op, job_id, placement))
        if self.on_call is not None:
            self.on_call(op, job_id)
        if self.delay:
            time.sleep(self.delay)
        if job_id in self.fail:
            raise ProtocolError(f"job {job_id}: injected failure")

    def suspend(self, job_id: str, *, signal: str | None = None) -> OpResult:
        self.signals[job_id] = signal
        self._enter("suspend", job_id, None)
        j = self.backend.job(job_id)
        self.backend.set(
            replace(
                j,
                state="PENDING",
                gpus={},
                hold=HoldKind.ADMIN,
                reason="JobHeldAdmin",
                restart_count=j.restart_count + 1,
            )
        )
        return OpResult(job_id, Op.SUSPEND, Outcome.SUSPENDED, (StepRecord(Step.SIGNAL, self.delay),))

    def _run(
        self,
        op: Op,
        job_id: str,
        placement: Placement,
        *,
        enter: bool = True,
        until_free: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        if enter:
            self._enter(op.value, job_id, placement)
        if defer:
            with self.lock:
                self.deferred.append(job_id)
        if defer and job_id in self.later and until_free is None:
            j = self.backend.job(job_id)
            self.backend.set(replace(j, state="PENDING", gpus={}, nodes=placement.nodes, hold=HoldKind.ADMIN))

            def rest() -> OpResult:
                self.gate.wait(10)
                return self._run(op, job_id, placement, enter=False)

            return OpResult(job_id, op, Outcome.STARTING, (StepRecord(Step.SET_PLACEMENT, 0.0),), placement, "", rest)
        if until_free is not None:
            with self.lock:
                self.calls.append(("released-ahead", job_id, placement))
            until_free()  # raises when a holder failed to stop: the job stays pending
        self.ran_at[job_id] = time.monotonic()
        j = self.backend.job(job_id)
        gpus: dict[str, tuple[int, ...]] = {}
        for g in placement.gpus:
            gpus[g.node] = (*gpus.get(g.node, ()), g.index)
        self.backend.set(
            replace(
                j,
                state="RUNNING",
                gpus={} if placement.shared else gpus,
                shards=gpus if placement.shared else {},
                nodes=placement.nodes,
                hold=HoldKind.NONE,
                reason="None",
                start_time=self.backend.clock(),
            )
        )
        return OpResult(job_id, op, Outcome.RUNNING, (StepRecord(Step.RELEASE, self.delay),), placement)

    def resume(
        self,
        job_id: str,
        placement: Placement,
        *,
        until_free: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        return self._run(Op.RESUME, job_id, placement, until_free=until_free, defer=defer)

    def _move(
        self,
        op: Op,
        job_id: str,
        placement: Placement,
        on_stopped: Callable[[], None] | None,
        defer: bool = False,
        signal: str | None = None,
    ) -> OpResult:
        self.signals[job_id] = signal
        if on_stopped is None or not self.resume_delay:
            return self._run(op, job_id, placement, defer=defer)
        self._enter(op.value, job_id, placement)
        j = self.backend.job(job_id)
        self.backend.set(replace(j, state="PENDING", gpus={}, hold=HoldKind.ADMIN, reason="JobHeldAdmin"))
        on_stopped()
        time.sleep(self.resume_delay)
        return self._run(op, job_id, placement, enter=False, defer=defer)

    def migrate(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        return self._move(Op.MIGRATE, job_id, placement, on_stopped, defer, signal)

    def resize(
        self,
        job_id: str,
        placement: Placement,
        *,
        signal: str | None = None,
        on_stopped: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        return self._move(Op.RESIZE, job_id, placement, on_stopped, defer, signal)


    def park(self, job_id: str) -> OpResult:
        if job_id in self.decline:
            res = self.suspend(job_id)
            return OpResult(job_id, Op.PARK, Outcome.ESCALATED, res.steps, None, "did not park")
        self._enter("park", job_id, None)
        self.parked.add(job_id)
        return OpResult(job_id, Op.PARK, Outcome.PARKED, (StepRecord(Step.WAIT_SWITCH, self.delay),))

    def unpark(self, job_id: str) -> OpResult:
        self._enter("unpark", job_id, None)
        self.parked.discard(job_id)
        return OpResult(job_id, Op.UNPARK, Outcome.RUNNING, (StepRecord(Step.WAIT_SWITCH, self.delay),))


def pl(node: str, *idx: int) -> Placement:
    return Placement(tuple(GpuRef(node, i) for i in idx))
