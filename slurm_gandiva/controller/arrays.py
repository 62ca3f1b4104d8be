"""Job arrays in the controller: the %MAX throttle, given to the policy and checked on its plan.

Slurm leaves a released task of an array that already runs %MAX tasks pending (reason JobArrayTaskLimit):
a resume or start past the limit would never start, and its GPUs would sit idle while the protocol waits.
So the controller never places more than MAX tasks of one array at once. The policy sees the throttle as
a generic group cap (`with_array_groups`: each task's `JobSpec.group` is its array's id, and
`ClusterView.group_caps` holds each throttled array's MAX), so it plans within it and time-slices an
array's tasks through its MAX places. The round's group caps (`selector.round.throttle_groups`, on the
tasks as Slurm counts them: `array_members`) are the safety net: they drop the starts and resumes over the
limit as Slurm counts it (a task Slurm still tears down counts), keeping those of the tasks with the least
attained service (never-run tasks first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from slurm_gandiva.model import ClusterView, JobSpec
from slurm_gandiva.selector.round import Member
from slurm_gandiva.slurm.base import SlurmJob

GroupSpecs = dict[str, tuple[JobSpec, JobSpec]]  # job id -> (the store's spec, that spec with its group)


def array_caps(jobs: Mapping[str, SlurmJob]) -> dict[str, int]:
    """Array id -> its %MAX, for the throttled arrays among `jobs` (job id -> SlurmJob)."""
    return {j.array_id: j.array_max_tasks for j in jobs.values() if j.array_id and j.array_max_tasks > 0}


def array_members(jobs: Mapping[str, SlurmJob]) -> dict[str, Member]:
    """The tasks of throttled arrays among `jobs`, for the round's group caps: running while Slurm counts
    them (also while it tears them down)."""
    return {
        jid: Member(j.array_id, j.array_max_tasks, j.running)
        for jid, j in jobs.items()
        if j.array_id and j.array_max_tasks > 0
    }


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
