"""Placements across nodes where Slurm gives a job the same GPUs on every node (per-node gres)."""

from __future__ import annotations

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.placement import GpuPool, even_shrink, is_even, realize
from tests.helpers import TWO_BY_FOUR, gp

FOUR_BY_FOUR = Topology.uniform(4, 4, gpus_per_switch=2, sockets=2)


def job(jid: str, gpus: int, submit: float = 0.0, **kw: object) -> Job:
    return Job(JobSpec(jid, "u", gpus, gpus, submit, total_work=1000.0)).evolve(**kw)


def across(*parts: Placement) -> Placement:
    return Placement(tuple(g for p in parts for g in p.gpus))


def find(topo: Topology, busy: tuple[Placement, ...], j: Job, k: int) -> Placement | None:
    pool = GpuPool(topo, even_spans=True)
    for p in busy:
        assert pool.book(p)
        pool.settle(p)
    return pool.find(j, k)


def test_a_job_wider_than_a_node_gets_whole_nodes_and_an_odd_split_never() -> None:
    assert find(TWO_BY_FOUR, (), job("x", 8), 8) == across(gp("n1", 0, 1, 2, 3), gp("n2", 0, 1, 2, 3))
    # 6 GPUs: three on each node, the same three (free placement would take 4 + 2).
    six = find(TWO_BY_FOUR, (), job("x", 6), 6)
    assert six is not None and is_even(six) and len(six.nodes) == 2 and six.count == 6
    # 5 GPUs cannot be spread evenly over two nodes of four: the job waits.
    assert find(TWO_BY_FOUR, (), job("x", 5), 5) is None


def test_the_same_free_indices_are_needed_on_every_node() -> None:
    # n1 has 0,1 free; n2 has 2,3 free: four GPUs are free but no two nodes share two free indices.
    busy = (gp("n1", 2, 3), gp("n2", 0, 1))
    assert find(TWO_BY_FOUR, busy, job("x", 4), 4) is None
    # On four nodes, two of them share 2,3: the job goes there, best fit first.
    busy4 = (gp("n1", 0, 1), gp("n2", 0, 1), gp("n3", 0, 1, 2), gp("n4", 0, 1, 2))
    assert find(FOUR_BY_FOUR, busy4, job("x", 4), 4) == across(gp("n1", 2, 3), gp("n2", 2, 3))


def test_max_nodes_limits_even_spans() -> None:
    eight = Job(JobSpec("x", "u", 8, 8, 0.0, total_work=1.0, max_nodes=1))
    assert find(FOUR_BY_FOUR, (), eight, 8) is None
    two = Job(JobSpec("x", "u", 8, 8, 0.0, total_work=1.0, max_nodes=2))
    found = find(FOUR_BY_FOUR, (), two, 8)
    assert found is not None and len(found.nodes) == 2


def test_even_shrink_keeps_an_even_part_or_none() -> None:
    eight = across(gp("n1", 0, 1, 2, 3), gp("n2", 0, 1, 2, 3))
    assert even_shrink(TWO_BY_FOUR, eight, 4) == gp("n1", 0, 1, 2, 3)  # one whole node
    six = even_shrink(TWO_BY_FOUR, eight, 6)
    assert six is not None and is_even(six) and six.count == 6 and len(six.nodes) == 2
    assert even_shrink(TWO_BY_FOUR, eight, 5) is None


def test_realize_shrinks_a_wide_job_onto_one_node_and_places_one_that_cannot_shrink_evenly_anew() -> None:
    eight = across(gp("n1", 0, 1, 2, 3), gp("n2", 0, 1, 2, 3))
    wide = job("w", 8, state=JobState.RUNNING, placement=eight, times_scheduled=1)
    view = ClusterView(TWO_BY_FOUR, (wide,), same_gpus_per_node=True)
    targets, _ = realize(view, [wide], {"w": 4})
    assert targets.placements["w"] == gp("n1", 0, 1, 2, 3)
    targets, _ = realize(view, [wide], {"w": 3})
    assert targets.placements["w"] is not None and len(targets.placements["w"].nodes) == 1


def test_every_policy_plans_only_even_spans_when_the_view_says_so() -> None:
    jobs = tuple(job(f"j{i}", k, float(i)) for i, k in enumerate((6, 2, 3, 8, 1)))
    view = ClusterView(TWO_BY_FOUR, jobs, same_gpus_per_node=True)
    wide = 0
    for name in ("gandiva", "afs-l", "fifo", "srtf", "tiresias", "slurm"):
        plan = make_policy(name).decide(view, 0.0)
        for d in plan.decisions:
            if d.placement is not None and len(d.placement.nodes) > 1:
                assert is_even(d.placement), (name, d)
                assert all(isinstance(g, GpuRef) for g in d.placement.gpus)
                wide += 1
    assert wide  # some policy did place a job across the nodes


def test_gandiva_keeps_whole_nodes_for_a_waiting_job_wider_than_a_node() -> None:
    """Narrow jobs do not starve a job wider than a node: once their slices are old, gandiva stops those
    on whole nodes and starts the wide job there (3 + 3 of the same GPUs)."""
    narrow = tuple(
        job(f"n{i}", 1, float(i)).evolve(
            state=JobState.RUNNING, placement=gp(f"n{1 + i // 4}", i % 4), slice_start=0.0, first_start=0.0,
            times_scheduled=1, attained_service=500.0,
        )
        for i in range(8)
    )
    wide = job("w", 6, 100.0)
    view = ClusterView(TWO_BY_FOUR, (*narrow, wide), now=600.0, same_gpus_per_node=True)
    plan = make_policy("gandiva").decide(view, 600.0)
    placed = {d.job_id: d.placement for d in plan.decisions if d.placement is not None}
    assert "w" in placed, plan
    assert is_even(placed["w"]) and placed["w"].count == 6 and len(placed["w"].nodes) == 2
