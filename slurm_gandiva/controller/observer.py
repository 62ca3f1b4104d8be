"""The controller's observation of its jobs: the view each round's policy sees, and what it remembers.

    observer = Observer(backend, store, clock, progress_reader)
    obs = observer.observe(snap, managed, config, topology, starting)   # one round's Observation
    observer.note_trials(obs.view, results)                              # after the round's actions

`Observer` builds each round's `ClusterView` from Slurm's snapshot, the store and the jobs' progress
files (read as untrusted input), and keeps between rounds what makes a round with 10,000 waiting jobs
cheap: the memos of the jobs' inputs, policy Jobs, grouped specs and progress reports, the models'
speed-ups, and the policy's introspective trials. A job's unreadable file is noted (`file_problems`),
never raised: it affects that job alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_gandiva.controller.arrays import GroupSpecs, grouped_spec, with_array_groups
from slurm_gandiva.controller.claims import CLAIM_IGNORED, ClaimJudge, Verdict
from slurm_gandiva.controller.cohold import ParkedJobs, co_hold_gpus, co_hold_view
from slurm_gandiva.controller.observe import (
    JobInputs,
    JobMemo,
    Observation,
    ProgressLike,
    ProgressReader,
    build_view,
    foreign_gpus,
    held_placement,
)
from slurm_gandiva.controller.tenants import TenantsCache
from slurm_gandiva.errors import GandivaError, JobFileError
from slurm_gandiva.model import ClusterView, Placement, Topology, Trial, TrialKind
from slurm_gandiva.plan import Action, Plan, apply_decision
from slurm_gandiva.requeue.contract import JobFiles
from slurm_gandiva.requeue.operations import Outcome
from slurm_gandiva.requeue.safe_read import read_job_progress
from slurm_gandiva.slurm.base import SlurmBackend, SlurmJob, Snapshot
from slurm_gandiva.store.api import JobRecord
from slurm_gandiva.store.memo import MemoStore

if TYPE_CHECKING:
    from slurm_gandiva.config import ControllerConfig
    from slurm_gandiva.controller.act import ActResult

log = logging.getLogger(__name__)

_NO_TRIALS: frozenset[TrialKind] = frozenset()


class Observer:
    """What the controller sees of its jobs, with its memos. `clock` gives unix seconds."""

    def __init__(
        self,
        backend: SlurmBackend,
        store: MemoStore,
        clock: Callable[[], float],
        read_progress: ProgressReader | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.clock = clock
        self.read_progress: ProgressReader = read_progress or _read_progress
        self.file_problems: dict[str, str] = {}  # job id -> why its files were refused (last round)
        self.claims = ClaimJudge()
        self.tenants = TenantsCache(backend, store, clock)  # Slurm's shares and GPU limits, cached
        self.parked = ParkedJobs(store)  # which running jobs are parked on co-held GPUs (controller.cohold)
        self._parked_bytes: dict[str, int] = {}  # job id -> device state it held when it last parked
        self._declined: set[str] = set()  # jobs that did not park when asked: the requeue path for them
        self.claim_problems: Mapping[str, str] = {}  # job id -> why its claim of finishing is ignored (last round)
        self._trials: dict[str, Trial] = {}
        self._failed_trials: dict[str, frozenset[TrialKind]] = {}
        self._speedups: dict[tuple[str, int], Mapping[int, float] | None] = {}
        self._job_memo: JobMemo = {}  # waiting jobs' policy Jobs, while their inputs stay the same
        self._group_specs: GroupSpecs = {}  # array tasks' specs with their array as group
        # job id -> (its SlurmJob, record, rates, progress, trial, failed trials) and the JobInputs made of
        # them, for a job without slices (see `observe`)
        self._inputs_memo: dict[str, tuple[Any, ...]] = {}
        # job id -> (whether it ran when its progress file was read, the report, why it was refused)
        self._progress_memo: dict[str, tuple[bool, ProgressLike | None, str | None]] = {}

    def observe(
        self,
        snap: Snapshot,
        managed: Mapping[str, SlurmJob],
        config: ControllerConfig,
        topology: Topology,
        starting: Mapping[str, Placement] | None = None,
    ) -> Observation:
        """The view of the `managed` (job id -> SlurmJob: the controller's jobs in `snap`), registered,
        unfinished jobs (one store query per kind of record); `starting`: the jobs being started after
        their round, and where (`Actor.starting`)."""
        starting = starting or {}
        managed = {jid: j for jid, j in managed.items() if not j.finished}
        found = self.store.jobs_by_id(managed)
        records = {jid: found[jid] for jid in managed if jid in found}
        slices_by_job: dict[str, list[Any]] = {jid: [] for jid in records}
        rates = self.store.rates_by_job(records) if records else {}
        if records:
            for s in self.store.slices(job_ids=list(records)):
                slices_by_job.setdefault(s.job_id, []).append(s)
        progress: dict[str, ProgressLike] = {}
        inputs: list[JobInputs] = []
        problems: dict[str, str] = {}
        no_slices: list[Any] = []
        parked: dict[str, Placement] = {}
        for jid, rec in records.items():
            sj = managed[jid]
            prog = self._progress_now(jid, rec, sj, config.job_root, problems)
            if prog is not None:
                progress[jid] = prog
            slices = slices_by_job.get(jid, no_slices)
            job_rates = rates.get(jid, ())
            trial = self._trials.get(jid)
            failed = self._failed_trials.get(jid, _NO_TRIALS)
            at = self._parked_at(rec, sj, slices, prog)
            if at is not None:
                parked[jid] = at
            # A job whose every input is the very object of the last round (most waiting jobs: the
            # backend, the store's memo and the progress memo hand out the same objects while nothing
            # changes) keeps its JobInputs: the group spec, the speed-up and the record are not made again.
            seen = self._inputs_memo.get(jid)
            if (
                seen is not None and not slices and seen[0] is sj and seen[1] is rec and seen[2] is job_rates
                and seen[3] is prog and seen[4] is trial and seen[5] is failed and jid not in starting
                and jid not in parked
            ):
                inputs.append(seen[6])
                continue
            inp = JobInputs(
                slurm=sj,
                spec=grouped_spec(rec.spec, sj, self._group_specs),
                slices=tuple(slices),
                rates=job_rates,
                progress=prog,
                trial=trial,
                failed_trials=failed,
                speedup=self.speedup(rec.spec.model, rec.spec.max_gpus) if rec.spec.elastic else None,
                starting=starting.get(jid),
                parked=parked.get(jid),
            )
            if slices:
                self._inputs_memo.pop(jid, None)
            else:
                self._inputs_memo[jid] = (sj, rec, job_rates, prog, trial, failed, inp)
            inputs.append(inp)
        self._note_file_problems(problems)
        now = self.clock()
        caps = self.backend.capabilities()
        foreign = foreign_gpus(snap.jobs, config.partitions)

        def view_of(inputs: list[JobInputs]) -> ClusterView:
            return build_view(
                topology, snap.nodes, inputs, foreign, now, requeue_ties=caps.requeue_keeps_gpu_indices,
                packing=caps.packing, memo=self._job_memo, max_nodes=config.max_nodes,
                memory=caps.memory_consumable,
            )

        view = view_of(inputs)
        verdict = self.claims.judge(view, progress, config.quantum, now)
        if verdict.ignored:  # their reports buy nothing: the view is made again without them
            inputs = [replace(i, progress=None, rates=()) if i.slurm.job_id in verdict.ignored else i for i in inputs]
            view = view_of(inputs)
            for jid in verdict.ignored:
                progress.pop(jid, None)
        self._note_claims(verdict, now)
        view = with_array_groups(view, managed)  # the %MAX throttles, for the policy
        tenants = self.tenants.current(config.fairness, config.accounting_refresh)
        if tenants is not None:
            view = replace(view, tenants=tenants)
        most = co_hold_gpus(config.co_hold, caps)
        if most or parked:  # jobs parked before co_hold was turned off still unpark, or leave their GPUs
            running = {j.job_id: j.placement for j in view.running if j.placement is not None} if most else {}
            mem = {jid: managed[jid].min_memory_per_node for jid in running.keys() | parked.keys()}
            co = co_hold_view(running, parked, self._parked_bytes, mem, snap.nodes, most, self._declined)
            view = replace(view, co_hold=co)
        for jid in self._parked_bytes.keys() - records.keys():
            del self._parked_bytes[jid]
        self._declined &= records.keys()
        self.parked.forget(records)
        for memo in (self._job_memo, self._progress_memo, self._group_specs, self._inputs_memo):
            for jid in memo.keys() - records.keys():
                del memo[jid]
        self.claims.forget(records)
        self.store.retain(j.job_id for j in snap.jobs)
        return Observation(view, snap, managed, records, progress, problems, verdict.standing)

    def _parked_at(
        self, rec: JobRecord, sj: SlurmJob, slices: Any, prog: ProgressLike | None
    ) -> Placement | None:
        """The GPUs a parked job co-holds (None: it is not parked); notes the device state it reported."""
        if not self.parked.is_parked(rec, sj, any(s.is_open for s in slices)):
            return None
        held = held_placement(sj)
        reported = getattr(prog, "parked_bytes", None)
        if isinstance(reported, int) and reported >= 0:
            self._parked_bytes[sj.job_id] = reported
        return Placement(held.gpus) if held is not None else None

    def _progress_now(
        self, job_id: str, rec: JobRecord, sj: SlurmJob, job_root: Path, problems: dict[str, str]
    ) -> ProgressLike | None:
        """The job's progress report, read while it runs and once after; a waiting job's file is not read
        again (only its own wrapper writes it, while it runs), so a round with 10,000 waiting jobs reads
        only the running ones' files."""
        seen = self._progress_memo.get(job_id)
        if seen is not None and not seen[0] and not sj.running:
            _, prog, problem = seen
        else:
            found: dict[str, str] = {}
            files = JobFiles(Path(rec.state_dir) if rec.state_dir else job_root / job_id)
            prog = self._progress_of(job_id, files.progress, sj.user, found)
            problem = found.get(job_id)
            self._progress_memo[job_id] = (sj.running, prog, problem)
        if problem is not None:
            problems[job_id] = problem
        return prog

    def _progress_of(self, job_id: str, path: Path, user: str, problems: dict[str, str]) -> ProgressLike | None:
        """The job's progress report; a refused or unreadable file is noted in `problems` and read as none:
        it affects this job alone (no measured rate), never the round."""
        try:
            return self.read_progress(path, user)
        except JobFileError as exc:
            problems[job_id] = str(exc)
        except Exception as exc:  # a reader bug must not stop everyone's round either
            problems[job_id] = f"{path}: cannot read it ({type(exc).__name__}: {exc})"
        return None

    def _note_file_problems(self, problems: dict[str, str]) -> None:
        """Log and record each job's file problem once (when it appears or changes), and when it is fixed."""
        now = self.clock()
        for jid, why in problems.items():
            if self.file_problems.get(jid) != why:
                log.warning("job %s: %s", jid, why)
                with contextlib.suppress(Exception):
                    self.store.record_event("job-file-refused", jid, why, now)
        for jid in self.file_problems.keys() - problems.keys():
            log.info("job %s: its files are readable again", jid)
        self.file_problems = problems

    def _note_claims(self, verdict: Verdict, now: float) -> None:
        """Log and record each job's ignored claim once (`ClaimJudge`)."""
        for jid, why in verdict.new.items():
            log.warning("job %s: %s", jid, why)
            with contextlib.suppress(Exception):
                self.store.record_event(CLAIM_IGNORED, jid, why, now)
        self.claim_problems = verdict.ignored

    def last_placements(self, plan: Plan) -> dict[str, Placement]:
        """Where the jobs this plan resumes last ran (one store query)."""
        ids = [d.job_id for d in plan.decisions if d.action is Action.RESUME]
        last: dict[str, tuple[float, Placement]] = {}
        for s in self.store.slices(job_ids=ids) if ids else ():
            if s.end is not None and s.end >= last.get(s.job_id, (-1.0, s.placement))[0]:
                last[s.job_id] = (s.end, s.placement)
        return {jid: p for jid, (_, p) in last.items()}

    def speedup(self, model: str, max_gpus: int) -> Mapping[int, float] | None:
        """T(k)/T(1) for k = 1..max_gpus on one node from the model's scaling table (None when unknown)."""
        if not model:
            return None
        key = (model, max_gpus)
        if key not in self._speedups:
            try:
                from slurm_gandiva.profiles import load_profile

                prof = load_profile(model)
                one = prof.throughput((1,))
                self._speedups[key] = {k: prof.throughput((k,)) / one for k in range(1, max_gpus + 1)}
            except (GandivaError, ImportError, OSError, ValueError, KeyError):
                log.warning("no scaling table for model %r: its jobs grow only on measured speed-ups", model)
                self._speedups[key] = None
        return self._speedups[key]

    def note_trials(self, view: ClusterView, results: tuple[ActResult, ...]) -> None:
        """Keep each job's introspective trial (the policy's bookkeeping) between ticks, and the jobs that went
        the requeue path when asked to park (`co_hold_view`'s `declined`)."""
        running = {j.job_id for j in view.running}
        for jid in [j for j in self._trials if j not in running]:
            del self._trials[jid]
        active = {j.job_id for j in view.jobs}
        for jid in [j for j in self._failed_trials if j not in active]:
            del self._failed_trials[jid]
        for r in results:
            if r.decision.action is Action.PARK and r.op is not None and r.op.outcome is not Outcome.PARKED:
                self._declined.add(r.decision.job_id)  # it went the requeue path instead: do not ask again
            if not r.ok:
                continue
            job = apply_decision(view.job(r.decision.job_id), r.decision, self.clock())
            if job.failed_trials:
                self._failed_trials[job.job_id] = job.failed_trials
            if job.trial is not None:
                self._trials[job.job_id] = job.trial
            else:
                self._trials.pop(job.job_id, None)


def _read_progress(path: Path, user: str) -> ProgressLike | None:
    """The default progress reader: the job's progress.json read as untrusted input (see safe_read)."""
    return read_job_progress(path, owner=user)
