"""act + record: carry a Plan out through the requeue protocol, recording intent before and outcome after.

Suspends run concurrently (each job is signalled and waited for on its own thread, so N suspends take
about as long as the slowest one). The other decisions then run in waves: a decision waits for the
decisions of the jobs that still hold any of its target GPUs (a migrate or resize frees them); each wave
runs concurrently, so N starts cost about one Slurm scheduling pass instead of N. A failing decision is
logged, recorded as failed and isolated: the rest of the plan still runs, except decisions that would
take GPUs a job that failed to stop still holds.

Test hook: GANDIVA_CRASH_AT makes the process `os._exit(137)` at one point, to test crash recovery:
`<op>:<step>[:start|end]` (a protocol step, e.g. `suspend:signal`, `resume:release:start`; default
`end`) or `[<action>:]intent` / `[<action>:]outcome` (after the intent is recorded / after the operation,
before its outcome is recorded).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from slurm_gandiva.errors import GandivaError
from slurm_gandiva.model import GpuRef, JobState, Placement
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.requeue.protocol import OpResult, Outcome, Step, StepEvent, StepEventKind
from slurm_gandiva.slurm.base import SlurmBackend
from slurm_gandiva.store.api import Outcome as StoreOutcome
from slurm_gandiva.store.api import SliceEnd, StoreApi

log = logging.getLogger(__name__)

CRASH_ENV = "GANDIVA_CRASH_AT"
CRASH_EXIT = 137

SLICE_END_FOR = {
    Action.SUSPEND: SliceEnd.QUANTUM,
    Action.MIGRATE: SliceEnd.MIGRATE,
    Action.RESIZE: SliceEnd.RESIZE,
    Action.PACK: SliceEnd.PACK,
    Action.UNPACK: SliceEnd.PACK,
}
# Steps that belong to the resume half of an operation (the old slice ended before the first of them).
_RESUME_STEPS = frozenset({Step.SET_PLACEMENT, Step.CLEAR_BEGIN, Step.RELEASE, Step.WAIT_RUNNING, Step.VERIFY})


class MetricsLike(Protocol):
    """The event side of slurm_gandiva.report.metrics.Metrics."""

    def slice_started(self) -> None: ...

    def slice_ended(self, reason: str | SliceEnd) -> None: ...

    def decision(self, action: Action, outcome: str | StoreOutcome) -> None: ...

    def step(self, step: str | Step, seconds: float, *, ok: bool = True) -> None: ...


class ProtocolLike(Protocol):
    """What the actor needs of slurm_gandiva.requeue.protocol.RequeueProtocol."""

    def suspend(self, job_id: str) -> OpResult: ...

    def resume(self, job_id: str, placement: Placement) -> OpResult: ...

    def migrate(self, job_id: str, placement: Placement) -> OpResult: ...

    def resize(self, job_id: str, placement: Placement) -> OpResult: ...


class JobSignals:
    """A ProtocolLike that stops each job with the signal that job catches (`gandiva sbatch --signal`,
    recorded with the job; the configured signal for jobs without one).

    RequeueProtocol sends one signal; this keeps one protocol per signal, made by `make(signal)`, and
    routes every operation on a job to the protocol of its signal. A job's signal never changes, so each
    job's credential-guard bookkeeping stays within one protocol.
    """

    def __init__(self, make: Callable[[str], ProtocolLike], signal_of: Callable[[str], str], default: str) -> None:
        self.make = make
        self.signal_of = signal_of
        self.default = default
        self._by_signal: dict[str, ProtocolLike] = {}
        self._lock = threading.Lock()

    def signal_for(self, job_id: str) -> str:
        """The signal `job_id` is stopped with."""
        try:
            return self.signal_of(job_id) or self.default
        except Exception:
            log.exception("job %s: its signal is unknown; using the configured %s", job_id, self.default)
            return self.default

    def protocol_for(self, job_id: str) -> ProtocolLike:
        sig = self.signal_for(job_id)
        with self._lock:
            if sig not in self._by_signal:
                self._by_signal[sig] = self.make(sig)
            return self._by_signal[sig]

    def configure(self, default: str, **settings: float) -> None:
        """A reload: the configured signal and protocol settings (e.g. suspend_timeout) for every protocol."""
        with self._lock:
            self.default = default
            for proto in self._by_signal.values():
                for name, value in settings.items():
                    if hasattr(proto, name):
                        setattr(proto, name, value)

    def suspend(self, job_id: str) -> OpResult:
        return self.protocol_for(job_id).suspend(job_id)

    def resume(self, job_id: str, placement: Placement) -> OpResult:
        return self.protocol_for(job_id).resume(job_id, placement)

    def migrate(self, job_id: str, placement: Placement) -> OpResult:
        return self.protocol_for(job_id).migrate(job_id, placement)

    def resize(self, job_id: str, placement: Placement) -> OpResult:
        return self.protocol_for(job_id).resize(job_id, placement)


@dataclass(frozen=True)
class ActResult:
    """How one decision went."""

    decision: Decision
    outcome: StoreOutcome
    detail: str = ""
    op: OpResult | None = None
    decision_id: int | None = None

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
        self.protocol: ProtocolLike | None = None
        self.metrics = metrics
        self._lock = threading.Lock()
        self._decision_of: dict[str, int] = {}  # job id -> decision id while its operation runs
        self._open_steps: dict[tuple[str, str], int] = {}  # (job id, step) -> step record id

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
    ) -> tuple[ActResult, ...]:
        """Run every decision of `plan`; `held` maps running jobs to their GPUs (to isolate failed suspends
        and order moves), `last` the jobs it resumes to where they last ran (to order starts, see _waves);
        `ties`: Slurm ties requeued jobs to their old GPU indices (`SlurmCapabilities`)."""
        if self.protocol is None:
            raise RuntimeError("Actor.protocol is not set")
        results: list[ActResult] = []
        blocked: set[GpuRef] = set()
        suspends = plan.by_action(Action.SUSPEND)
        if suspends:
            for r in self._run_all(list(suspends)):
                results.append(r)
                if not r.ok and held and r.decision.job_id in held:
                    blocked.update(held[r.decision.job_id].gpus)
        rest = [d for d in plan.decisions if d.action is not Action.SUSPEND]
        for wave in _waves(rest, held or {}, last or {}, ties=ties):
            if self.should_stop():
                log.info("stopping: %d decisions of this plan not started", len(plan) - len(results))
                break
            runnable: list[Decision] = []
            for d in wave:
                if d.placement is not None and blocked.intersection(d.placement.gpus):
                    detail = "skipped: its GPUs are still held by a job that failed to stop"
                    log.warning("job %s: %s %s", d.job_id, d.action.value, detail)
                    self.store.record_event("skipped", d.job_id, f"{d.action.value}: {detail}", self.clock())
                    results.append(ActResult(d, StoreOutcome.FAILED, detail))
                else:
                    runnable.append(d)
            for r in self._run_all(runnable):
                results.append(r)
                if not r.ok and held and r.decision.job_id in held:
                    blocked.update(held[r.decision.job_id].gpus)
        return tuple(results)

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

    def _run_all(self, ds: list[Decision]) -> list[ActResult]:
        """Record every intent, then carry the decisions out concurrently (results in `ds`'s order)."""
        done: dict[int, ActResult] = {}
        todo: list[tuple[int, Decision, int]] = []
        for i, d in enumerate(ds):
            try:
                todo.append((i, d, self._intent(d)))
            except Exception as exc:
                log.exception("job %s: could not record the intent; not acting", d.job_id)
                done[i] = ActResult(d, StoreOutcome.FAILED, f"intent not recorded: {exc}")
        if len(todo) == 1:
            i, d, did = todo[0]
            done[i] = self._run(d, did)
        elif todo:
            with ThreadPoolExecutor(max_workers=min(16, len(todo)), thread_name_prefix="act") as pool:
                futures = {i: pool.submit(self._run, d, did) for i, d, did in todo}
                done.update({i: f.result() for i, f in futures.items()})
        return [done[i] for i in range(len(ds))]

    def _run(self, d: Decision, did: int) -> ActResult:
        """Carry out one decision whose intent is recorded; never raises."""
        assert self.protocol is not None
        t0 = self.clock()
        try:
            res = self._call(d)
        except Exception as exc:
            return self._failed(d, did, exc)
        finally:
            self._done(d, did)
        self._crash(d.action, "outcome")
        try:
            return self._record(d, did, res, t0)
        except Exception as exc:
            log.exception("job %s: %s done but not recorded", d.job_id, d.action.value)
            return ActResult(d, StoreOutcome.FAILED, f"not recorded: {exc}", res, did)

    def _call(self, d: Decision) -> OpResult:
        assert self.protocol is not None
        if d.action is Action.SUSPEND:
            return self.protocol.suspend(d.job_id)
        assert d.placement is not None, f"{d.action.value} without a placement"
        if d.action in (Action.START, Action.RESUME):
            return self.protocol.resume(d.job_id, d.placement)
        if d.action is Action.RESIZE:
            return self.protocol.resize(d.job_id, d.placement)
        return self.protocol.migrate(d.job_id, d.placement)

    def _close(self, job_id: str, end: float, reason: SliceEnd) -> None:
        if self.store.close_slice(job_id, end, reason) is not None and self.metrics is not None:
            self.metrics.slice_ended(reason)

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
        if d.action is Action.SUSPEND:
            self._close(jid, now, SliceEnd.QUANTUM)
            self.store.set_job_state(jid, JobState.SUSPENDED, at=now)
        else:
            assert d.placement is not None
            if d.action not in (Action.START, Action.RESUME):
                # The old slice ended when the job stopped: after the suspend half of the operation.
                stop_s = sum(s.seconds for s in res.steps if s.step not in _RESUME_STEPS)
                self._close(jid, min(now, t0 + stop_s), SLICE_END_FOR[d.action])
            self._open(jid, res.placement or d.placement, now)
            self.store.set_job_state(jid, JobState.RUNNING, at=now)
        detail = f"{res.outcome.value} in {res.seconds:.2f} s" + (f": {res.detail}" if res.detail else "")
        self._outcome(d, did, StoreOutcome.SUCCEEDED, detail, now)
        log.info("job %s: %s -> %s", jid, d.action.value, detail)
        return ActResult(d, StoreOutcome.SUCCEEDED, detail, res, did)

    def _failed(self, d: Decision, did: int, exc: Exception) -> ActResult:
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
        return ActResult(d, StoreOutcome.FAILED, detail, None, did)

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


def _waves(
    decisions: list[Decision], held: dict[str, Placement], last: dict[str, Placement] | None = None,
    *, ties: bool = True,
) -> list[list[Decision]]:
    """`decisions` in waves: one waits for the decisions of the jobs that hold its target GPUs now, and
    (`ties`) for those of requeued jobs going to its node that had one of its GPUs' indices before.

    Slurm 22.05 keeps a requeued job's old GRES indices and does not start it on a node where a GPU of
    such an index is taken (README, Slurm facts): that job must be running before another job takes
    one. A requeued job's old GPUs are where it runs now (`held`, a migrate or resize) or where it last
    ran (`last`, a resume). Within a wave no decision targets GPUs held by a job with a decision still
    to come. A cycle cannot be ordered: what is left then runs one at a time, in plan order.
    """
    last = last or {}
    acting = {d.job_id for d in decisions}
    old_at: dict[str, tuple[str, frozenset[int]]] = {}  # job -> (target node, old GPU indices)
    for d in decisions:
        before = held.get(d.job_id) or last.get(d.job_id)
        if ties and before is not None and d.placement is not None and d.action is not Action.START:
            old_at[d.job_id] = (d.placement.nodes[0], frozenset(g.index for g in before.gpus))
    deps: dict[int, set[str]] = {}
    for i, d in enumerate(decisions):
        want = set(d.placement.gpus) if d.placement is not None else set()
        deps[i] = {
            jid for jid, p in held.items() if jid != d.job_id and jid in acting and want.intersection(p.gpus)
        }
        deps[i] |= {
            jid
            for jid, (node, old) in old_at.items()
            if jid != d.job_id and any(g.node == node and g.index in old for g in want)
        }
    waves: list[list[Decision]] = []
    left = list(range(len(decisions)))
    done: set[str] = set()
    while left:
        ready = [i for i in left if deps[i] <= done]
        if not ready:
            waves.extend([decisions[i]] for i in left)
            break
        waves.append([decisions[i] for i in ready])
        done.update(decisions[i].job_id for i in ready)
        left = [i for i in left if i not in ready]
    return waves
