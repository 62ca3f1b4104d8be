"""Job arrays in the controller: the %MAX throttle as a plan filter.

Slurm leaves a released task of an array that already runs %MAX tasks pending (reason JobArrayTaskLimit):
a resume or start past the limit would never start, and its GPUs would sit idle while the protocol waits.
So the controller never places more than MAX tasks of one array at once. The policy stays unaware of arrays
(the simulator runs the same policies); this filter, run on each round's plan, drops the starts and
resumes over the limit, keeping those of the tasks with the least attained service (never-run tasks
first: early feedback on every configuration of a search).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from slurm_gandiva.model import ClusterView
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.slurm.base import SlurmJob

log = logging.getLogger(__name__)

_TAKES = (Action.START, Action.RESUME)


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
