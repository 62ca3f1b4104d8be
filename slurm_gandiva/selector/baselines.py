"""Baselines: FIFO (what plain Slurm gives), SRTF and Tiresias-LAS. All rigid: a job runs on min_gpus.

`seed` breaks ties between otherwise equal jobs (a seeded per-job rank, stable across processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from slurm_gandiva.model import ClusterView, Job, JobState
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.afs import tie_rank
from slurm_gandiva.selector.common import Memo, Speeds, active_jobs, capacity, fill, pinned_counts
from slurm_gandiva.selector.placement import placed_ok, realize


def _rigid(job: Job) -> int:
    return job.spec.min_gpus


@dataclass(frozen=True)
class Fifo:
    """First come, first served on exclusive GPUs; never preempts, resizes or migrates.

    With `backfill`, a later job that fits starts while an earlier, larger one waits (Slurm's backfill
    without time limits); without it the queue's head blocks everyone behind it.
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
        waiting = sorted(
            (j for j in jobs if j.job_id not in counts),
            key=lambda j: (j.spec.submit_time, tie_rank(self.seed, j.job_id)),
        )
        for j in waiting:
            k = _rigid(j)
            if k <= free:
                counts[j.job_id] = k
                free -= k
            elif not self.backfill:
                break
        targets, _ = realize(view, jobs, counts, reason="fifo", memo=self.memo)
        return targets.plan(view)


@dataclass(frozen=True)
class Srtf:
    """Preemptive shortest remaining time first (remaining time on the requested GPUs).

    Jobs whose remaining work is unknown go last, least attained service first. `min_slice` keeps a
    job that just started from being preempted again at once.
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
        pinned, free = pinned_counts(jobs, now, self.min_slice, capacity(view))
        order = sorted(
            jobs,
            key=lambda j: (
                speeds.remaining(j, _rigid(j)),
                j.attained_service,
                j.spec.submit_time,
                tie_rank(self.seed, j.job_id),
            ),
        )
        counts, _ = fill(order, free, _rigid, pinned)
        targets, _ = realize(view, order, counts, reason="srtf", memo=self.memo)
        return targets.plan(view)


@dataclass(frozen=True)
class Tiresias:
    """Tiresias-LAS with two queues by attained GPU-service (GPU-seconds), preemptive.

    Jobs below `threshold` GPU-seconds are in the high queue; within a queue, first come first served.
    With `starve_factor`, a low-queue job that has waited more than that many times its last run time
    is promoted (Tiresias' starvation guard). The round needs repeating while jobs cross the threshold,
    hence `quantum` (a job is demoted at most that late).
    """

    threshold: float = 3600.0
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
        pinned, free = pinned_counts(jobs, now, self.min_slice, capacity(view))
        order = sorted(jobs, key=lambda j: (self.queue(j, now), j.spec.submit_time, tie_rank(self.seed, j.job_id)))
        counts, _ = fill(order, free, _rigid, pinned)
        targets, _ = realize(view, order, counts, reason="tiresias", memo=self.memo)
        return targets.plan(view)
