"""Discrete-event simulator: the controller's observe-decide-act loop over a simulated cluster.

Time is the engine's own virtual clock (seconds from the trace start); nothing here reads a real clock.
Events are arrivals, completions and, while jobs wait (or a trial runs), re-decisions every
`policy.quantum` seconds (or, when the policy has `next_decision(view, now) -> float | None`, at the
time that returns after each call: None = only on events). With `SimConfig.tick` set, the engine decides
only on the controller's tick grid instead (every `tick` s from `tick_origin`, by default the first
arrival, while any job is active): arrivals, completions and slice expiries between two ticks are acted
on at the next one, as the controller sees them, and a tick that comes while the previous round is still
acting (a start waiting for Slurm) is skipped, as the controller's is (slower; for comparing with a real
run). A job may also arrive later than its submission (`_Rec.arrive`: when the controller registers it).
At each decision the engine builds the same `ClusterView` the controller builds (measured rates = the
model's true rate at the job's current placement), calls the very same policy object, checks the plan
(no GPU booked twice, counts within range, up nodes only) and applies it with `plan.apply_decision`, the
bookkeeping the controller uses, charging modelled overheads:

- A job that starts, resumes, migrates, resizes, packs or unpacks holds its new GPUs but makes no
  progress for the action's cost (`Overheads`). As in the controller, its slice is counted (min slice,
  quantum) from its training start, when that cost is paid (at most `STARTUP_GRACE_S` late).
- GPUs given up by a suspend (or left behind by a migrate/resize) stay busy for the suspend cost
  (the checkpoint is being written): a job placed on them waits for that first.
- A packed job runs `interference` slower while another job holds a shard of one of its GPUs.
- With `SimConfig.park` (co-held GPUs, sim/cohold.py; the round's `selector.cohold` rule), a job that
  parks frees its GPUs after `Overheads.park` and keeps a shard of each; unparked, it trains again after
  `Overheads.unpark` (no start-up, no launch). A parked job requeued off its GPUs, or resumed elsewhere,
  first pays the suspend (its checkpoint), counted as a suspend.
- Start-up also grows by `Overheads.per_gpu` per GPU beyond the first (a process each) and by `crowd` per
  other job starting in the same round. Service (what LAS compares) counts from `launch` after the
  decision and through a suspend, as the controller's slices open when Slurm runs the job and close
  when it has stopped.

A trace's groups (`TraceJob.group`: job arrays) become `JobSpec.group`, and their throttles every view's
`group_caps`. Each round is the controller's (`selector.round.run_round`: the policy's plan and the live
round's rules, group caps among them); a plan still over a cap is rejected like any other impossible one.
`run(on_round=...)` sees the running jobs after each round.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from slurm_gandiva.model import STARTUP_GRACE_S, ClusterView, Job, JobSpec, JobState, Placement, RateTable, Topology
from slurm_gandiva.plan import Action, Decision, Plan, apply_decision
from slurm_gandiva.profiles import MODEL_NAMES, ModelProfile, load_profiles
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.common import next_rotation
from slurm_gandiva.selector.round import Claim, RoundInputs, run_round
from slurm_gandiva.sim.cohold import ParkedJobs
from slurm_gandiva.sim.models import SpeedModel
from slurm_gandiva.sim.overheads import REQUEUE_RESULTS as REQUEUE_RESULTS  # re-exported: its old home
from slurm_gandiva.sim.overheads import Overheads as Overheads
from slurm_gandiva.sim.trace import Trace

# Policies that get elastic jobs (a GPU range) unless the policy says otherwise with `elastic`.
ELASTIC_POLICIES = frozenset({"afs-l", "afs-p", "default"})
_EPS = 1e-9
# GPUs are keyed (node, index) inside the engine: tuples of str and int hash in C, GpuRef's generated
# __hash__ runs Python code, and the engine looks GPUs up millions of times on long traces.
_Key = tuple[str, int]
_NO_BACKOFF: Mapping[str, float] = MappingProxyType({})  # the simulator's actions never fail: none waits
_IN_PLACE = frozenset({Action.SUSPEND, Action.PARK, Action.UNPARK})  # no process starts


class PlanRejected(RuntimeError):
    """A policy returned a plan that cannot be carried out (a policy bug, not a user error)."""


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster and the model parameters."""

    nodes: int = 16
    gpus_per_node: int = 4
    gpus_per_switch: int = 2
    sockets: int = 2
    shards: int = 2
    overheads: Overheads = field(default_factory=Overheads)
    locality_penalty: float = 0.05
    interference: float = 0.3
    seed: int = 0
    elastic: bool | None = None  # None: ask the policy (its `elastic` attribute, else ELASTIC_POLICIES)
    feedback_batches: int = 100
    max_time: float | None = None  # stop the simulation here (jobs left unfinished are reported)
    tick: float | None = None  # decide only every `tick` s while jobs are active, like the controller
    tick_origin: float | None = None  # ticks fall on tick_origin + k * tick (None: the first arrival)
    # Policies see only the rates each job was measured at, as the controller does (the jobs' tables
    # start empty: subclasses' make_jobs set them), instead of every job's true rate table.
    learn_rates: bool = False
    # The simulated Slurm ties requeued jobs to their old GPU indices, as Slurm 22.05 does
    # (`ClusterView.requeue_ties`; False for 23.02.2 and later).
    requeue_ties: bool = True
    # Jobs across nodes get the same GPU indices on each (`ClusterView.same_gpus_per_node`; Slurm's
    # per-node gres): what the live controller plans with.
    same_gpus_per_node: bool = False
    # Co-held placements (issue 31, sim/cohold.py): a switch within a group parks and unparks in place.
    park: bool = False
    park_state_gb: float = 16.0  # device state per GPU a parked job keeps in host memory
    park_host_gb: float = 192.0  # host memory per node its parked jobs may use

    def topology(self) -> Topology:
        return Topology.uniform(
            self.nodes,
            self.gpus_per_node,
            gpus_per_switch=self.gpus_per_switch,
            sockets=self.sockets,
            shards=self.shards,
        )


@dataclass(frozen=True)
class JobResult:
    """What happened to one job; times are absolute simulated seconds."""

    job_id: str
    model: str
    gpus: int  # asked for by the trace
    min_gpus: int
    max_gpus: int
    submit: float
    first_start: float | None
    finish: float | None
    first_feedback: float | None  # when its first `feedback_batches` mini-batches were done
    suspends: int
    migrations: int
    resizes: int
    packs: int
    gpu_seconds: float  # GPU time held (whole GPU or shard), overheads included
    overhead_seconds: float  # time held without progress
    parks: int = 0  # co-held switches away from it (`SimConfig.park`); `suspends` counts requeues only

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit

    @property
    def time_to_feedback(self) -> float | None:
        return None if self.first_feedback is None else self.first_feedback - self.submit


@dataclass(frozen=True)
class Sample:
    """Cluster state right after a decision (for the plots)."""

    time: float
    gpus_busy: int
    running: int
    waiting: int


@dataclass(frozen=True)
class SimResult:
    """One simulation run."""

    policy: str
    trace: str
    total_gpus: int
    elastic: bool
    overheads: Overheads
    jobs: tuple[JobResult, ...]
    samples: tuple[Sample, ...]
    end_time: float
    decisions: int  # policy calls
    actions: int  # decisions carried out

    @property
    def finished(self) -> tuple[JobResult, ...]:
        return tuple(j for j in self.jobs if j.finish is not None)


class _Rec:
    """The engine's mutable state of one job (never leaves the engine)."""

    __slots__ = (
        "arrive",
        "asked",
        "began",
        "counted_from",
        "dead_until",
        "done_at",
        "exit_cost",
        "finish",
        "first100",
        "job",
        "migrations",
        "overhead",
        "packs",
        "progress",
        "rate",
        "resizes",
        "service",
        "speed",
        "step_rate",
        "steps",
        "suspends",
        "total",
    )

    def __init__(self, job: Job, speed: SpeedModel, total: float, asked: int) -> None:
        self.job = job
        self.arrive = job.spec.submit_time  # when the scheduler first sees it
        self.asked = asked
        self.speed = speed
        self.total = total
        self.rate = 0.0  # samples/s at the current placement (0 when not running)
        self.step_rate = 0.0  # mini-batches/s
        self.dead_until = 0.0
        self.began = 0.0  # when the current slice was decided
        self.counted_from = 0.0  # when its service counts from (the controller: once Slurm runs it)
        self.done_at: float | None = None  # when the last sample was done (the process still exits)
        self.exit_cost = 0.0  # seconds from its last sample to its GPUs being free (`Overheads.finish`)
        self.steps = 0.0
        self.progress = 0.0  # samples done (the Job snapshot is synced at each decision)
        self.service = 0.0
        self.overhead = 0.0
        self.first100: float | None = None
        self.finish: float | None = None
        self.suspends = self.migrations = self.resizes = self.packs = 0

    def training_start(self) -> float:
        """When the current slice began for min-slice / quantum accounting (as the controller counts)."""
        return min(self.dead_until, self.began + STARTUP_GRACE_S) if self.dead_until > self.began else self.began

    def expiry(self, quantum: float) -> float:
        return self.training_start() + quantum

    def completion_time(self, now: float) -> float:
        """When the job ends at its current speed: its last sample, plus `exit_cost` s of process exit."""
        finish = self.exit_cost
        if self.rate <= 0:
            return math.inf
        left = max(0.0, self.total - self.progress)
        if left <= 0:
            return max(now, self.dead_until) if self.done_at is None else max(now, self.done_at + finish)
        return max(now, self.dead_until) + left / self.rate + finish


ProgressFn = Callable[[int, int, float], None]
# Called after each policy round with its time and the jobs running once its plan is carried out.
RoundFn = Callable[[float, tuple[Job, ...]], None]


class Simulator:
    """Runs one policy over one trace. Deterministic for a seed (the model draw uses `config.seed`)."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        config: SimConfig | None = None,
        *,
        profiles: Mapping[str, ModelProfile] | None = None,
        check_plans: bool = True,
    ) -> None:
        self.trace = trace
        self.policy = policy
        self.config = config or SimConfig()
        self.topology = self.config.topology()
        self.profiles = dict(profiles) if profiles is not None else load_profiles()
        self.check_plans = check_plans
        elastic = self.config.elastic
        if elastic is None:
            flag = getattr(policy, "elastic", None)
            elastic = bool(flag) if flag is not None else policy.name in ELASTIC_POLICIES
        self.elastic = elastic
        self._tables: dict[tuple[str, int], RateTable] = {}
        self._useful: dict[str, int] = {}
        self._speeds = {
            n: SpeedModel(p, self.topology, self.config.locality_penalty, self.config.interference)
            for n, p in self.profiles.items()
        }
        # The trace's job-array throttles: every view carries them, and `_apply` holds plans to them.
        self.group_caps: Mapping[str, int] = MappingProxyType(trace.group_caps)
        self.parked: ParkedJobs | None = None  # the run's parked jobs, with `SimConfig.park`

    # ---- set-up -------------------------------------------------------------------------------

    def _table(self, model: str, max_gpus: int) -> RateTable:
        key = (model, max_gpus)
        if key not in self._tables:
            self._tables[key] = self._speeds[model].rate_table(max_gpus)
        return self._tables[key]

    def make_jobs(self) -> list[_Rec]:
        """Give each trace job a model (seeded), a GPU range and its total work."""
        rng = random.Random(self.config.seed)
        total_gpus = self.topology.total_gpus
        names = sorted(n for n in self.profiles if n in MODEL_NAMES) or sorted(self.profiles)
        out = []
        for tj in self.trace.jobs:
            model = tj.model if tj.model is not None else rng.choice(names)
            speed = self._speeds[model]
            asked = min(tj.gpus, total_gpus)
            if self.elastic:
                if model not in self._useful:
                    self._useful[model] = speed.max_useful_gpus(total_gpus)
                hi = min(tj.max_gpus or self._useful[model], total_gpus)
                lo = 1
            else:
                lo = hi = asked
            total = tj.duration * speed.best_rate(asked)
            spec = JobSpec(
                job_id=tj.job_id,
                user=tj.user, account=tj.account,
                min_gpus=lo,
                max_gpus=max(lo, hi),
                submit_time=tj.submit_time,
                total_work=total,
                name=tj.job_id,
                model=model,
                group=tj.group,
            )
            job = Job(spec, rates=self._table(model, max(lo, hi, asked)))
            rec = _Rec(job, speed, total, asked)
            rec.exit_cost = self.config.overheads.finish
            out.append(rec)
        return out

    # ---- the loop -----------------------------------------------------------------------------

    def run(self, progress: ProgressFn | None = None, *, on_round: RoundFn | None = None) -> SimResult:
        """Simulate the whole trace (or up to `SimConfig.max_time`). `progress(done, total, t)` is called
        after each round and at the end; `on_round(t, running)` after each policy round (see `RoundFn`)."""
        recs = sorted(self.make_jobs(), key=lambda r: r.arrive)
        n = len(recs)
        quantum = getattr(self.policy, "quantum", None)
        grid: float | None = getattr(self.policy, "rotation_grid", None)
        learn = self.config.learn_rates
        tick = self.config.tick
        wake_hook: Callable[[ClusterView, float], float | None] | None = getattr(self.policy, "next_decision", None)
        wake: float | None = None
        feedback = self.config.feedback_batches
        active: dict[str, _Rec] = {}
        running: dict[str, _Rec] = {}
        whole: dict[_Key, str] = {}
        shards: dict[_Key, set[str]] = {}
        busy_until: dict[_Key, float] = {}
        samples: list[Sample] = []
        t = recs[0].arrive if recs else 0.0
        grid0 = t if self.config.tick_origin is None else self.config.tick_origin  # ticks: grid0 + k * tick
        nxt = 0  # next arrival
        done = 0
        decisions = actions = 0
        last_decision = -math.inf
        acting_until = -math.inf  # with a tick: the controller's round is still acting (no new tick)
        changed = False
        max_time = self.config.max_time if self.config.max_time is not None else math.inf
        c = self.config
        parked = self.parked = ParkedJobs(self.topology, c.park_state_gb, c.park_host_gb) if c.park else None

        while done < n:
            # --- next event time
            t_arr = recs[nxt].arrive if nxt < n else math.inf
            t_done = min((r.completion_time(t) for r in running.values()), default=math.inf)
            waiting = len(active) - len(running)
            if wake_hook is not None:
                ticking = wake is not None
                t_tick = max(wake, t) if wake is not None else math.inf
            else:
                ticking = quantum is not None and (
                    waiting > 0 or any(r.job.trial is not None for r in running.values())
                )
                t_tick = max(last_decision + quantum, t) if ticking and quantum is not None else math.inf
                if ticking and grid:
                    # Slices end only at rotations (multiples of the grid): wake at the next one.
                    t_tick = max(next_rotation(last_decision, grid), t) if last_decision > -math.inf else t
                elif ticking and quantum is not None:
                    # A slice counts from its training start: wake when the next one reaches a quantum.
                    expiries = (e for r in running.values() if (e := r.expiry(quantum)) > t)
                    t_tick = min(t_tick, min(expiries, default=t_tick))
            if tick is not None:
                nt = max(last_decision + tick, t, acting_until)
                t_tick = grid0 + math.ceil((nt - grid0) / tick - 1e-9) * tick if active else math.inf
            t_next = min(t_arr, t_done, t_tick)
            if t_next == math.inf or t_next > max_time:
                if t_next != math.inf:
                    self._advance(running.values(), t, max_time, feedback)
                    t = max_time
                break  # nothing can happen any more (or out of time): the rest stays unfinished
            # --- advance progress to t_next
            self._advance(running.values(), t, t_next, feedback)
            t = t_next
            # --- completions
            finished = [
                r for r in running.values() if r.completion_time(t) <= t + _EPS * max(1.0, t)
            ]
            if finished:
                touched: set[_Key] = set()
                for r in finished:
                    jid = r.job.job_id
                    assert r.job.placement is not None
                    touched.update(self._free(jid, r.job.placement, whole, shards))
                    r.finish = t
                    r.progress = r.total
                    r.job = replace(r.job, state=JobState.DONE, progress=r.total, placement=None, slice_start=None)
                    if r.first100 is None:
                        r.first100 = t
                    r.rate = r.step_rate = 0.0
                    del running[jid]
                    del active[jid]
                    done += 1
                self._refresh_rates((), touched, running, shards)
                changed = True
            # --- arrivals
            while nxt < n and recs[nxt].arrive <= t:
                r = recs[nxt]
                active[r.job.job_id] = r
                nxt += 1
                changed = True
            off_tick = tick is not None and t < t_tick - _EPS * max(1.0, t)
            if not active or (not changed and t < t_tick) or off_tick:
                if finished:
                    samples.append(Sample(t, len(whole) + len(shards), len(running), len(active) - len(running)))
                changed = False
                continue
            # --- decide
            for r in running.values():
                trained = t >= r.dead_until
                start = r.training_start() if trained else r.began
                rates = r.job.rates
                if learn and trained and r.rate > 0 and r.job.placement is not None:
                    p = r.job.placement
                    rates = rates.with_rate(p.count, self.topology.locality(p.gpus), r.rate)
                r.job = _synced(r.job, min(r.progress, r.total), r.service, r.rate if trained else None, start, rates)
            view = ClusterView(
                self.topology,
                tuple(r.job for r in active.values()),
                t,
                requeue_ties=self.config.requeue_ties,
                group_caps=self.group_caps,
                same_gpus_per_node=self.config.same_gpus_per_node,
                co_hold=parked.view(running) if parked is not None else None,
            )
            plan = self._round(view, running)
            decisions += 1
            last_decision = t
            if wake_hook is not None:
                wake = wake_hook(view, t)
                if wake is not None and not wake > t:
                    raise PlanRejected(f"{self.policy.name}: next_decision returned {wake}, not after now ({t})")
            changed = False
            if plan:
                actions += len(plan)
                self._apply(plan, active, running, whole, shards, busy_until, t)
                if tick is not None:
                    acting_until = t + max(self.act_seconds(d) for d in plan.decisions)
            samples.append(Sample(t, len(whole) + len(shards), len(running), len(active) - len(running)))
            if on_round is not None:
                on_round(t, tuple(r.job for r in running.values()))
            if progress is not None:
                progress(done, n, t)
            if not plan and not running and nxt >= n:
                break  # nothing runs, nothing arrives, the policy starts nothing: the rest is stuck
        if progress is not None:
            progress(done, n, t)
        results = tuple(self._result(r) for r in recs)
        return SimResult(
            policy=self.policy.name,
            trace=self.trace.name,
            total_gpus=self.topology.total_gpus,
            elastic=self.elastic,
            overheads=self.config.overheads,
            jobs=results,
            samples=tuple(samples),
            end_time=t,
            decisions=decisions,
            actions=actions,
        )

    def _round(self, view: ClusterView, running: Mapping[str, _Rec]) -> Plan:
        """The live round (`run_round`): jobs past their last sample are finishing (spared as long as the
        controller would), nothing fails, groups count their running jobs; an impossible plan is not acted on."""
        finishing = {jid: Claim(r.done_at, r.done_at) for jid, r in running.items() if r.done_at is not None}
        inputs = RoundInputs(finishing, _NO_BACKOFF, quantum=getattr(self.policy, "quantum", None) or math.inf)
        out = run_round(self.policy, view, inputs)
        if out.plan is not out.decided and out.plan and out.plan.apply(view).consistency_errors():
            return Plan()
        return out.plan

    @staticmethod
    def _advance(recs: Iterable[_Rec], t0: float, t1: float, feedback: int) -> None:
        for r in recs:
            held = t1 - t0
            gpus = r.job.gpus
            r.service += gpus * max(0.0, t1 - max(t0, r.counted_from))
            begin = max(t0, r.dead_until)
            productive = t1 - begin
            if productive <= 0:
                r.overhead += held
                continue
            left = r.total - r.progress
            if r.rate > 0 and r.rate * productive >= left:  # the last sample is done in this interval
                if r.done_at is None:
                    r.done_at = begin + max(0.0, left) / r.rate
                productive = max(0.0, left) / r.rate
            r.overhead += held - productive
            r.progress += r.rate * productive
            before = r.steps
            r.steps += r.step_rate * productive
            if r.first100 is None and r.steps >= feedback:
                r.first100 = begin + (feedback - before) / r.step_rate

    @staticmethod
    def _free(jid: str, p: Placement, whole: dict[_Key, str], shards: dict[_Key, set[str]]) -> list[_Key]:
        keys = [(g.node, g.index) for g in p.gpus]
        for k in keys:
            if p.shared:
                holders = shards.get(k)
                if holders is not None:
                    holders.discard(jid)
                    if not holders:
                        del shards[k]
            elif whole.get(k) == jid:
                del whole[k]
        return keys

    def _refresh_rates(
        self,
        moved: Iterable[_Rec],
        touched: Iterable[_Key],
        running: dict[str, _Rec],
        shards: dict[_Key, set[str]],
    ) -> None:
        """Recompute the speed of every job that moved, and of packed jobs on a touched GPU (their
        partner may have come or gone)."""
        again = {r.job.job_id: r for r in moved}
        for k in touched:
            for jid in shards.get(k, ()):
                again[jid] = running[jid]
        for r in again.values():
            p = r.job.placement
            if p is None:
                continue
            rate = r.speed.base_rate(p.gpus)
            if p.shared and any(len(shards.get((g.node, g.index), ())) > 1 for g in p.gpus):
                rate *= 1.0 - self.config.interference
            r.rate = rate
            r.step_rate = rate / r.speed.profile.batch_size(p.count)

    def _apply(
        self,
        plan: Plan,
        active: dict[str, _Rec],
        running: dict[str, _Rec],
        whole: dict[_Key, str],
        shards: dict[_Key, set[str]],
        busy_until: dict[_Key, float],
        t: float,
    ) -> None:
        # Two phases: every job named in the plan gives up its old GPUs, then every target is booked.
        # The plan is judged by the state it leads to, so a chain of moves (a onto b's GPUs while b
        # moves on) is fine; the GPUs a moving job leaves stay busy for its checkpoint.
        cost = self.config.overheads
        suspend_end = t + cost.suspend
        touched: set[_Key] = set()
        steps: list[tuple[Decision, _Rec, list[_Key], float]] = []
        parked = self.parked
        for d in plan.decisions:
            r = active.get(d.job_id)
            if r is None:
                raise PlanRejected(
                    f"{self.policy.name}: decision {d.action.value} for unknown or finished job {d.job_id}"
                )
            old = r.job.placement if r.job.state is JobState.RUNNING else None
            self._check(d, r, old)
            left: list[_Key] = []
            wait = t  # a parked job requeued off its GPUs first writes its checkpoint
            if old is not None:
                left = self._free(d.job_id, old, whole, shards)
                touched.update(left)
                free_at = t + cost.park if d.action is Action.PARK else suspend_end
                for k in left:
                    if busy_until.get(k, 0.0) < free_at:
                        busy_until[k] = free_at
                if d.action is Action.PARK and parked is not None:
                    parked.park(d.job_id, left)
            elif parked is not None and d.job_id in parked.on:
                gone = parked.leave(d.job_id)
                if d.action is not Action.UNPARK:
                    wait = suspend_end
                    r.suspends += 1
                    for k in gone:
                        busy_until[k] = max(busy_until.get(k, 0.0), suspend_end)
            steps.append((d, r, left, wait))
        moved: list[_Rec] = []
        # Jobs whose processes start in this round compete for the nodes' CPUs while they start up.
        crowd = cost.crowd * max(0, sum(1 for d, _, _, _ in steps if d.action not in _IN_PLACE) - 1)
        for d, r, left, wait in steps:
            r.job = apply_decision(r.job, d, t)
            a = d.action
            if a in (Action.SUSPEND, Action.PARK):
                if d.job_id not in running:
                    continue  # a parked job requeued off its GPUs (counted above)
                # The controller closes the slice when the job has stopped: the suspend counts as service.
                r.service += len(left) * self.suspend_seconds(d)
                r.job = replace(r.job, attained_service=r.service)  # what the policy sees of it from now on
                if a is Action.SUSPEND:
                    r.suspends += 1
                r.rate = r.step_rate = 0.0
                del running[d.job_id]
                continue
            new = d.placement
            assert new is not None
            ready = wait
            mine = set(left)
            if parked is not None and parked.at:
                clash = parked.clash(d.job_id, [(g.node, g.index) for g in new.gpus], new.shared)
                if clash is not None:
                    raise PlanRejected(f"{self.policy.name}: job {d.job_id} {clash}")
            for g in new.gpus:
                k = (g.node, g.index)
                self._book(k, new.shared, d.job_id, whole, shards)
                touched.add(k)
                if k not in mine:
                    ready = max(ready, busy_until.get(k, 0.0))
            unpark = a is Action.UNPARK  # in place: no process starts
            r.dead_until = ready + cost.unpark if unpark else self.training_begins(d, new.count, crowd, t, ready)
            r.began = t
            r.counted_from = t + self.launch_seconds(d)
            running[d.job_id] = r
            moved.append(r)
            if a is Action.MIGRATE:
                r.migrations += 1
            elif a is Action.RESIZE:
                r.resizes += 1
            elif a in (Action.PACK, Action.UNPACK):
                r.packs += 1
        if self.group_caps:
            self._check_caps(plan, running)
        if parked is not None and (err := parked.memory_error()) is not None:
            raise PlanRejected(f"{self.policy.name}: {err}")
        self._refresh_rates(moved, touched, running, shards)

    def _check_caps(self, plan: Plan, running: Mapping[str, _Rec]) -> None:
        """PlanRejected when, after `plan`, a capped group (`group_caps`) runs more jobs than its cap."""
        caps = self.group_caps
        count: dict[str, int] = {}
        for r in running.values():
            g = r.job.spec.group
            if g is not None and g in caps:
                count[g] = count.get(g, 0) + 1
        over = sorted(g for g, k in count.items() if k > caps[g])
        if over:
            g = over[0]
            placed = sorted(
                d.job_id for d in plan.decisions if d.job_id in running and running[d.job_id].job.spec.group == g
            )
            raise PlanRejected(
                f"{self.policy.name}: plan runs {count[g]} jobs of group {g} at once, over its cap of {caps[g]}"
                f" (placed in this round: {', '.join(placed)})"
            )

    def act_seconds(self, d: Decision) -> float:
        """How long the controller's actor is busy with decision `d` (with a tick: the next tick waits
        for the round, as the controller's tick job does): a suspend's cost, else until Slurm runs the
        job (`launch`). A subclass may replay measured times."""
        o = self.config.overheads
        return o.suspend if d.action is Action.SUSPEND else o.park if d.action is Action.PARK else o.launch

    def suspend_seconds(self, d: Decision) -> float:
        """Seconds from suspend decision `d` to the job having stopped, when the controller closes its
        slice (the suspend counts as service). A subclass may replay measured times."""
        o = self.config.overheads
        return o.park if d.action is Action.PARK else o.suspend

    def launch_seconds(self, d: Decision) -> float:
        """Seconds from decision `d` (not a suspend) to Slurm running the job, when the controller opens
        its slice and service starts to count (`launch`). A subclass may replay measured times."""
        return 0.0 if d.action is Action.UNPARK else self.config.overheads.launch

    def training_begins(self, d: Decision, gpus: int, crowd: float, t: float, ready: float) -> float:
        """When a job started, resumed or moved by decision `d` at `t` trains again: its start-up after its
        GPUs are free (`ready`: the jobs that left them have checkpointed). A subclass may replay it."""
        return ready + self.startup(d, gpus, crowd)

    def startup(self, d: Decision, gpus: int, crowd: float) -> float:
        """Seconds without progress after decision `d` (a start, resume or move onto `gpus` GPUs), `crowd`
        s of it for the other jobs starting in the same round. A subclass may replay measured costs."""
        o = self.config.overheads
        return o.cost(d.action) + crowd + o.per_gpu * (gpus - 1)

    def _check(self, d: Decision, r: _Rec, old: Placement | None) -> None:
        on = self.parked.on if self.parked is not None else {}
        if d.action in (Action.SUSPEND, Action.PARK):
            if old is None and not (d.action is Action.SUSPEND and d.job_id in on):
                raise PlanRejected(f"{self.policy.name}: {d.action.value} of job {d.job_id}, which is not running")
            if d.action is Action.PARK and (self.parked is None or old is None or old.shared):
                raise PlanRejected(f"{self.policy.name}: park of job {d.job_id}, which cannot be co-held")
            return
        if d.action is Action.UNPARK and (d.placement is None or d.placement.shared or d.job_id not in on
                                          or {(g.node, g.index) for g in d.placement.gpus} != set(on[d.job_id])):
            raise PlanRejected(f"{self.policy.name}: unpark of job {d.job_id} onto GPUs it does not co-hold")
        p = d.placement
        if p is None:
            raise PlanRejected(f"{self.policy.name}: {d.action.value} of job {d.job_id} without a placement")
        spec = r.job.spec
        if not spec.min_gpus <= p.count <= spec.max_gpus:
            raise PlanRejected(
                f"{self.policy.name}: job {d.job_id} given {p.count} GPUs, outside {spec.min_gpus}..{spec.max_gpus}"
            )
        if self.check_plans:
            for g in p.gpus:
                if not self.topology.has_gpu(g):
                    raise PlanRejected(f"{self.policy.name}: job {d.job_id} placed on unknown GPU {g}")
                if not self.topology.node(g.node).up:
                    raise PlanRejected(f"{self.policy.name}: job {d.job_id} placed on down node {g.node}")

    def _book(self, k: _Key, shared: bool, jid: str, whole: dict[_Key, str], shards: dict[_Key, set[str]]) -> None:
        g = f"{k[0]}:{k[1]}"
        if shared:
            if k in whole:
                raise PlanRejected(f"{self.policy.name}: job {jid} packed onto {g}, which {whole[k]} holds whole")
            holders = shards.setdefault(k, set())
            if len(holders) >= self.topology.node(k[0]).shards:
                raise PlanRejected(f"{self.policy.name}: job {jid} packed onto {g}, whose shards are all taken")
            holders.add(jid)
        else:
            owner = whole.get(k)
            if owner is not None or k in shards:
                owner = owner or ",".join(sorted(shards.get(k, ())))
                raise PlanRejected(f"{self.policy.name}: job {jid} placed on {g}, which job {owner} holds")
            whole[k] = jid

    def _result(self, r: _Rec) -> JobResult:
        spec = r.job.spec
        return JobResult(
            job_id=spec.job_id,
            model=spec.model,
            gpus=r.asked,
            min_gpus=spec.min_gpus,
            max_gpus=spec.max_gpus,
            submit=spec.submit_time,
            first_start=r.job.first_start,
            finish=r.finish,
            first_feedback=r.first100,
            suspends=r.suspends,
            migrations=r.migrations,
            resizes=r.resizes,
            packs=r.packs,
            gpu_seconds=r.service,
            overhead_seconds=r.overhead,
            parks=self.parked.parks.get(spec.job_id, 0) if self.parked is not None else 0,
        )


def _synced(
    job: Job, progress: float, service: float, measured: float | None, slice_start: float, rates: RateTable
) -> Job:
    """`job` with new progress figures and every other field kept.

    This runs for every running job at every decision; copying the instance dict is several times
    cheaper than dataclasses.replace (which re-runs __init__) and, unlike positional construction,
    cannot drop a field added to Job later.
    """
    new = Job.__new__(Job)
    d = new.__dict__
    d.update(job.__dict__)
    d["progress"] = progress
    d["attained_service"] = service
    d["measured_rate"] = measured
    d["slice_start"] = slice_start
    d["rates"] = rates
    return new
