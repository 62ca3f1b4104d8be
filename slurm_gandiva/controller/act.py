"""act + record: carry a Plan out through the requeue protocol, recording intent before and outcome after.

Every decision runs on its own thread as soon as the decisions it depends on are done (`_dependencies`):
a decision waits only for the decisions of the jobs that hold any of its target GPUs now (a suspend,
migrate or resize frees them), for those of requeued jobs whose old GPU indices Slurm ties to its
target node, and, for a start or resume of a throttled job array's task, for the suspend of a task of
that array whose place it takes. Suspends depend on nothing and start at once; a start on free GPUs does
not wait for the round's suspends, and a start on a suspended job's GPUs waits for that suspend alone, not
for the slowest of the round. A failing decision is logged, recorded as failed and isolated: the rest of
the plan still runs, except decisions that would take GPUs (or an array's place) that a job that failed
to stop still holds. Where Slurm does not tie GPU indices, a start's last part (waiting for a begin time
and for Slurm to run the released job) goes on after `execute` returns (`Actor.starting`): the round is
not held up by slurmctld's whole-second passes; the decision's outcome is recorded when the job runs.

Test hook: GANDIVA_CRASH_AT makes the process `os._exit(137)` at one point, to test crash recovery:
`<op>:<step>[:start|end]` (a protocol step, e.g. `suspend:signal`, `resume:release:start`; default
`end`) or `[<action>:]intent` / `[<action>:]outcome` (after the intent is recorded / after the operation,
before its outcome is recorded).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from typing import Protocol

from slurm_gandiva.controller.cohold import slurm_placement, view_placement
from slurm_gandiva.errors import GandivaError, LimitRefusal, ProtocolError
from slurm_gandiva.model import GpuRef, JobState, Placement
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.requeue.operations import Operations, OpResult, Outcome, Step, StepEvent, StepEventKind
from slurm_gandiva.slurm.base import SlurmBackend
from slurm_gandiva.store.api import Outcome as StoreOutcome
from slurm_gandiva.store.api import SliceEnd, StoreApi

log = logging.getLogger(__name__)

CRASH_ENV = "GANDIVA_CRASH_AT"
CRASH_EXIT = 137

SLICE_END_FOR = {
    Action.SUSPEND: SliceEnd.QUANTUM,
    Action.PARK: SliceEnd.QUANTUM,
    Action.MIGRATE: SliceEnd.MIGRATE,
    Action.RESIZE: SliceEnd.RESIZE,
    Action.PACK: SliceEnd.PACK,
    Action.UNPACK: SliceEnd.PACK,
}
# Steps that belong to the resume half of an operation (the old slice ended before the first of them).
_RESUME_STEPS = frozenset(
    {Step.SET_PLACEMENT, Step.CLEAR_BEGIN, Step.RELEASE, Step.WAIT_FREE, Step.WAIT_RUNNING, Step.VERIFY}
)


class MetricsLike(Protocol):
    """The event side of slurm_gandiva.controller.metrics.Metrics."""

    def slice_started(self) -> None: ...

    def slice_ended(self, reason: str | SliceEnd) -> None: ...

    def decision(self, action: Action, outcome: str | StoreOutcome) -> None: ...

    def step(self, step: str | Step, seconds: float, *, ok: bool = True) -> None: ...


def job_signal(store: StoreApi, job_id: str) -> str | None:
    """The signal recorded with the job (`gandiva sbatch --signal`), which the protocol stops it with; None
    when none was recorded or it cannot be read: the configured signal."""
    try:
        rec = store.get_job(job_id)
    except Exception:
        log.exception("job %s: its signal is unknown; using the configured one", job_id)
        return None
    return (rec.signal or None) if rec is not None else None


@dataclass(frozen=True)
class ActResult:
    """How one decision went."""

    decision: Decision
    outcome: StoreOutcome
    detail: str = ""
    op: OpResult | None = None
    decision_id: int | None = None
    starting: bool = False  # succeeded so far: the job starts after the round (`Actor.starting`)
    limited: bool = False  # failed because Slurm's accounting held the job back (`LimitRefusal`)
    tied: bool = False  # skipped: Slurm would never start it there (`_tie_conflicts`); backed off one quantum

    @property
    def ok(self) -> bool:
        return self.outcome is StoreOutcome.SUCCEEDED


def crash_point(spec: str | None, *candidates: str) -> None:
    """Exit the process at once (no clean-up, like kill -9) when `spec` names one of `candidates`."""
    if spec and spec.strip().lower() in candidates:
        log.critical("GANDIVA_CRASH_AT=%s: exiting with %d", spec, CRASH_EXIT)
        logging.shutdown()
        os._exit(CRASH_EXIT)


def finished_slice_end(state: str) -> SliceEnd:
    """Why a slice ended, from the Slurm state the job finished in."""
    if state == "COMPLETED":
        return SliceEnd.DONE
    if state == "CANCELLED":
        return SliceEnd.CANCELLED
    return SliceEnd.FAILED


def finished_job_state(state: str) -> JobState:
    return {SliceEnd.DONE: JobState.DONE, SliceEnd.CANCELLED: JobState.CANCELLED}.get(
        finished_slice_end(state), JobState.FAILED
    )


class Actor:
    """Carries plans out. `journal` must be passed to the RequeueProtocol so steps get recorded."""

    def __init__(
        self,
        backend: SlurmBackend,
        store: StoreApi,
        *,
        clock: Callable[[], float],
        crash_at: str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        metrics: MetricsLike | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.clock = clock
        self.crash_at = crash_at.strip().lower() if crash_at else None
        self.should_stop = should_stop
        self.protocol: Operations | None = None
        self.metrics = metrics
        self.co_hold = 0  # jobs on up to this many whole GPUs of one node hold shards (`cohold.co_hold_gpus`)
        self.parked: frozenset[str] = frozenset()  # jobs parked on co-held GPUs when the plan was made
        self._lock = threading.Lock()
        self._decision_of: dict[str, int] = {}  # job id -> decision id while its operation runs
        self._open_steps: dict[tuple[str, str], int] = {}  # (job id, step) -> step record id
        # Jobs whose start was left to run on after their round (`Outcome.STARTING`): job id -> (the placement
        # they are starting on, the finish). Their decisions stay open in the store until the job runs.
        self._starting: dict[str, tuple[Placement, Future[ActResult]]] = {}
        self._ended: list[ActResult] = []  # how those starts ended, until `ended_starts` takes them
        self._finishers: ThreadPoolExecutor | None = None

    # -- starts that run on after their round ----------------------------------------------------------
    def starting(self) -> dict[str, Placement]:
        """Job id -> placement of the jobs being started after their round ended (Slurm shows them pending,
        held or released: they hold those GPUs for the policies, and the reconciler leaves them be)."""
        with self._lock:
            return {jid: p for jid, (p, _f) in self._starting.items()}

    def ended_starts(self) -> tuple[ActResult, ...]:
        """How the starts left to run on ended since the last call (each result once): a start Slurm refused
        or that timed out is a failure like one within the round."""
        with self._lock:
            ended, self._ended = tuple(self._ended), []
        return ended

    def wait_started(self, job_ids: Iterable[str] | None = None, timeout: float | None = None) -> bool:
        """Wait until the starts of `job_ids` (None: all) left to run on have ended; False on timeout."""
        wanted = None if job_ids is None else set(job_ids)
        with self._lock:
            futs = [f for jid, (_p, f) in self._starting.items() if wanted is None or jid in wanted]
        _done, left = wait_all(futs, timeout=timeout)
        return not left

    # -- journal: protocol steps -> store --------------------------------------------------------------
    def journal(self, ev: StepEvent) -> None:
        """The protocol's step callback: records steps and fires the crash hook."""
        now = self.clock()
        try:
            with self._lock:
                did = self._decision_of.get(ev.job_id)
                key = (ev.job_id, ev.step.value)
                if did is not None:
                    if ev.kind is StepEventKind.START:
                        self._open_steps[key] = self.store.record_step(did, ev.step, now)
                    elif ev.kind is StepEventKind.END:
                        sid = self._open_steps.pop(key, None)
                        if sid is None:
                            self.store.record_step(did, ev.step, now - ev.seconds, now, ev.detail)
                        else:
                            self.store.end_step(sid, now, ev.detail)
                    else:
                        self.store.record_step(did, ev.step, now, now, f"skipped: {ev.detail}")
            if self.metrics is not None and ev.kind is StepEventKind.END:
                self.metrics.step(ev.step, ev.seconds, ok=not ev.detail.startswith("error"))
        except Exception:
            log.exception("job %s: could not record step %s", ev.job_id, ev.step.value)
        if self.crash_at:
            base = f"{ev.op.value}:{ev.step.value}"
            if ev.kind is StepEventKind.END:
                crash_point(self.crash_at, base, f"{base}:end")
            elif ev.kind is StepEventKind.START:
                crash_point(self.crash_at, f"{base}:start")

    def _crash(self, action: Action, point: str) -> None:
        if self.crash_at:
            crash_point(self.crash_at, point, f"{action.value}:{point}")

    # -- executing a plan ------------------------------------------------------------------------------
    def execute(
        self,
        plan: Plan,
        held: dict[str, Placement] | None = None,
        last: dict[str, Placement] | None = None,
        *,
        ties: bool = True,
        groups: Mapping[str, str] | None = None,
        room: Mapping[str, int] | None = None,
    ) -> tuple[ActResult, ...]:
        """Run every decision of `plan`, each as soon as the decisions it depends on are done; results in
        plan order. `held` maps running jobs to their GPUs (to isolate failed stops and order moves),
        `last` the jobs it resumes to where they last ran (to order starts, see `_dependencies`); `ties`:
        Slurm ties requeued jobs to their old GPU indices (`SlurmCapabilities`). `groups` (job id ->
        throttled job array) and `room` (array -> tasks it may still start before one of its tasks
        stops): a start past the room waits for a suspend of the array."""
        if self.protocol is None:
            raise RuntimeError("Actor.protocol is not set")
        held = held or {}
        ds = list(plan.decisions)
        # A job still starting from an earlier round is acted on once that start has ended.
        self.wait_started({d.job_id for d in ds})
        deps, places = _dependencies(ds, held, last or {}, ties=ties, groups=groups, room=room)
        # A dependency on a move (migrate, resize, pack) is met once that job has stopped and freed its GPUs,
        # before it starts again elsewhere; one on a tie (22.05: that job must run again) only once it runs.
        hard = _tie_dependencies(ds, held, last or {}) if ties else [set() for _ in ds]
        never = _tie_conflicts(ds, held, last or {}) if ties else {}
        results: dict[int, ActResult] = {}
        stopped: set[int] = set()  # moves whose job has stopped (their resume half runs)
        events: queue.SimpleQueue[tuple[bool, int]] = queue.SimpleQueue()  # (done, decision): stopped or done
        blocked: set[GpuRef] = set()  # GPUs of jobs that failed to stop
        unstopped: set[int] = set()  # decisions of jobs that failed to stop
        freed: set[int] = set()  # decisions whose job holds none of its old GPUs any more
        cv = threading.Condition()  # guards freed / unstopped for the starts released ahead
        left = set(range(len(ds)))
        stopping = False

        def met(i: int) -> bool:
            return all(j in results or (j in stopped and j not in hard[i]) for j in deps[i])

        def ahead(i: int) -> bool:
            """A start or resume whose GPUs only running jobs being stopped by decisions under way hold is
            released at once (Slurm starts it as the last of them completes: no wait for its next pass)."""
            return (
                ds[i].action in (Action.START, Action.RESUME)
                and not hard[i]
                and i not in places
                and deps[i] <= running.keys() | results.keys()
                # a parking job keeps a shard: Slurm would start this one beside it while it still computes
                and not any(ds[j].action is Action.PARK and j not in results for j in deps[i])
            )

        def until_free(i: int) -> None:
            with cv:
                cv.wait_for(lambda: deps[i] <= freed | unstopped)
                failed = deps[i] & unstopped
            if failed:
                raise ProtocolError("skipped: its GPUs are still held by a job that failed to stop")

        with ThreadPoolExecutor(max_workers=min(32, max(1, len(ds))), thread_name_prefix="act") as pool:
            running: dict[int, Future[ActResult]] = {}
            while left or running:
                ready = sorted(i for i in left if met(i))
                if not ready and not running and left and not any(ahead(i) for i in left):
                    ready = [min(left)]  # a cycle cannot be ordered: what is left runs one at a time
                for early, batch in ((False, ready), (True, None)):
                    if batch is None:  # after the ready ones are under way: the starts that may go ahead
                        batch = sorted(i for i in left if ahead(i))
                    for i in batch:
                        d = ds[i]
                        if d.action is not Action.SUSPEND and not stopping and self.should_stop():
                            stopping = True
                            log.info("stopping: %d decisions of this plan not started", len(left))
                        if stopping and d.action is not Action.SUSPEND:
                            continue
                        left.discard(i)
                        why = never.get(i) or _blocked(d, blocked, places.get(i, ()), unstopped)
                        if why:
                            log.warning("job %s: %s %s", d.job_id, d.action.value, why)
                            self.store.record_event("skipped", d.job_id, f"{d.action.value}: {why}", self.clock())
                            results[i] = ActResult(d, StoreOutcome.FAILED, why, tied=i in never)
                            continue
                        wait = functools.partial(until_free, i) if early and deps[i] - freed else None
                        # A start's wait for Slurm to run it (and for a begin time) goes on after the round,
                        # unless Slurm ties GPU indices (a later start must wait for it) or the job takes a
                        # throttled array's place (Slurm counts it only once it runs).
                        defer = not ties and d.job_id not in (groups or {})
                        fut = pool.submit(
                            self._attempt, d, functools.partial(events.put, (False, i)), wait, defer=defer
                        )
                        fut.add_done_callback(functools.partial(_put_done, events, i))
                        running[i] = fut
                if stopping and not running:
                    break
                if not running:
                    continue
                done, i = events.get()
                if not done:
                    with cv:
                        stopped.add(i)
                        freed.add(i)
                        cv.notify_all()
                    continue
                r = results[i] = running.pop(i).result()
                with cv:
                    if r.ok or r.outcome is StoreOutcome.ABANDONED or i in stopped or r.decision.job_id not in held:
                        freed.add(i)
                    else:
                        blocked.update(held[r.decision.job_id].gpus)
                        unstopped.add(i)
                    cv.notify_all()
        return tuple(results[i] for i in sorted(results))

    def _attempt(
        self,
        d: Decision,
        on_stopped: Callable[[], None] | None = None,
        until_free: Callable[[], None] | None = None,
        *,
        defer: bool = False,
    ) -> ActResult:
        """Record the intent, then carry the decision out (on a worker thread); never raises. `on_stopped`:
        a move's job has stopped and holds no GPU (its resume half follows). `until_free`: a start released
        ahead waits in it for the jobs that hold its GPUs to stop (see RequeueProtocol.resume). `defer`: the
        wait for Slurm to start the job runs on after this returns (`starting`)."""
        try:
            did = self._intent(d)
        except Exception as exc:
            log.exception("job %s: could not record the intent; not acting", d.job_id)
            return ActResult(d, StoreOutcome.FAILED, f"intent not recorded: {exc}")
        return self._run(d, did, on_stopped, until_free, defer=defer)

    def _intent(self, d: Decision) -> int:
        did = self.store.record_intent(d.job_id, d.action, d.placement, d.reason, self.clock())
        with self._lock:
            self._decision_of[d.job_id] = did
        self._crash(d.action, "intent")
        return did

    def _done(self, d: Decision, did: int) -> None:
        with self._lock:
            self._decision_of.pop(d.job_id, None)
            for key in [k for k in self._open_steps if k[0] == d.job_id]:
                del self._open_steps[key]

    def _run(
        self,
        d: Decision,
        did: int,
        on_stopped: Callable[[], None] | None = None,
        until_free: Callable[[], None] | None = None,
        *,
        defer: bool = False,
    ) -> ActResult:
        """Carry out one decision whose intent is recorded; never raises."""
        assert self.protocol is not None
        t0 = self.clock()
        try:
            res = self._call(d, on_stopped, until_free, defer)
        except Exception as exc:
            return self._failed(d, did, exc)
        if res.outcome is Outcome.STARTING and res.rest is not None:
            return self._start_later(d, did, res, res.rest, t0)
        return self._conclude(d, did, res, t0)

    def _conclude(self, d: Decision, did: int, res: OpResult, t0: float) -> ActResult:
        self._done(d, did)
        self._crash(d.action, "outcome")
        try:
            return self._record(d, did, res, t0)
        except Exception as exc:
            log.exception("job %s: %s done but not recorded", d.job_id, d.action.value)
            return ActResult(d, StoreOutcome.FAILED, f"not recorded: {exc}", res, did)

    def _start_later(
        self, d: Decision, did: int, res: OpResult, rest: Callable[[], OpResult], t0: float
    ) -> ActResult:
        """Leave a STARTING job's start to run on after the round; its decision stays open until it runs.
        A move's old slice ends now, when the job stopped, as `_record` would end it."""
        placement = view_placement(res.placement, d.placement) or d.placement
        assert placement is not None
        if d.action not in (Action.START, Action.RESUME):
            try:
                self._close_stopped(d, res, t0, self.clock())
            except Exception:
                log.exception("job %s: could not end its slice; it ends when the job runs again", d.job_id)
        with self._lock:
            if self._finishers is None:
                self._finishers = ThreadPoolExecutor(max_workers=32, thread_name_prefix="start")
            fut = self._finishers.submit(self._finish_start, d, did, rest, t0)
            self._starting[d.job_id] = (placement, fut)
        log.info("job %s: %s -> %s; starting", d.job_id, d.action.value, res.detail)
        return ActResult(d, StoreOutcome.SUCCEEDED, f"starting: {res.detail}", res, did, starting=True)

    def _finish_start(self, d: Decision, did: int, rest: Callable[[], OpResult], t0: float) -> ActResult:
        """The rest of a start left to run on (on a finisher thread); never raises."""
        result: ActResult | None = None
        try:
            try:
                res = rest()
            except Exception as exc:
                result = self._failed(d, did, exc)
                return result
            result = self._conclude(d, did, res, t0)
            return result
        finally:
            with self._lock:
                self._starting.pop(d.job_id, None)
                if result is not None:
                    self._ended.append(result)

    def _call(
        self,
        d: Decision,
        on_stopped: Callable[[], None] | None = None,
        until_free: Callable[[], None] | None = None,
        defer: bool = False,
    ) -> OpResult:
        assert self.protocol is not None
        if d.action is Action.SUSPEND:
            return self.protocol.suspend(d.job_id, signal=job_signal(self.store, d.job_id))
        if d.action is Action.PARK:
            return self.protocol.park(d.job_id)
        if d.action is Action.UNPARK:
            return self.protocol.unpark(d.job_id)
        assert d.placement is not None, f"{d.action.value} without a placement"
        where = slurm_placement(d.placement, self.co_hold)
        if d.action is Action.RESUME and d.job_id in self.parked:
            # A parked job placed elsewhere: requeued from host memory (it checkpoints), then started there.
            return self.protocol.migrate(
                d.job_id, where, signal=job_signal(self.store, d.job_id), on_stopped=on_stopped, defer=defer
            )
        if d.action in (Action.START, Action.RESUME):
            return self.protocol.resume(d.job_id, where, until_free=until_free, defer=defer)
        sig = job_signal(self.store, d.job_id)
        if d.action is Action.RESIZE:
            return self.protocol.resize(d.job_id, where, signal=sig, on_stopped=on_stopped, defer=defer)
        return self.protocol.migrate(d.job_id, where, signal=sig, on_stopped=on_stopped, defer=defer)

    def _close(self, job_id: str, end: float, reason: SliceEnd) -> None:
        if self.store.close_slice(job_id, end, reason) is not None and self.metrics is not None:
            self.metrics.slice_ended(reason)

    def _close_stopped(self, d: Decision, res: OpResult, t0: float, now: float) -> None:
        """End a move's old slice when its job stopped: after the suspend half of the operation begun at `t0`."""
        stop_s = sum(s.seconds for s in res.steps if s.step not in _RESUME_STEPS)
        self._close(d.job_id, min(now, t0 + stop_s), SLICE_END_FOR[d.action])

    def _open(self, job_id: str, placement: Placement, start: float) -> None:
        self.store.open_slice(job_id, placement, start)
        if self.metrics is not None:
            self.metrics.slice_started()

    def _outcome(self, d: Decision, did: int, outcome: StoreOutcome, detail: str, at: float) -> None:
        self.store.record_outcome(did, outcome, detail, at)
        if self.metrics is not None:
            self.metrics.decision(d.action, outcome)

    def _record(self, d: Decision, did: int, res: OpResult, t0: float) -> ActResult:
        now = self.clock()
        jid = d.job_id
        if res.outcome is Outcome.FINISHED:
            state = self._slurm_state(jid)
            self._close(jid, now, finished_slice_end(state) if state else SliceEnd.DONE)
            if state:
                self.store.set_job_state(jid, finished_job_state(state), at=now)
            detail = res.detail or "the job finished instead"
            self._outcome(d, did, StoreOutcome.ABANDONED, detail, now)
            return ActResult(d, StoreOutcome.ABANDONED, detail, res, did)
        if d.action in (Action.SUSPEND, Action.PARK):
            self._close(jid, now, SliceEnd.QUANTUM)
            self.store.set_job_state(jid, JobState.SUSPENDED, at=now)
        elif d.action is Action.UNPARK and res.outcome is not Outcome.RUNNING:
            # Escalated: it did not unpark in time and went the requeue path (it stays suspended).
            detail = f"{res.outcome.value} in {res.seconds:.2f} s: {res.detail}"
            self.store.set_job_state(jid, JobState.SUSPENDED, at=now)
            self._outcome(d, did, StoreOutcome.FAILED, detail, now)
            log.warning("job %s: unpark -> %s", jid, detail)
            return ActResult(d, StoreOutcome.FAILED, detail, res, did)
        else:
            assert d.placement is not None
            if d.action not in (Action.START, Action.RESUME, Action.UNPARK):
                self._close_stopped(d, res, t0, now)
            self._open(jid, view_placement(res.placement, d.placement) or d.placement, now)
            self.store.set_job_state(jid, JobState.RUNNING, at=now)
        detail = f"{res.outcome.value} in {res.seconds:.2f} s" + (f": {res.detail}" if res.detail else "")
        self._outcome(d, did, StoreOutcome.SUCCEEDED, detail, now)
        log.info("job %s: %s -> %s", jid, d.action.value, detail)
        return ActResult(d, StoreOutcome.SUCCEEDED, detail, res, did)

    def _failed(self, d: Decision, did: int, exc: Exception) -> ActResult:
        self._done(d, did)
        now = self.clock()
        detail = str(exc) if isinstance(exc, GandivaError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, GandivaError):
            log.warning("job %s: %s failed: %s", d.job_id, d.action.value, detail)
        else:
            log.exception("job %s: %s failed", d.job_id, d.action.value)
        try:
            self._settle_after_failure(d, now)
            self._outcome(d, did, StoreOutcome.FAILED, detail, now)
        except Exception:
            log.exception("job %s: could not record the failure", d.job_id)
        return ActResult(d, StoreOutcome.FAILED, detail, None, did, limited=isinstance(exc, LimitRefusal))

    def _settle_after_failure(self, d: Decision, now: float) -> None:
        """A failed move may leave the job stopped: then its slice ended (the next tick decides again)."""
        if d.action in (Action.START, Action.RESUME):
            return
        try:
            job = self.backend.job(d.job_id)
        except GandivaError:
            return
        if job.pending:
            self._close(d.job_id, now, SLICE_END_FOR.get(d.action, SliceEnd.QUANTUM))
            self.store.set_job_state(d.job_id, JobState.SUSPENDED, at=now)
        elif job.finished:
            self._close(d.job_id, now, finished_slice_end(job.state))
            self.store.set_job_state(d.job_id, finished_job_state(job.state), at=now)

    def _slurm_state(self, job_id: str) -> str:
        try:
            return self.backend.job(job_id).state
        except GandivaError:
            return ""


def _put_done(events: queue.SimpleQueue[tuple[bool, int]], i: int, _fut: Future[ActResult]) -> None:
    events.put((True, i))


def _blocked(d: Decision, blocked: set[GpuRef], places: tuple[int, ...], unstopped: set[int]) -> str:
    """Why `d` must not run (empty: it may): its GPUs, or its array's place, are still held by a job that
    failed to stop."""
    if d.placement is not None and blocked.intersection(d.placement.gpus):
        return "skipped: its GPUs are still held by a job that failed to stop"
    if any(i in unstopped for i in places):
        return "skipped: its job array's place is still held by a task that failed to stop"
    return ""


def _tie_dependencies(
    decisions: list[Decision], held: Mapping[str, Placement], last: Mapping[str, Placement]
) -> list[set[int]]:
    """For each decision, the decisions of requeued jobs going to its node that had one of its GPUs'
    indices before (`_dependencies`, `ties`): those must be running again before it starts."""
    acting = {d.job_id: i for i, d in enumerate(decisions)}
    old_at: dict[str, tuple[frozenset[str], frozenset[int]]] = {}  # job -> (target nodes, old GPU indices)
    for d in decisions:
        before = held.get(d.job_id) or last.get(d.job_id)
        if before is not None and d.placement is not None and d.action is not Action.START:
            old_at[d.job_id] = (frozenset(d.placement.nodes), frozenset(g.index for g in before.gpus))
    out: list[set[int]] = []
    for d in decisions:
        want = set(d.placement.gpus) if d.placement is not None else set()
        out.append({
            acting[jid]
            for jid, (nodes, old) in old_at.items()
            if jid != d.job_id and any(g.node in nodes and g.index in old for g in want)
        })
    return out


def _tie_conflicts(
    decisions: list[Decision], held: Mapping[str, Placement], last: Mapping[str, Placement]
) -> dict[int, str]:
    """The resumes Slurm would never start (`ties`): a GPU of one of the job's old indices on its target node
    is held by a job that the plan leaves there, so the job would wait, PENDING on Resources, until that one
    stops. Each is skipped (no Slurm call, backed off one quantum) instead of holding up the round
    for the start timeout."""
    moving = {d.job_id: d for d in decisions if d.action is not Action.RESUME and d.action is not Action.START}
    out: dict[int, str] = {}
    for i, d in enumerate(decisions):
        before = last.get(d.job_id)
        if d.action is not Action.RESUME or before is None or d.placement is None:
            continue
        old = {g.index for g in before.gpus}
        nodes = set(d.placement.nodes)
        for jid, p in held.items():
            if jid == d.job_id:
                continue
            taken = {g for g in p.gpus if g.node in nodes and g.index in old}
            other = moving.get(jid)
            if other is not None and other.placement is not None:
                taken &= set(other.placement.gpus)  # where a move or resize leaves it, it still holds them
            elif other is not None:
                taken = set()  # suspended: it frees them
            if taken:
                g = min(taken, key=lambda r: (r.node, r.index))
                out[i] = (f"skipped: Slurm ties it to its old GPU index {g.index}, and {g} is held by job {jid}, "
                          "which stays (it would wait on Resources until that job stops)")
                break
    return out


def _dependencies(
    decisions: list[Decision],
    held: Mapping[str, Placement],
    last: Mapping[str, Placement] | None = None,
    *,
    ties: bool = True,
    groups: Mapping[str, str] | None = None,
    room: Mapping[str, int] | None = None,
) -> tuple[list[set[int]], dict[int, tuple[int, ...]]]:
    """For each decision (by index), the decisions that must be done before it starts; and for the starts
    that take a throttled array's place, the suspends that free it.

    - A decision waits for the decisions of the other jobs that hold any of its target GPUs now (`held`: a
      suspend, migrate or resize frees them).
    - `ties`: and for those of requeued jobs going to its node that had one of its GPUs' indices before.
      Slurm 22.05 keeps a requeued job's old GRES indices and does not start it on a node where a GPU of
      such an index is taken (README, Slurm facts): that job must be running before another job takes
      one. A requeued job's old GPUs are where it runs now (`held`, a migrate or resize) or where it last
      ran (`last`, a resume).
    - `groups` / `room`: Slurm leaves a task of an array that runs %MAX tasks pending (JobArrayTaskLimit).
      The first `room[array]` starts and resumes of its tasks (plan order) take free places; each later
      one waits for one suspend of a task of that array (in plan order), whose place it takes.
    Suspends depend on nothing. A cycle cannot be ordered (`Actor.execute` then runs what is left one at
    a time, in plan order).
    """
    acting = {d.job_id: i for i, d in enumerate(decisions)}
    tied = _tie_dependencies(decisions, held, last or {}) if ties else [set() for _ in decisions]
    deps: list[set[int]] = []
    for d, tie in zip(decisions, tied, strict=True):
        want = set(d.placement.gpus) if d.placement is not None else set()
        mine = {
            acting[jid] for jid, p in held.items() if jid != d.job_id and jid in acting and want.intersection(p.gpus)
        }
        deps.append(mine | tie)
    places: dict[int, tuple[int, ...]] = {}
    if groups:
        stops: dict[str, list[int]] = {}
        takes: dict[str, list[int]] = {}
        for i, d in enumerate(decisions):
            g = groups.get(d.job_id)
            if g is None:
                continue
            if d.action is Action.SUSPEND:
                stops.setdefault(g, []).append(i)
            elif d.action in (Action.START, Action.RESUME):
                takes.setdefault(g, []).append(i)
        for g, starts in takes.items():
            free = max(0, (room or {}).get(g, 0))
            for k, i in enumerate(starts[free:]):
                if k < len(stops.get(g, ())):
                    deps[i].add(stops[g][k])
                    places[i] = (stops[g][k],)
    return deps, places
