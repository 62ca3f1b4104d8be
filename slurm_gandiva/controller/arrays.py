"""Job arrays in the controller: the %MAX throttle, given to the policy and checked on its plan.

Slurm leaves a released task of an array that already runs %MAX tasks pending (reason JobArrayTaskLimit):
a resume or start past the limit would never start, and its GPUs would sit idle while the protocol waits.
So the controller never places more than MAX tasks of one array at once. The policy sees the throttle as
a generic group cap (`with_array_groups`: each task's `JobSpec.group` is its array's id, and
`ClusterView.group_caps` holds each throttled array's MAX), so it plans within it and time-slices an
array's tasks through its MAX places. `throttle_arrays`, run on each round's plan, is the safety net:
it drops the starts and resumes over the limit as Slurm counts it (a task Slurm still tears down counts),
keeping those of the tasks with the least attained service (never-run tasks first).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from slurm_gandiva.model import ClusterView, JobSpec
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.slurm.base import SlurmJob

log = logging.getLogger(__name__)

_TAKES = (Action.START, Action.RESUME)

GroupSpecs = dict[str, tuple[JobSpec, JobSpec]]  # job id -> (the store's spec, that spec with its group)


def array_caps(jobs: Mapping[str, SlurmJob]) -> dict[str, int]:
    """Array id -> its %MAX, for the throttled arrays among `jobs` (job id -> SlurmJob)."""
    return {j.array_id: j.array_max_tasks for j in jobs.values() if j.array_id and j.array_max_tasks > 0}


def array_places(jobs: Mapping[str, SlurmJob]) -> tuple[dict[str, str], dict[str, int]]:
    """For the actor (`Actor.execute`): task id -> its array, for the tasks of throttled arrays, and array
    -> how many more of its tasks Slurm would start now (%MAX less the tasks it counts as running, also
    those it still tears down)."""
    groups = {jid: j.array_id for jid, j in jobs.items() if j.array_id and j.array_max_tasks > 0}
    running: Counter[str] = Counter(jobs[jid].array_id for jid in groups if jobs[jid].running)
    room = {a: max(0, cap - running[a]) for a, cap in array_caps(jobs).items()}
    return groups, room


def grouped_spec(spec: JobSpec, job: SlurmJob, memo: GroupSpecs | None = None) -> JobSpec:
    """`spec` with its group: the array's id for a task of a job array, None for any other job. `memo`
    (the caller's, kept between rounds) keeps one spec per job while the store's spec stays the same."""
    group = job.array_id or None
    if spec.group == group:
        return spec
    if memo is not None:
        hit = memo.get(job.job_id)
        if hit is not None and hit[0] is spec and hit[1].group == group:
            return hit[1]
    out = replace(spec, group=group)
    if memo is not None:
        memo[job.job_id] = (spec, out)
    return out


def with_array_groups(view: ClusterView, jobs: Mapping[str, SlurmJob]) -> ClusterView:
    """`view` with each throttled array's %MAX as its group cap (`ClusterView.group_caps`); the jobs'
    groups come from `grouped_spec`."""
    caps = array_caps(jobs)
    return replace(view, group_caps=caps) if caps or view.group_caps else view


def throttle_arrays(plan: Plan, view: ClusterView, jobs: Mapping[str, SlurmJob]) -> Plan:
    """`plan` without the starts and resumes that would run more than %MAX tasks of an array at once.

    `jobs` are the managed jobs as Slurm lists them (job id -> SlurmJob). A task counts as running while
    Slurm says so (also while it is being torn down: Slurm may still count it); the plan's suspends of
    running tasks free their places first, then starts and resumes take the places left, the task with
    the least attained service (then the longest waiting) first.
    """
    limits = {jid: (j.array_id, j.array_max_tasks) for jid, j in jobs.items() if j.array_id and j.array_max_tasks > 0}
    if not limits or not plan:
        return plan
    running: Counter[str] = Counter(array for jid, (array, _) in limits.items() if jobs[jid].running)
    for d in plan.decisions:
        if d.action is Action.SUSPEND and d.job_id in limits and jobs[d.job_id].running:
            running[limits[d.job_id][0]] -= 1
    order = {j.job_id: i for i, j in enumerate(view.jobs)}  # the view lists jobs by submit time, then id

    def rank(job_id: str) -> tuple[float, int]:
        served = view.job(job_id).attained_service if job_id in order else 0.0
        return (served, order.get(job_id, len(order)))

    takes = sorted((d.job_id for d in plan.decisions if d.action in _TAKES and d.job_id in limits), key=rank)
    dropped: set[str] = set()
    for jid in takes:
        array, cap = limits[jid]
        if running[array] < cap:
            running[array] += 1
        else:
            dropped.add(jid)
    if not dropped:
        return plan
    log.debug("array throttle: not placing %s this round (%%MAX tasks of their array run)", ", ".join(sorted(dropped)))
    return Plan(tuple(d for d in plan.decisions if d.job_id not in dropped))
