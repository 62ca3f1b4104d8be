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

A throttled array's never-run tail is tracked lazily (`array_window`): only its tasks that have run, plus
a window of its next never-run waiting tasks in task order (`window_size`: a few times %MAX, enough to
rotate through its places), are registered and shown to the policy; the rest are one summary per array
(`Untracked`) until a place in the window frees (a task runs, ends or is cancelled). A 90,000-task `%1`
array then costs a round what a few dozen jobs do, and no one else's new job waits behind its tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

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


# A throttled array's window of never-run waiting tasks: WINDOW_ROUNDS x max(%MAX, WINDOW_MIN) tasks, so the
# policy can rotate its tasks through its places for a few rounds before the window moves on.
WINDOW_MIN = 8
WINDOW_ROUNDS = 4


def window_size(max_tasks: int) -> int:
    """How many never-run waiting tasks of an array throttled to `max_tasks` are tracked at once."""
    return WINDOW_ROUNDS * max(max_tasks, WINDOW_MIN)


@dataclass(frozen=True)
class Untracked:
    """The never-run waiting tasks of one throttled array past its window: not registered, not shown to the
    policy, until the window reaches them."""

    array_id: str
    user: str
    name: str
    tasks: tuple[int, ...]  # their task ids, sorted

    @property
    def job_id(self) -> str:
        """The tasks in Slurm's notation: "42_[100-89999]"."""
        return f"{self.array_id}_[{task_ranges(self.tasks)}]"


def _task_number(job_id: str) -> int:
    tail = job_id.rpartition("_")[2]
    return int(tail) if tail.isdigit() else -1


def task_ranges(tasks: Sequence[int]) -> str:
    """Sorted task ids -> Slurm's list notation: [1, 2, 3, 5] -> "1-3,5"."""
    out: list[str] = []
    i = 0
    while i < len(tasks):
        j = i
        while j + 1 < len(tasks) and tasks[j + 1] == tasks[j] + 1:
            j += 1
        out.append(str(tasks[i]) if i == j else f"{tasks[i]}-{tasks[j]}")
        i = j + 1
    return ",".join(out)


def array_window(jobs: dict[str, SlurmJob]) -> tuple[dict[str, SlurmJob], dict[str, Untracked]]:
    """`jobs` (job id -> SlurmJob, in Slurm's order) less the never-run waiting tasks of each throttled
    array past its window (`window_size`: the lowest task ids are tracked first), and those tasks as one
    `Untracked` per array. Stable from round to round: a tracked task stays tracked until it runs or ends
    (arrays never gain tasks), so its record and the policy's view of it are never dropped."""
    tails: dict[str, list[str]] = {}
    for jid, j in jobs.items():
        if j.array_max_tasks > 0 and j.restart_count == 0 and j.state == "PENDING" and j.array_id:
            tails.setdefault(j.array_id, []).append(jid)
    drop: set[str] = set()
    untracked: dict[str, Untracked] = {}
    for array, tail in tails.items():
        width = window_size(jobs[tail[0]].array_max_tasks)
        if len(tail) <= width:
            continue
        nums = list(map(_task_number, tail))
        if nums != sorted(nums):  # Slurm lists a meta record's tasks in order; split-off ones may not be
            pairs = sorted(zip(nums, tail, strict=True))
            nums, tail = [n for n, _ in pairs], [jid for _, jid in pairs]
        drop.update(tail[width:])
        first = jobs[tail[width]]
        untracked[array] = Untracked(array, first.user, first.name, tuple(nums[width:]))
    if not drop:
        return jobs, {}
    return {jid: j for jid, j in jobs.items() if jid not in drop}, untracked
