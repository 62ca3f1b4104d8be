"""Settle every difference between the store and Slurm.

`recover` runs once at startup, before the first tick: it finishes or rolls back decisions a crash left
without an outcome (every protocol operation is idempotent, so "finish" means running it again).
`settle` runs at startup and at the start of every tick: it registers new marked jobs, admin-holds the
ones only a user hold (or nothing) keeps from Slurm's own scheduling, and brings the store's job states
and slices in line with what Slurm shows (finished, cancelled by the user, requeued by Slurm after a
node failure, adopted after a crash between release and record).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gandiva.controller.act import SLICE_END_FOR, finished_job_state, finished_slice_end, job_signal
from slurm_gandiva.controller.arrays import Untracked, array_window
from slurm_gandiva.controller.cohold import ParkedJobs, same_place, slurm_placement, view_placement
from slurm_gandiva.controller.observe import held_placement, is_managed, requested_gpu_count
from slurm_gandiva.errors import GandivaError, JobFileError
from slurm_gandiva.model import GpuRef, JobState, Placement, placeable
from slurm_gandiva.plan import Action
from slurm_gandiva.requeue.contract import JobFiles, suspend_signal
from slurm_gandiva.requeue.namespace import JobPaths, job_paths
from slurm_gandiva.requeue.operations import Operations, Outcome, Phase, phase
from slurm_gandiva.requeue.safe_read import MAX_TAIL_BYTES, read_job_outcome, read_job_text
from slurm_gandiva.requeue.spec import fallback_spec, load_spec_file
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SlurmJob, SlurmNode, Snapshot
from slurm_gandiva.slurm.gres import gres_gpu_count
from slurm_gandiva.store.api import DecisionRecord, JobRecord, SliceEnd, SliceRecord, StoreApi
from slurm_gandiva.store.api import Outcome as StoreOutcome

log = logging.getLogger(__name__)

# New jobs registered per round at most (each reads its spec and writes its record): the rest register in
# the next rounds, so a round after a 10,000-task array is submitted stays about a second long. The budget
# is shared between the users with jobs to register (`fair_shares`): volume buys no one a place ahead.
MAX_REGISTRATIONS = 500
# How long a marked job may wait for `gandiva sbatch` to write its spec file before it is taken as a
# plain sbatch job (rigid, GPU count from Slurm).
SPEC_GRACE_S = 10.0


class ManagedJobs:
    """The managed jobs of a snapshot (`is_managed`), job id -> SlurmJob in Slurm's order, worked out once
    per snapshot: the reconciler's settle and the controller's observe read the same snapshot in a
    round (10,000 jobs: 10-25 ms each time). The tracked ones (`of`) leave out each throttled array's
    never-run tail past its window (`arrays.array_window`; summarised in `untracked`)."""

    def __init__(self, partitions: Iterable[str]) -> None:
        self.partitions = tuple(partitions)
        self._jobs: tuple[SlurmJob, ...] | None = None  # the snapshot's jobs last filtered (held: no id reuse)
        self._all: dict[str, SlurmJob] = {}
        self._managed: dict[str, SlurmJob] = {}
        self.untracked: dict[str, Untracked] = {}  # array id -> its tasks past the window (last snapshot)

    def _update(self, snap: Snapshot) -> None:
        if snap.jobs is not self._jobs:
            self._all = {j.job_id: j for j in snap.jobs if is_managed(j, self.partitions)}
            self._managed, self.untracked = array_window(self._all)
            self._jobs = snap.jobs

    def of(self, snap: Snapshot) -> dict[str, SlurmJob]:
        """Job id -> SlurmJob of `snap`'s tracked managed jobs (finished ones included); do not modify it."""
        self._update(snap)
        return self._managed

    def all_of(self, snap: Snapshot) -> dict[str, SlurmJob]:
        """Job id -> SlurmJob of all `snap`'s managed jobs, the untracked array tasks too; do not modify it."""
        self._update(snap)
        return self._all


@dataclass(frozen=True)
class Finding:
    """One difference found and settled (also recorded as a store event)."""

    kind: str
    job_id: str
    detail: str


def spec_refusal(min_gpus: int, max_gpus: int, partition: str, nodes: Sequence[SlurmNode]) -> str | None:
    """Why the cluster can never run a job of `min_gpus`..`max_gpus` GPUs on the nodes of `partition` (any
    of a comma-separated list; "" any node), or None when it can: on one node, or evenly over several (a job
    across nodes gets the same GPUs on each). GPUs per node are Slurm's configured ones, whatever the node's
    state (a node that is down may come back); unknown (no node reports a GPU): None. Shared by registration
    (the job is not registered) and `gandiva squeue` (the REASON column)."""

    if min_gpus < 1 or max_gpus < min_gpus:
        return f"refused: the spec asks for {min_gpus}:{max_gpus} GPUs; fix the spec file or cancel the job"
    counts = {n.name: gres_gpu_count(n.gres) for n in nodes}
    if not any(counts.values()):
        return None
    parts = {p for p in partition.split(",") if p}
    inside = [counts[n.name] for n in nodes if not parts or parts.intersection(n.partitions)]
    if not placeable(min_gpus, inside):
        where = f"partition {partition}" if parts else "the cluster"
        sizes = "/".join(str(n) for n in sorted(set(inside))) or "0"
        return (f"refused: asks for {min_gpus} GPUs, which the nodes of {where} ({sizes} GPUs each) cannot hold "
                "evenly; fix the spec file (it is read again) or cancel the job")
    return None


def fair_shares(waiting: Mapping[str, int], budget: int, turn: int = 0) -> dict[str, int]:
    """User -> how many of their `waiting` jobs to register out of `budget`: max-min fair (a user with fewer
    than an even share gets them all, the others split the rest evenly). A remainder too small to split
    goes one each to the users in name order from the `turn`-th on (the caller turns it round each round),
    so even a budget of 1 reaches every user in turn."""
    users = sorted(u for u, n in waiting.items() if n > 0)
    if not users:
        return {}
    k = turn % len(users)
    active = users[k:] + users[:k]
    shares = dict.fromkeys(users, 0)
    left = budget
    while left > 0 and active:
        each = max(1, left // len(active))
        more: list[str] = []
        for u in active:
            give = min(each, waiting[u] - shares[u], left)
            shares[u] += give
            left -= give
            if shares[u] < waiting[u]:
                more.append(u)
        active = more
    return shares


def _listed(snap: Snapshot, job_id: str) -> SlurmJob | None:
    """The job `snap` lists as `job_id` (a linear search: for the rare job no longer managed)."""
    return next((j for j in snap.jobs if j.job_id == job_id), None)


def _status_outcome(files: JobFiles, owner: str) -> str | None:
    """The wrapper's last reported outcome; None when there is none or the file is refused (logged)."""
    try:
        return read_job_outcome(files.status, owner=owner)
    except JobFileError as exc:
        log.warning("reconcile: %s", exc)
        return None


class Reconciler:
    """Brings the store in line with Slurm; see the module docstring."""

    def __init__(
        self,
        backend: SlurmBackend,
        store: StoreApi,
        *,
        partitions: Iterable[str],
        jobs_root: Path,
        clock: Callable[[], float],
        spec_grace: float = SPEC_GRACE_S,
        stop_timeout: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        max_registrations: int = MAX_REGISTRATIONS,
    ) -> None:
        self.backend = backend
        self.store = store
        self.partitions = tuple(partitions)
        self.jobs_root = jobs_root
        self.clock = clock
        self.spec_grace = spec_grace
        self.stop_timeout = stop_timeout
        self.sleep = sleep
        self._refused_specs: dict[str, str] = {}  # job id -> why its spec file was refused (noted once)
        self._unsatisfiable: dict[str, str] = {}  # job id -> why its spec cannot ever run (noted once)
        self._nodes: tuple[SlurmNode, ...] = ()  # Slurm's nodes in the snapshot being settled
        self.max_registrations = max_registrations
        self._shares: dict[str, int] = {}  # user -> how many of their jobs the round being settled registers
        self._registered: Counter[str] = Counter()  # user -> jobs registered in the round being settled
        self._rounds = 0  # rounds settled: who gets a budget's remainder turns round
        self._arrays_held: set[str] = set()  # arrays held whole in the last round
        self.managed = ManagedJobs(self.partitions)
        self.parked = ParkedJobs(store)  # the controller hands in the observer's (one memo of parked jobs)
        self.co_hold = 0  # a recovered start on up to this many whole GPUs holds shards (`cohold.co_hold_gpus`)

    def _note(self, out: list[Finding], kind: str, job_id: str, detail: str) -> None:
        log.info("reconcile: job %s: %s: %s", job_id, kind, detail)
        out.append(Finding(kind, job_id, detail))
        try:
            self.store.record_event(f"reconcile-{kind}", job_id, detail, self.clock())
        except Exception:
            log.exception("could not record a reconcile event")

    # -- every tick -------------------------------------------------------------------------------------
    def settle(self, snap: Snapshot, starting: Collection[str] = ()) -> tuple[Finding, ...]:
        """Register, hold and account for every managed job; errors are isolated per job. `starting`: jobs
        whose start runs on from an earlier round (`Actor.starting`): that start settles them, not this."""
        out: list[Finding] = []
        now = self.clock()
        self._nodes = tuple(snap.nodes)
        everything = self.managed.all_of(snap)
        managed = self.managed.of(snap)
        # One read per kind of record for the round: settling a job writes only that job's records, and
        # the loop below visits each job once, so what was read stays true for the jobs not yet visited.
        records = self.store.jobs_by_id(managed)
        current = self.store.open_slices(records)
        busy = {managed[jid].array_id for jid in starting if jid in managed and managed[jid].array_id}
        held = self._hold_arrays((j for j in everything.values() if j.array_id not in busy), out)
        if len(everything) != len(managed):  # an untracked task an array hold missed: held one by one
            for jid, sj in everything.items():
                if jid not in managed and sj.pending and sj.hold is not HoldKind.ADMIN and sj.array_id not in held:
                    try:
                        self.backend.hold(jid)
                    except Exception:
                        log.exception("reconcile: job %s: admin hold failed; will retry next tick", jid)
        self._shares = fair_shares(
            Counter(sj.user for jid, sj in managed.items() if jid not in records and jid not in starting
                    and not sj.finished),
            self.max_registrations, self._rounds,
        )
        self._registered = Counter()
        self._rounds += 1
        for sj in managed.values():
            if sj.job_id in starting:
                continue  # pending (held until its begin time, or released): not to be held or requeued
            rec = records.get(sj.job_id)
            if (
                rec is not None and sj.pending and sj.hold is HoldKind.ADMIN and rec.state is not JobState.RUNNING
                and sj.job_id not in current
            ):
                continue  # a waiting job, admin-held and stored as waiting: nothing to settle (most of them)
            try:
                self._settle_slurm_job(sj, rec, current.get(sj.job_id), now, out, held)
            except Exception:
                log.exception("reconcile: job %s failed; will retry next tick", sj.job_id)
        for rec in self.store.list_jobs(states=[JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED]):
            if rec.job_id in managed or rec.job_id in starting:
                continue
            try:
                self._settle_vanished(rec, everything.get(rec.job_id) or _listed(snap, rec.job_id), now, out)
            except Exception:
                log.exception("reconcile: job %s failed; will retry next tick", rec.job_id)
        return tuple(out)

    def _hold_arrays(self, jobs: Iterable[SlurmJob], out: list[Finding]) -> set[str]:
        """Admin-hold the waiting tasks of each job array with one `scontrol hold ARRAY` (a 10,000-task
        array is one call, not 10,000); returns the arrays held."""
        waiting: dict[str, int] = {}
        for sj in jobs:
            if sj.array_id and sj.pending and sj.hold is not HoldKind.ADMIN:
                waiting[sj.array_id] = waiting.get(sj.array_id, 0) + 1
        held: set[str] = set()
        for array, n in waiting.items():
            if array in self._arrays_held:
                continue  # held whole last round, yet tasks still wait unheld (split off?): one by one
            try:
                self.backend.hold(array)
            except Exception:
                log.exception("reconcile: array %s: admin hold failed; its tasks are held one by one", array)
                continue
            held.add(array)
            self._note(out, "admin-hold", array, f"{n} waiting task(s) of array {array} had no admin hold")
        self._arrays_held = held
        return held

    def _register(self, sj: SlurmJob, now: float, out: list[Finding]) -> JobRecord | None:
        paths: JobPaths | None = None
        try:
            paths = job_paths(self.jobs_root, sj.job_id, sj.comment, sj.user)
            spec = load_spec_file(paths.spec, sj.job_id, owner=sj.user)
        except JobFileError as exc:
            if self._refused_specs.get(sj.job_id) != str(exc):
                self._refused_specs[sj.job_id] = str(exc)
                self._note(out, "spec-refused", sj.job_id, str(exc))
            if paths is None:
                return None  # its directory is refused: it waits, held, with the reason (scancel ends it)
            spec = None
        asked = spec.signal if spec is not None else ""
        if spec is None:
            if sj.submit_time and now - sj.submit_time < self.spec_grace and not sj.running:
                return None  # gandiva sbatch writes the spec right after sbatch returns
            spec = fallback_spec(sj.job_id, sj.user, requested_gpu_count(sj) or 1, sj.submit_time, sj.name)
        job_spec = spec.to_job_spec(submit_time=sj.submit_time or spec.submitted)
        why = spec_refusal(job_spec.min_gpus, job_spec.max_gpus, sj.partition, self._nodes)
        if why is not None:
            # Not registered: it stays admin-held with the reason shown in `gandiva squeue`, and the spec is
            # read again every round (a fixed spec registers it; scancel ends it).
            if self._unsatisfiable.get(sj.job_id) != why:
                self._unsatisfiable[sj.job_id] = why
                self._note(out, "spec-unsatisfiable", sj.job_id, why)
            return None
        self._unsatisfiable.pop(sj.job_id, None)
        rec = self.store.upsert_job(
            replace(job_spec, account=sj.account, qos=sj.qos),  # Slurm's record holds them, not the spec
            at=now,
            state=JobState.QUEUED,
            partition=sj.partition,
            state_dir=str(paths.state_dir),
            signal=self._job_signal(sj, asked, out),
        )
        self._note(out, "registered", sj.job_id, f"{job_spec.min_gpus}:{job_spec.max_gpus} GPUs, user {sj.user}")
        return rec

    def _job_signal(self, sj: SlurmJob, asked: str, out: list[Finding]) -> str:
        """The signal the job's wrapper catches, as `gandiva sbatch --signal` recorded it in the spec ("" for
        a job without a spec: the controller's configured signal). One a job cannot be suspended with (a
        spec edited after submission) is noted and replaced by the configured signal."""
        if not asked:
            return ""
        try:
            return suspend_signal(asked).name.removeprefix("SIG")
        except ValueError as exc:
            self._note(out, "signal-refused", sj.job_id, f"{exc}; suspending it with the configured signal")
            return ""

    def _settle_slurm_job(
        self,
        sj: SlurmJob,
        rec: JobRecord | None,
        current: SliceRecord | None,
        now: float,
        out: list[Finding],
        held_arrays: Collection[str] = (),
    ) -> None:
        """Settle one job Slurm lists, given its stored record and open slice (None: none)."""
        jid = sj.job_id
        if sj.pending and sj.hold is not HoldKind.ADMIN and sj.array_id not in held_arrays:
            # job_submit.lua's hold is a user hold, a node failure requeues unheld: the controller decides.
            self.backend.hold(jid)
            self._note(out, "admin-hold", jid, f"was {sj.reason or 'pending'} with a {sj.hold.value} hold")
        if rec is None and sj.finished:
            return  # finished before this controller ever saw it: nothing to manage
        if rec is None:
            if self._registered[sj.user] >= self._shares.get(sj.user, 0):
                return  # registered in a later round: a 10,000-task array must not stall this one, nor others
            rec = self._register(sj, now, out)
            if rec is None:
                return
            self._registered[sj.user] += 1
        if sj.finished:
            end = sj.end_time or now
            reason = finished_slice_end(sj.state)
            if current is not None:
                self.store.close_slice(jid, max(end, current.start), reason)
            if rec.state is not finished_job_state(sj.state):
                self.store.set_job_state(jid, finished_job_state(sj.state), at=now)
                self._note(out, reason.value, jid, f"Slurm shows {sj.state}")
            return
        if sj.running:
            placement = held_placement(sj)
            if placement is None:
                return
            if current is None and self.parked.is_parked(rec, sj, has_open_slice=False):
                return  # parked on co-held GPUs: Slurm runs it, the store has it suspended (controller.cohold)
            if current is not None and not same_place(current.placement, placement):
                self.store.close_slice(jid, now, SliceEnd.REQUEUED)
                self._note(out, "moved", jid, f"store had {current.placement}, Slurm shows {placement}")
                current = None
            if current is None:
                start = sj.start_time if sj.start_time and sj.start_time <= now else now
                self.store.open_slice(jid, placement, start)
                self._note(out, "adopted", jid, f"running on {placement} without an open slice")
            if rec.state is not JobState.RUNNING:
                self.store.set_job_state(jid, JobState.RUNNING, at=now)
            return
        if sj.pending and current is not None:
            self.store.close_slice(jid, now, SliceEnd.REQUEUED)
            self._note(out, "requeued", jid, f"pending ({sj.reason}) while the store had it running")
        if sj.pending and rec.state is JobState.RUNNING:
            self.store.set_job_state(jid, JobState.SUSPENDED, at=now)

    def _settle_vanished(self, rec: JobRecord, sj: SlurmJob | None, now: float, out: list[Finding]) -> None:
        """A job the store has as active that Slurm no longer lists managed (gone, or unmarked), or lists as
        an untracked array task (`sj`: what Slurm lists of it, None: nothing)."""
        if sj is not None and not sj.finished:
            return  # still there but no longer managed (comment or partition changed): leave it be
        outcome = _status_outcome(JobFiles(Path(rec.state_dir)), rec.user) if rec.state_dir else None
        if sj is not None:
            reason = finished_slice_end(sj.state)
        elif outcome == "done":
            reason = SliceEnd.DONE
        elif outcome == "failed":
            reason = SliceEnd.FAILED
        else:
            reason = SliceEnd.CANCELLED
        state = {SliceEnd.DONE: JobState.DONE, SliceEnd.FAILED: JobState.FAILED}.get(reason, JobState.CANCELLED)
        self.store.close_slice(rec.job_id, now, reason)
        self.store.set_job_state(rec.job_id, state, at=now)
        self._note(out, reason.value, rec.job_id, "no longer in Slurm's queue" if sj is None else sj.state)

    # -- startup --------------------------------------------------------------------------------------------
    def recover(self, snap: Snapshot, protocol: Operations) -> tuple[Finding, ...]:
        """Finish or roll back every decision left without an outcome (oldest first)."""
        out: list[Finding] = []
        jobs = {j.job_id: j for j in snap.jobs}
        for d in self.store.open_intents():
            try:
                self._recover_one(d, jobs, protocol, out)
            except Exception as exc:
                log.exception("recover: decision %d (job %s) failed", d.id, d.job_id)
                self.store.record_outcome(d.id, StoreOutcome.FAILED, f"recovery failed: {exc}", self.clock())
                self._note(out, "recovery-failed", d.job_id, str(exc))
        return tuple(out)

    def _recover_one(
        self, d: DecisionRecord, jobs: Mapping[str, SlurmJob], protocol: Operations, out: list[Finding]
    ) -> None:
        sj = jobs.get(d.job_id)
        if sj is None:
            sj = self._fresh(d.job_id)
        if sj is None or sj.finished:
            self.store.record_outcome(d.id, StoreOutcome.ABANDONED, "the job is gone", self.clock())
            self._note(out, "abandoned", d.job_id, f"{d.action.value}: the job finished meanwhile")
            return
        if d.action in (Action.PARK, Action.UNPARK):
            self._recover_switch(d, protocol, out)
            return
        ph = phase(sj)
        stops = d.action not in (Action.START, Action.RESUME)
        if ph is Phase.RUNNING and stops and self._signalled(d):
            # A second signal would hit a wrapper that is already checkpointing: wait for it instead.
            ph = self._await_stop(d, out)
        if d.action is Action.SUSPEND:
            res = protocol.suspend(d.job_id, signal=job_signal(self.store, d.job_id))  # idempotent: skips what is done
            now = self.clock()
            if res.outcome is Outcome.FINISHED:
                self.store.record_outcome(d.id, StoreOutcome.ABANDONED, res.detail, now)
                return
            self.store.close_slice(d.job_id, now, SliceEnd.QUANTUM)
            self.store.set_job_state(d.job_id, JobState.SUSPENDED, at=now)
            self.store.record_outcome(d.id, StoreOutcome.SUCCEEDED, f"finished after restart (was {ph.value})", now)
            self._note(out, "finished-suspend", d.job_id, f"was {ph.value}")
            return
        assert d.placement is not None
        target = d.placement
        held = held_placement(sj)
        if ph is Phase.RUNNING and held is not None and same_place(target, held):
            self._record_running(d, target, f"already running on {target} (was {ph.value})", out)
            return
        where = slurm_placement(target, self.co_hold)
        if self._gpus_taken(where, d.job_id, jobs.values()):
            self._roll_back(d, sj, protocol, out)
            return
        if d.action in (Action.START, Action.RESUME):
            res = protocol.resume(d.job_id, where)
        elif d.action is Action.RESIZE:
            res = protocol.resize(d.job_id, where, signal=job_signal(self.store, d.job_id))
        else:
            res = protocol.migrate(d.job_id, where, signal=job_signal(self.store, d.job_id))
        if res.outcome is Outcome.FINISHED:
            self.store.record_outcome(d.id, StoreOutcome.ABANDONED, res.detail, self.clock())
            return
        at = view_placement(res.placement, target) or target
        self._record_running(d, at, f"finished after restart (was {ph.value})", out)

    def _recover_switch(self, d: DecisionRecord, protocol: Operations, out: list[Finding]) -> None:
        """Finish a park or unpark cut short (both idempotent: a job that already switched is left as it is).
        Intents are recorded in order (an unpark's only after the park of the job it replaces is done), so
        finishing them oldest first never leaves two jobs computing on co-held GPUs."""
        res = protocol.park(d.job_id) if d.action is Action.PARK else protocol.unpark(d.job_id)
        now = self.clock()
        if res.outcome is Outcome.FINISHED:
            self.store.record_outcome(d.id, StoreOutcome.ABANDONED, res.detail, now)
            return
        detail = f"{res.outcome.value} after restart"
        if d.action is Action.UNPARK and res.outcome is Outcome.RUNNING:
            assert d.placement is not None
            self._record_running(d, d.placement, detail, out)
            return
        self.store.close_slice(d.job_id, now, SliceEnd.QUANTUM)
        self.store.set_job_state(d.job_id, JobState.SUSPENDED, at=now)
        ok = d.action is Action.PARK
        self.store.record_outcome(d.id, StoreOutcome.SUCCEEDED if ok else StoreOutcome.FAILED, detail, now)
        self._note(out, f"finished-{d.action.value}", d.job_id, detail)

    def _signalled(self, d: DecisionRecord) -> bool:
        """Whether the crashed controller already signalled the job for decision `d` (store or wrapper says so)."""
        for st in self.store.steps(d.id):
            if st.step == "signal" and st.end is not None and not st.detail.startswith(("not sent", "error")):
                return True
        rec = self.store.get_job(d.job_id)
        events = JobFiles(Path(rec.state_dir) if rec and rec.state_dir else self.jobs_root / d.job_id).events
        try:
            text = read_job_text(events, owner=rec.user if rec else "root", max_bytes=MAX_TAIL_BYTES, tail=True)
        except JobFileError as exc:
            log.warning("recover: %s", exc)
            return False
        lines = (text or "").splitlines()
        for line in reversed(lines):
            try:
                ev = json.loads(line)
                at = float(ev.get("time", 0)) if isinstance(ev, dict) and ev.get("event") == "signal" else None
            except (ValueError, TypeError, RecursionError):
                continue
            if at is not None and at >= d.intent_at:
                return True
        return False

    def _await_stop(self, d: DecisionRecord, out: list[Finding]) -> Phase:
        """Wait (up to stop_timeout) for a signalled job to requeue-hold itself; returns its phase."""
        deadline = self.clock() + self.stop_timeout
        ph = Phase.RUNNING
        while True:
            sj = self._fresh(d.job_id)
            ph = phase(sj) if sj is not None else Phase.FINISHED
            if ph is not Phase.RUNNING and ph is not Phase.STOPPING:
                break
            if self.clock() >= deadline:
                break
            self.sleep(0.2)
        self._note(out, "awaited-signal", d.job_id, f"already signalled before the crash; now {ph.value}")
        return ph

    def _record_running(self, d: DecisionRecord, placement: Placement, detail: str, out: list[Finding]) -> None:
        now = self.clock()
        cur = self.store.current_slice(d.job_id)
        if cur is not None and cur.placement != placement:
            self.store.close_slice(d.job_id, now, SLICE_END_FOR.get(d.action, SliceEnd.REQUEUED))
        self.store.open_slice(d.job_id, placement, now)
        self.store.set_job_state(d.job_id, JobState.RUNNING, at=now)
        self.store.record_outcome(d.id, StoreOutcome.SUCCEEDED, detail, now)
        self._note(out, f"finished-{d.action.value}", d.job_id, detail)

    def _roll_back(self, d: DecisionRecord, sj: SlurmJob, protocol: Operations, out: list[Finding]) -> None:
        """The target GPUs went to someone else: leave the job suspended; the next tick decides again."""
        if phase(sj) in (Phase.RUNNING, Phase.STOPPING):
            protocol.suspend(d.job_id, signal=job_signal(self.store, d.job_id))
        elif sj.hold is not HoldKind.ADMIN:
            self.backend.hold(d.job_id)
        now = self.clock()
        self.store.close_slice(d.job_id, now, SLICE_END_FOR.get(d.action, SliceEnd.QUANTUM))
        rec = self.store.get_job(d.job_id)
        if rec is not None and not rec.state.finished:
            self.store.set_job_state(d.job_id, JobState.SUSPENDED, at=now)
        detail = f"{d.action.value} to {d.placement}: GPUs now taken; left suspended"
        self.store.record_outcome(d.id, StoreOutcome.ROLLED_BACK, detail, now)
        self._note(out, "rolled-back", d.job_id, detail)

    @staticmethod
    def _gpus_taken(target: Placement, job_id: str, jobs: Iterable[SlurmJob]) -> bool:
        want = set(target.gpus)
        for j in jobs:
            if j.job_id == job_id or not j.running:
                continue
            held = {GpuRef(n, i) for n, ixs in j.gpus.items() for i in ixs}
            shards = {GpuRef(n, i) for n, ixs in j.shards.items() for i in ixs}
            if want & held or (want & shards and not target.shared):
                return True
            if target.shared and want & shards:
                continue  # sharing a shard-held GPU is what packing does; Slurm enforces the shard count
        return False

    def _fresh(self, job_id: str) -> SlurmJob | None:
        try:
            return self.backend.job(job_id)
        except GandivaError:
            return None
