"""The round's co-held switch (issue 31): where the view allows co-held placements (`ClusterView.co_hold`),
a switch between two jobs on the same GPUs becomes a park and an unpark instead of a requeue.

The policies plan as if every stop were a requeue (a parked job is a suspended job to them); `co_held`
then rewrites the plan, keeping every placement it chose:

- a stop of a running job whose GPUs go, whole, to exactly one other job parks it (it keeps a shard of
  each and its device state in host memory), when the group then has room (at most a node's `shards`
  jobs hold the GPUs, the computing one included) and its state fits its nodes' host memory for parked
  jobs;
- a parked job given back exactly the GPUs it co-holds unparks (no Slurm call, no new process);
- a parked job that stays waiting keeps its GPUs while the jobs computing on them hold exactly those GPUs,
  whole; otherwise (a job takes some of them, or packs onto them) it leaves them: requeued from host
  memory, a SUSPEND of the parked job. A parked job placed elsewhere is requeued and resumed there (its
  RESUME stands).

Pure, as every rule of the round; without `co_hold` the plan is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from slurm_gandiva.model import ClusterView, CoHold, GpuRef, JobState, Placement
from slurm_gandiva.plan import Action, Decision, Plan

_Gpus = frozenset[GpuRef]


def co_held(plan: Plan, view: ClusterView) -> Plan:
    """`plan` with its switches within co-held groups made parks and unparks (see the module docstring)."""
    co = view.co_hold
    if co is None or not plan:  # nothing moves: every parked job keeps its GPUs
        return plan
    by_job = {d.job_id: d for d in plan.decisions}
    # Where every job computes once the plan is carried out.
    final: dict[str, Placement] = {}
    for j in view.jobs:
        if j.state is JobState.RUNNING and j.placement is not None and j.job_id not in by_job:
            final[j.job_id] = j.placement
    for d in plan.decisions:
        if d.placement is not None:
            final[d.job_id] = d.placement
    users: dict[GpuRef, list[Placement]] = {}
    computing: dict[_Gpus, str] = {}  # GPU set held whole -> the job computing on it
    for jid, p in final.items():
        for g in p.gpus:
            users.setdefault(g, []).append(p)
        if not p.shared:
            computing[frozenset(p.gpus)] = jid
    out: dict[str, Decision] = dict(by_job)
    staying: dict[_Gpus, list[str]] = {}
    for jid, held in co.parked.items():
        gpus = frozenset(held.gpus)
        back = by_job.get(jid)
        if back is not None and back.action is Action.RESUME:
            to = back.placement
            if to is not None and not to.shared and frozenset(to.gpus) == gpus:
                out[jid] = replace(back, action=Action.UNPARK)
            continue  # elsewhere: requeued from host memory and resumed there
        if all(frozenset(q.gpus) == gpus and not q.shared for g in gpus for q in users.get(g, ())):
            staying.setdefault(gpus, []).append(jid)
        else:
            out[jid] = Decision(Action.SUSPEND, jid, reason="leaves its co-held GPUs: another job takes them")
    used = _host_use(co, staying)
    for d in plan.decisions:
        if d.action is not Action.SUSPEND or d.job_id in co.parked:
            continue
        job = view.job(d.job_id)
        at = job.placement
        state = co.state_bytes.get(d.job_id)
        if at is None or at.shared or state is None or job.state is not JobState.RUNNING:
            continue
        gpus = frozenset(at.gpus)
        taker = computing.get(gpus)
        if taker is None or taker == d.job_id:
            continue
        room = min(view.topology.node(g.node).shards for g in gpus)
        group = staying.get(gpus, [])
        if len(group) + 2 > room:  # the parked ones, this one and the one computing
            continue
        need = _per_node(at, state)
        if any(used.get(n, 0) + b > co.host_bytes.get(n, 0) for n, b in need.items()):
            continue
        for n, b in need.items():
            used[n] = used.get(n, 0) + b
        staying.setdefault(gpus, []).append(d.job_id)
        out[d.job_id] = replace(d, action=Action.PARK, reason=f"{d.reason}; parks: {taker} computes on its GPUs")
    if out == by_job:
        return plan
    return Plan(tuple(out.values()))


def _per_node(p: Placement, state: int) -> dict[str, int]:
    """Host memory (bytes per node) a job parked on `p` keeps, `state` bytes per GPU."""
    out: dict[str, int] = {}
    for g in p.gpus:
        out[g.node] = out.get(g.node, 0) + state
    return out


def _host_use(co: CoHold, staying: Mapping[_Gpus, list[str]]) -> dict[str, int]:
    """Host memory (bytes per node) the parked jobs that stay parked keep."""
    used: dict[str, int] = {}
    for jobs in staying.values():
        for jid in jobs:
            for n, b in _per_node(co.parked[jid], co.state_bytes.get(jid, 0)).items():
                used[n] = used.get(n, 0) + b
    return used
