"""CPUs and memory count (issue 29, item 5): no policy places a job on a node whose free CPUs or memory cannot
hold it, whatever GPUs the node has free; what a plan stops frees them; the defaults change nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.placement import GpuPool, realize

PLACING = ("gandiva", "default", "afs-l", "fifo")


def cluster(cpus: int = 8, memory_mb: int = 0, cpus_taken: int = 0, memory_taken_mb: int = 0) -> Topology:
    """Two 4-GPU nodes n1, n2 of `cpus` CPUs and `memory_mb` MB; n2 has `cpus_taken`/`memory_taken_mb` of
    them held by jobs outside the view."""
    base = Topology.uniform(2, 4)
    n1, n2 = base.nodes
    return Topology((
        replace(n1, cpus=cpus, memory_mb=memory_mb),
        replace(n2, cpus=cpus, memory_mb=memory_mb, cpus_taken=cpus_taken, memory_taken_mb=memory_taken_mb),
    ))


def job(jid: str, *, submit: float, cpus: int = 0, mem: int = 0, **kw: object) -> Job:
    spec = JobSpec(jid, "u", 1, 1, submit, total_work=1e9, cpus_per_node=cpus, mem_per_node_mb=mem)
    return Job(spec).evolve(**kw)


def on(jid: str, node: str, index: int, *, cpus: int = 0, mem: int = 0, submit: float = 0.0) -> Job:
    return job(jid, submit=submit, cpus=cpus, mem=mem, state=JobState.RUNNING,
               placement=Placement((GpuRef(node, index),)), slice_start=0.0, first_start=0.0, times_scheduled=1)


def starts(policy: str, view: ClusterView) -> dict[str, tuple[str, ...]]:
    plan = make_policy(policy).decide(view, view.now)
    return {d.job_id: d.placement.nodes for d in plan.decisions
            if d.action in (Action.START, Action.RESUME)}


@pytest.mark.parametrize("policy", PLACING)
def test_a_node_whose_cpus_are_taken_is_not_offered(policy: str) -> None:
    # n1's 8 CPUs are held by two -c 4 jobs; n2's by jobs outside the view. Both have 3-4 free GPUs.
    topo = cluster(cpus=8, cpus_taken=8)
    view = ClusterView(topo, (on("a", "n1", 0, cpus=4), on("b", "n1", 1, cpus=4), job("c", submit=1.0, cpus=1)),
                       now=1.0)
    assert "c" not in starts(policy, view)
    # n2's outside jobs end: c starts there, never on n1.
    free = ClusterView(cluster(cpus=8), view.jobs, now=1.0)
    assert starts(policy, free) == {"c": ("n2",)}


@pytest.mark.parametrize("policy", PLACING)
def test_a_node_whose_memory_is_taken_is_not_offered(policy: str) -> None:
    topo = cluster(cpus=0, memory_mb=8000, memory_taken_mb=6000)
    view = ClusterView(topo, (on("a", "n1", 0, mem=6000), job("c", submit=1.0, mem=4000)), now=1.0)
    assert "c" not in starts(policy, view)
    small = replace(view, jobs=(view.jobs[0], job("c", submit=1.0, mem=2000)))
    assert "c" in starts(policy, small)


def test_a_job_the_plan_stops_frees_its_cpus() -> None:
    # One node of 8 CPUs and 2 GPUs: a waiting job needs the 8 CPUs a running job holds.
    topo = Topology((replace(Topology.uniform(1, 2).nodes[0], cpus=8),))
    hog = on("a", "n1", 0, cpus=8)
    waiting = job("b", submit=1.0, cpus=8)
    view = ClusterView(topo, (hog, waiting), now=1.0)
    both, _ = realize(view, [hog, waiting], {"a": 1, "b": 1})
    assert "b" not in both.placements  # a stays: its CPUs are taken
    swap, _ = realize(view, [hog, waiting], {"b": 1})
    assert swap.placements["a"] is None and swap.placements["b"] is not None  # a stops in the same plan


def test_a_suspended_jobs_cpus_are_free_again() -> None:
    node = replace(Topology.uniform(1, 4).nodes[0], cpus=8)
    topo = Topology((node,))
    suspended = job("a", submit=0.0, cpus=8, state=JobState.SUSPENDED, times_scheduled=1)
    view = ClusterView(topo, (suspended, job("b", submit=1.0, cpus=4)), now=1.0)
    assert starts("fifo", view) == {"a": ("n1",)}  # a holds nothing while suspended: it may resume


def test_the_pool_counts_what_it_books_and_releases() -> None:
    topo = Topology((replace(Topology.uniform(1, 4).nodes[0], cpus=8, memory_mb=100),))
    pool = GpuPool(topo)
    a = job("a", submit=0.0, cpus=6, mem=50)
    p = pool.find(a, 1)
    assert p is not None and pool.book(p, a)
    assert pool.find(a, 1) is None  # 2 CPUs left
    assert pool.find(job("b", submit=0.0, cpus=2, mem=50), 1) is not None
    assert pool.find(job("b", submit=0.0, cpus=2, mem=51), 1) is None
    pool.release(p, a)
    assert pool.find(a, 1) is not None


@pytest.mark.parametrize("policy", PLACING)
def test_defaults_change_nothing(policy: str) -> None:
    # No CPUs counted (the simulator's nodes): jobs that say they need CPUs are placed as before.
    topo = Topology.uniform(1, 4)
    jobs = tuple(job(f"j{i}", submit=float(i), cpus=64, mem=10**6) for i in range(3))
    plain = tuple(job(f"j{i}", submit=float(i)) for i in range(3))
    assert starts(policy, ClusterView(topo, jobs, now=5.0)) == starts(policy, ClusterView(topo, plain, now=5.0))
    assert len(starts(policy, ClusterView(topo, jobs, now=5.0))) == 3
