"""Baselines, all rigid (a job runs on its requested count, min_gpus, on whole GPUs):

- `Slurm`: what plain Slurm gives, priority FIFO with backfill (sched/backfill, Slurm's default).
- `Fifo`: strict FIFO (Slurm's sched/builtin); with `backfill`, greedy backfill without time limits.
- `Srtf`: preemptive shortest remaining time first on exact remaining times.
- `Tiresias`: Tiresias-LAS with two queues by attained GPU-service.

`seed` breaks ties between otherwise equal jobs (a seeded per-job rank, stable across processes).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import ClassVar

from slurm_gandiva.model import ClusterView, Job, JobState
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.afs import tie_rank
from slurm_gandiva.selector.common import GroupRoom, Memo, Speeds, active_jobs, capacity, fill, pinned_counts
from slurm_gandiva.selector.placement import placed_ok, realize

# Slurm's backfill defaults (src/plugins/sched/backfill/backfill.c: DEF_BF_MAX_JOB_TEST, BACKFILL_WINDOW).
BF_MAX_JOB_TEST = 500
BF_WINDOW_S = 24 * 3600.0
# What the backfill planner expects of a running job past its time limit: it ends within this many
# seconds (Slurm is killing it). Only with `Slurm.overestimate` > 1: exact estimates are never exceeded.
PAST_LIMIT_S = 60.0
_SLACK_S = 1e-6  # float slack when a backfilled job ends exactly at a reservation's start


def _rigid(job: Job) -> int:
    return job.spec.min_gpus


class _Profile:
    """Free GPUs from `now` on as a step function: `free[i]` GPUs during [times[i], times[i+1])."""

    __slots__ = ("_horizon", "free", "times")

    def __init__(self, now: float, free: int, ends: list[tuple[float, int]]) -> None:
        self.times = [now]
        self.free = [free]
        for t, k in sorted(ends):
            if t == math.inf:
                break
            t = max(t, math.nextafter(now, math.inf))  # a job ending now still holds its GPUs now
            if t > self.times[-1]:
                self.times.append(t)
                self.free.append(self.free[-1])
            self.free[-1] += k
        self._horizon: dict[int, float] = {}

    def horizon(self, k: int) -> float:
        """When fewer than k GPUs are first free (inf: never)."""
        h = self._horizon.get(k)
        if h is None:
            h = self._horizon[k] = next((t for t, f in zip(self.times, self.free, strict=True) if f < k), math.inf)
        return h

    def earliest(self, k: int, span: float) -> float:
        """The earliest time from which k GPUs stay free for `span` seconds (inf: never)."""
        times, free = self.times, self.free
        i, n = 0, len(times)
        while i < n:
            if free[i] < k:
                i += 1
                continue
            end = times[i] + span
            j = i + 1
            while j < n and times[j] < end and free[j] >= k:
                j += 1
            if j == n or times[j] >= end:
                return times[i]
            i = j + 1
        return math.inf

    def take(self, start: float, end: float, k: int) -> None:
        """Book k GPUs over [start, end)."""
        stop = self._split(end) if end < math.inf else len(self.times)
        for i in range(self._split(start), stop):
            self.free[i] -= k
        self._horizon.clear()

    def _split(self, t: float) -> int:
        i = bisect.bisect_left(self.times, t)
        if i == len(self.times) or self.times[i] != t:
            self.times.insert(i, t)
            self.free.insert(i, self.free[i - 1])
        return i


@dataclass(frozen=True)
class Slurm:
    """Plain Slurm: priority FIFO with EASY backfill on whole GPUs; never preempts, resizes or migrates.

    Slurm's default scheduler is sched/backfill: "Backfill scheduling will start lower priority jobs if
    doing so does not delay the expected start time of any higher priority jobs", the expected times
    coming from the jobs' time limits (https://slurm.schedmd.com/sched_config.html; SchedulerParameters
    bf_* in https://slurm.schedmd.com/slurm.conf.html). Priority is submit order: priority/basic, or
    priority/multifactor (the newer default) with its weights left at 0, where ties go by submit time
    (https://slurm.schedmd.com/priority_multifactor.html).
    Each round, in that order: a job that fits now starts; the first that does not gets a reservation
    at the earliest time enough GPUs free up, from the expected ends of the running jobs; a later job
    starts now only if it fits now and does not delay that reservation (it ends by its estimate at the
    reservation's start, or it only uses GPUs the reservation does not need). That is EASY backfill
    (Lifka, "The ANL/IBM SP scheduling system", JSSPP 1995; Mu'alem & Feitelson, IEEE TPDS 12(6), 2001).

    - `overestimate` (>= 1): each job's time limit is this times its true run time on its GPUs (users
      over-ask for walltime; Mu'alem & Feitelson found that doubling exact estimates can even shorten
      waits). 1, the default, is an oracle: a running job's remaining time at its measured rate, a
      waiting job's at its rate on its count (as SRTF). Above 1, a running job is expected to end at its
      limit (limit minus time held), never sooner than `PAST_LIMIT_S` from now.
    - `depth`: from the first job that cannot start on, at most this many waiting jobs are examined
      per round (bf_max_job_test, default 500). The jobs ahead of it start whatever their number, as
      Slurm's main scheduler starts jobs in priority order until one cannot start.
    - `reserve`: how many jobs that cannot start get a reservation. 1 is EASY. Slurm's own planner
      reserves for every job it tests, within `depth` and `window` (conservative backfill, Mu'alem &
      Feitelson): set `reserve` to `depth` for that; 0 is backfill with no reservations at all.
    - `window`: a job whose reservation would start more than this many seconds ahead gets none
      (bf_window: Slurm's default is `BF_WINDOW_S`, one day, and its docs advise at least the longest
      time limit). None, the default: no limit.

    Slurm plans on nodes; this plans on GPU counts, as `Fifo` does, so a job whose count fits but that
    no placement can hold waits. Slurm backfills every bf_interval (30 s); this decides at every event.
    A job whose remaining work is unknown is expected never to end (Slurm would use its time limit,
    which the view does not carry), so a reservation that needs its GPUs never comes and protects no one.
    """

    overestimate: float = 1.0
    depth: int = BF_MAX_JOB_TEST
    reserve: int = 1
    window: float | None = None
    seed: int = 0
    name: str = "slurm"
    quantum: float | None = None
    elastic: ClassVar[bool] = False
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.overestimate >= 1.0:
            raise ValueError(f"overestimate must be at least 1, not {self.overestimate}")

    def expected(self, job: Job, k: int, speeds: Speeds) -> float:
        """Seconds from now until `job`, running on k GPUs, is expected to end (inf: unknown)."""
        work = job.remaining_work
        if self.overestimate == 1.0:
            if job.state is JobState.RUNNING and job.measured_rate and work is not None:
                return work / job.measured_rate
            return speeds.remaining(job, k)
        rate = speeds.throughput(job, k)
        if job.spec.total_work is None or rate <= 0:
            return math.inf
        limit = self.overestimate * job.spec.total_work / rate
        return max(PAST_LIMIT_S, limit - job.attained_service / k)

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        speeds = Speeds(self.memo)
        free = capacity(view)
        counts: dict[str, int] = {}
        ends: list[tuple[float, int]] = []
        for j in jobs:
            if placed_ok(view, j):
                counts[j.job_id] = j.gpus
                free -= j.gpus
                ends.append((now + self.expected(j, j.gpus, speeds), j.gpus))
        if free > 0:
            # A job of a group at its cap is not a candidate (Slurm leaves an array's task past %MAX
            # pending, reason JobArrayTaskLimit, and schedules the jobs behind it).
            room = GroupRoom.of(view, jobs, counts)
            waiting = sorted(
                (j for j in jobs if j.job_id not in counts),
                key=lambda j: (j.spec.submit_time, tie_rank(self.seed, j.job_id)),
            )
            self._backfill(waiting, free, ends, now, speeds, counts, room)
        targets, _ = realize(view, jobs, counts, reason="slurm", memo=self.memo)
        return targets.plan(view)

    def _backfill(
        self,
        waiting: list[Job],
        free: int,
        ends: list[tuple[float, int]],
        now: float,
        speeds: Speeds,
        counts: dict[str, int],
        room: GroupRoom | None = None,
    ) -> None:
        """Start (in `counts`) the jobs of `waiting` that fit now without delaying a reservation; `free`
        GPUs are free now and `ends` says when the running ones free up; a job whose group (`room`) has
        no place left is passed over."""
        profile: _Profile | None = None  # built at the first job that cannot start: none before it
        reserved = 0
        tested = 0  # jobs examined from the first that could not start on (bf_max_job_test)
        for j in waiting:
            if free <= 0 or tested >= self.depth:
                break  # nothing more can start this round (later reservations would change nothing)
            if room and not room.fits(j):
                continue
            k = _rigid(j)
            span = self.expected(j, k, speeds)
            if profile is None:
                if k <= free:
                    counts[j.job_id] = k
                    free -= k
                    ends.append((now + span, k))
                    if room:
                        room.take(j)
                    continue
                profile = _Profile(now, free, ends)
            tested += 1
            if k <= free and now + span <= profile.horizon(k) + _SLACK_S:
                counts[j.job_id] = k
                profile.take(now, now + span, k)
                free = profile.free[0]
                if room:
                    room.take(j)
            elif reserved < self.reserve:
                start = profile.earliest(k, span)
                if start == math.inf or (self.window is not None and start > now + self.window):
                    continue  # never, or beyond the window: no reservation (Slurm's backfill.c too)
                profile.take(start, start + span, k)
                reserved += 1


@dataclass(frozen=True)
class Fifo:
    """First come, first served on exclusive GPUs; never preempts, resizes or migrates.

    Strict by default: the queue's head blocks everyone behind it, as Slurm's sched/builtin ("strict
    priority order within each partition", https://slurm.schedmd.com/sched_config.html) and the FIFO
    of the AFS authors' simulator (Hwang et al., NSDI'21). With `backfill`, any later job that fits
    starts at once: backfill without reservations, which can starve a large job; Slurm's own backfill
    (its default) is `Slurm`.
    """

    backfill: bool = False
    seed: int = 0
    name: str = "fifo"
    quantum: float | None = None
    elastic: ClassVar[bool] = False
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        free = capacity(view)
        counts: dict[str, int] = {}
        for j in jobs:
            if placed_ok(view, j):
                counts[j.job_id] = j.gpus  # keeps whatever it holds
                free -= j.gpus
        room = GroupRoom.of(view, jobs, counts)
        waiting = sorted(
            (j for j in jobs if j.job_id not in counts),
            key=lambda j: (j.spec.submit_time, tie_rank(self.seed, j.job_id)),
        )
        for j in waiting:
            if not room.fits(j):
                continue  # its group is at its cap: Slurm passes over it too (JobArrayTaskLimit)
            k = _rigid(j)
            if k <= free:
                room.take(j)
                counts[j.job_id] = k
                free -= k
            elif not self.backfill:
                break
        targets, _ = realize(view, jobs, counts, reason="fifo", memo=self.memo)
        return targets.plan(view)


@dataclass(frozen=True)
class Srtf:
    """Preemptive shortest remaining time first (remaining time on the requested GPUs).

    The remaining time is exact (an oracle: the job's remaining work at its rate on its requested
    count), as in the AFS evaluation (Hwang et al., NSDI'21), where SRTF knows each job's length. Jobs
    whose remaining work is unknown go last, least attained service first. `min_slice` (default 0:
    preempt as soon as a shorter job waits, as SRTF does) keeps a job that just started from being
    preempted again at once.
    """

    min_slice: float = 0.0
    seed: int = 0
    name: str = "srtf"
    quantum: float | None = None
    elastic: ClassVar[bool] = False
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        speeds = Speeds(self.memo)
        room = GroupRoom(view.group_caps)
        pinned, free = pinned_counts(jobs, now, self.min_slice, capacity(view), room)
        order = sorted(
            jobs,
            key=lambda j: (
                speeds.remaining(j, _rigid(j)),
                j.attained_service,
                j.spec.submit_time,
                tie_rank(self.seed, j.job_id),
            ),
        )
        counts, _ = fill(order, free, _rigid, pinned, room)
        targets, _ = realize(view, order, counts, reason="srtf", memo=self.memo)
        return targets.plan(view)


@dataclass(frozen=True)
class Tiresias:
    """Tiresias-LAS with two queues by attained GPU-service (GPU-seconds), preemptive.

    Tiresias (Gu et al., NSDI'19) discretises least-attained-service into priority queues split at
    thresholds of attained GPU-time, first come first served within a queue, and promotes a job that
    has starved. Jobs below `threshold` GPU-seconds are in the high queue. The default, 50 GPU-hours
    (180,000 GPU-s), is the two-queue Tiresias-L of the AFS authors' simulator (Hwang et al., NSDI'21),
    whose evaluation this one follows (it was 1 GPU-hour here before issue 12). With `starve_factor`
    (Tiresias' PROMOTEKNOB; default None: off), a low-queue job that has waited more than that many
    times its last run time is promoted. The round needs repeating while jobs cross the threshold,
    hence `quantum` (a job is demoted at most that late).
    """

    threshold: float = 50 * 3600.0
    starve_factor: float | None = None
    min_slice: float = 0.0
    seed: int = 0
    quantum: float | None = 300.0
    name: str = "tiresias"
    elastic: ClassVar[bool] = False
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)

    def queue(self, job: Job, now: float) -> int:
        if job.attained_service < self.threshold:
            return 0
        if self.starve_factor is not None and job.state is not JobState.RUNNING and job.last_run_end:
            ran = job.attained_service / max(1, job.spec.min_gpus)
            if now - job.last_run_end > self.starve_factor * ran:
                return 0
        return 1

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        room = GroupRoom(view.group_caps)
        pinned, free = pinned_counts(jobs, now, self.min_slice, capacity(view), room)
        order = sorted(jobs, key=lambda j: (self.queue(j, now), j.spec.submit_time, tie_rank(self.seed, j.job_id)))
        counts, _ = fill(order, free, _rigid, pinned, room)
        targets, _ = realize(view, order, counts, reason="tiresias", memo=self.memo)
        return targets.plan(view)
