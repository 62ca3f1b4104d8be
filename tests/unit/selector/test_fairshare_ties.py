"""Slurm 22.05's tie (`ClusterView.requeue_ties`) in the fair-share layer: a tenant decided on a sub-view of its
GPUs does not see the GPUs another tenant's jobs hold, so the layer itself keeps a tied resume off a node where
another tenant's job that stays holds one of the job's old GPU indices."""

from __future__ import annotations

import pytest

from slurm_gandiva.controller.act import _tie_conflicts
from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.fairshare import FairShare


def tied_view(ties: bool = True) -> tuple[ClusterView, list[GpuRef]]:
    """One node of 4 GPUs, alice and bob with equal shares (2 GPUs each). Alice holds g0 and g2 and waits
    with a third job (at her cap: she is decided alone, on g0 and g2). Bob's b0 last ran on g2 (Slurm ties
    it to index 2) and waits suspended, b1 waits; g1 and g3 are free. Bob's sub-view (g1, g3) does not
    show that alice's a1 holds g2, the index b0 is tied to. As on 22.05, no packing where Slurm ties."""
    topo = Topology.uniform(1, 4)
    g = list(topo.all_gpus())
    jobs = (
        Job(JobSpec("a0", "alice", 1, 1, 0.0), JobState.RUNNING, Placement((g[0],)), attained_service=50.0),
        Job(JobSpec("a1", "alice", 1, 1, 0.0), JobState.RUNNING, Placement((g[2],)), attained_service=40.0),
        Job(JobSpec("a2", "alice", 1, 1, 1.0)),
        Job(JobSpec("b0", "bob", 1, 1, 2.0), JobState.SUSPENDED, attained_service=30.0, last_gpus=(g[2],)),
        Job(JobSpec("b1", "bob", 1, 1, 3.0)),
    )
    return ClusterView(topo, jobs, now=600.0, requeue_ties=ties, packing=not ties), g


def conflicts(view: ClusterView, decisions: list[Decision]) -> dict[int, str]:
    """The resumes the actor would skip (`act._tie_conflicts`, the net behind the layer)."""
    held = {j.job_id: j.placement for j in view.running if j.placement is not None}
    last = {j.job_id: Placement(j.last_gpus) for j in view.jobs if j.last_gpus}
    return _tie_conflicts(decisions, held, last)


@pytest.mark.parametrize("name", ["fifo", "gandiva", "default"])
def test_no_tied_resume_onto_an_index_another_tenants_job_holds(name: str) -> None:
    view, g = tied_view()
    plan = FairShare(make_policy(name)).decide(view, view.now)
    assert not conflicts(view, list(plan.decisions)), plan  # the actor's net has nothing to skip
    assert not plan.apply(view).consistency_errors()
    # bob still gets his share: b1 (untied) runs on a GPU free to him
    starts = {d.job_id: d.placement for d in plan.by_action(Action.START)}
    assert "b1" in starts and starts["b1"] is not None and set(starts["b1"].gpus) <= {g[1], g[3]}
    assert "b0" not in {d.job_id for d in plan.by_action(Action.RESUME)}


def test_without_ties_the_resume_stands() -> None:
    view, g = tied_view(ties=False)
    plan = FairShare(make_policy("fifo")).decide(view, view.now)
    resumed = {d.job_id: d.placement for d in plan.by_action(Action.RESUME)}
    b0 = resumed.get("b0")
    assert b0 is not None and set(b0.gpus) <= {g[1], g[3]}
