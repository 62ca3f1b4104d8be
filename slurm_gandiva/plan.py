"""Decisions as plain data: what a policy wants done, and the pure transition it implies."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from slurm_gandiva.model import ClusterView, Job, JobState, Placement, Trial, TrialKind


class Action(enum.Enum):
    """What one decision does to one job."""

    START = "start"  # first slice of a queued job
    SUSPEND = "suspend"  # running -> suspended (time-slice ends, or preempted)
    RESUME = "resume"  # suspended -> running
    MIGRATE = "migrate"  # running -> running elsewhere, same GPU count
    RESIZE = "resize"  # running -> running on another GPU count
    PACK = "pack"  # running -> running on a shard of a GPU shared with another job
    UNPACK = "unpack"  # running on a shard -> running on whole GPUs
    # Co-held GPUs (`ClusterView.co_hold`): a switch in place, no Slurm call, no new process.
    PARK = "park"  # running -> parked: device state to host memory, keeps a shard of its GPUs
    UNPARK = "unpark"  # parked -> running on the GPUs it co-holds


# The order a mechanism carries a plan out in: free GPUs before taking them.
EXECUTION_ORDER = (
    Action.SUSPEND,
    Action.PARK,
    Action.RESIZE,
    Action.MIGRATE,
    Action.UNPACK,
    Action.PACK,
    Action.UNPARK,
    Action.RESUME,
    Action.START,
)


@dataclass(frozen=True)
class Decision:
    """One step for one job. `placement` is the target (None for SUSPEND and PARK). A SUSPEND of a parked
    job (`ClusterView.co_hold`) requeues it off the GPUs it co-holds."""

    action: Action
    job_id: str
    placement: Placement | None = None
    reason: str = ""
    trial: TrialKind | None = None  # set when the step is an introspective trial
    revert: bool = False  # set when the step undoes a failed trial


@dataclass(frozen=True)
class Plan:
    """An ordered tuple of decisions; at most one per job."""

    decisions: tuple[Decision, ...] = ()

    def __post_init__(self) -> None:
        ids = [d.job_id for d in self.decisions]
        if len(ids) != len(set(ids)):
            raise ValueError("a plan holds at most one decision per job")
        rank = {a: i for i, a in enumerate(EXECUTION_ORDER)}
        object.__setattr__(self, "decisions", tuple(sorted(self.decisions, key=lambda d: rank[d.action])))

    def __len__(self) -> int:
        return len(self.decisions)

    def __bool__(self) -> bool:
        return bool(self.decisions)

    def by_action(self, action: Action) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.action is action)

    def for_job(self, job_id: str) -> Decision | None:
        return next((d for d in self.decisions if d.job_id == job_id), None)

    @staticmethod
    def from_targets(
        view: ClusterView,
        targets: Mapping[str, Placement | None],
        reasons: Mapping[str, str] | None = None,
        trials: Mapping[str, TrialKind] | None = None,
        reverts: frozenset[str] = frozenset(),
    ) -> Plan:
        """Derive the decisions that take each job in `targets` from its current placement to the target.

        Jobs not named in `targets` keep what they have. None means "hold no GPUs".
        """
        reasons = reasons or {}
        trials = trials or {}
        out: list[Decision] = []
        for job_id, target in targets.items():
            job = view.job(job_id)
            if job.state.finished:
                continue
            action = _action_for(job, target)
            if action is None:
                continue
            out.append(
                Decision(
                    action,
                    job_id,
                    target,
                    reasons.get(job_id, ""),
                    trials.get(job_id),
                    job_id in reverts,
                )
            )
        return Plan(tuple(out))

    def apply(self, view: ClusterView, now: float | None = None) -> ClusterView:
        """The view after every decision took effect instantly (no overheads, no progress)."""
        t = view.now if now is None else now
        jobs = {j.job_id: j for j in view.jobs}
        for d in self.decisions:
            jobs[d.job_id] = apply_decision(jobs[d.job_id], d, t)
        return replace(view, jobs=tuple(jobs[j.job_id] for j in view.jobs), now=t)


def _action_for(job: Job, target: Placement | None) -> Action | None:
    current = job.placement if job.state is JobState.RUNNING else None
    if target == current:
        return None
    if target is None:
        return Action.SUSPEND
    if current is None:
        return Action.START if job.state is JobState.QUEUED else Action.RESUME
    if target.count != current.count:
        return Action.RESIZE
    if target.shared and not current.shared:
        return Action.PACK
    if current.shared and not target.shared:
        return Action.UNPACK
    return Action.MIGRATE


def apply_decision(job: Job, d: Decision, now: float) -> Job:
    """The job after decision `d` took effect at `now` (the bookkeeping both live and simulated use)."""
    failed = job.failed_trials
    if d.revert and job.trial is not None:
        failed = failed | {job.trial.kind}
    if d.action in (Action.SUSPEND, Action.PARK):
        if job.state is not JobState.RUNNING:
            return job  # a parked job leaves its co-held GPUs: to the policies it was suspended already
        return job.evolve(
            failed_trials=failed,
            state=JobState.SUSPENDED,
            placement=None,
            slice_start=None,
            last_run_end=now,
            last_gpus=job.placement.gpus if job.placement is not None and not job.placement.shared else (),
            trial=None,
            measured_rate=None,
        )
    assert d.placement is not None
    trial = job.trial
    if d.trial is not None:
        trial = Trial(d.trial, now, job.measured_rate or 0.0, job.placement)
    elif d.revert:
        trial = None
    starts_slice = job.state is not JobState.RUNNING
    return job.evolve(
        state=JobState.RUNNING,
        placement=d.placement,
        slice_start=now if starts_slice else job.slice_start,
        first_start=job.first_start if job.first_start is not None else now,
        times_scheduled=job.times_scheduled + (1 if starts_slice else 0),
        trial=trial,
        measured_rate=None,
        failed_trials=failed,
    )
