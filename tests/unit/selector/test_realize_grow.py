"""`realize` grows a job only where it runs faster; the elastic rule decides again without a grow it refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Locality, Placement, RateTable
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.selector.afs import AfsL, GrowRefusals, settled_plan
from slurm_gandiva.selector.placement import realize
from tests.helpers import TWO_BY_FOUR, gp


# A job that runs 100/s on two GPUs under one switch, 180/s on four in one node, `cross`/s on three or four
# over nodes.
def rates(cross: float) -> RateTable:
    return RateTable({
        (1, Locality.SWITCH): 55.0,
        (2, Locality.SWITCH): 100.0,
        (3, Locality.NODE): 140.0,
        (3, Locality.CROSS_NODE): cross,
        (4, Locality.NODE): 180.0,
        (4, Locality.CROSS_NODE): cross,
    })


def job(jid: str, gpus: int, at: Placement, table: RateTable | None = None, max_gpus: int = 4) -> Job:
    spec = JobSpec(jid, "u", 1, max_gpus, 0.0, total_work=1e6)
    return Job(spec).evolve(state=JobState.RUNNING, placement=at, times_scheduled=1, rates=table or RateTable())


def refusing() -> tuple[Job, Job, Job]:
    """a on n1 (scales well, slower over nodes), b beside it (rigid), d on all of n2 (scales poorly): the rule
    gives a four GPUs and takes two from d, but a's only four-GPU placement spans the nodes."""
    b = job("b", 2, gp("n1", 2, 3), max_gpus=2)
    b = b.evolve(spec=replace(b.spec, min_gpus=2))
    a = job("a", 2, gp("n1", 0, 1), rates(90.0))
    poor = RateTable({(1, Locality.SWITCH): 50.0, (2, Locality.SWITCH): 60.0, (4, Locality.NODE): 70.0})
    return a, b, job("d", 4, gp("n2", 0, 1, 2, 3), poor)


def test_a_grow_that_could_only_spread_over_nodes_where_the_job_is_slower_is_not_made() -> None:
    # a holds n1's switch 0; b holds n1's switch 1 and c n2's switch 0: four GPUs for a means two on each node.
    b, c = job("b", 2, gp("n1", 2, 3), max_gpus=2), job("c", 2, gp("n2", 0, 1), max_gpus=2)
    for cross, grows in ((90.0, False), (150.0, True)):
        a = job("a", 2, gp("n1", 0, 1), rates(cross))
        view = ClusterView(TWO_BY_FOUR, (a, b, c))
        targets, _ = realize(view, [a, b, c], {"a": 4, "b": 2, "c": 2})
        assert ("a" in targets.placements) is grows, cross
        if grows:
            p = targets.placements["a"]
            assert p is not None and p.count == 4 and len(p.nodes) == 2


def test_the_rule_decides_again_without_a_grow_the_placement_refused() -> None:
    # The rule gives a four GPUs (it scales well) and takes two from d (it scales poorly), but a's only
    # four-GPU placement spans the nodes, where it is slower: d keeps its GPUs instead of idling two.
    a, b, d = refusing()
    view = ClusterView(TWO_BY_FOUR, (a, b, d))
    once = realize(view, [a, b, d], {"a": 4, "b": 2, "d": 2})[0].plan(view)
    assert [(x.job_id, x.action) for x in once.decisions] == [("d", Action.RESIZE)]  # what one pass did
    assert AfsL().decide(view, 0.0).decisions == ()


def test_a_refused_grow_is_remembered_while_the_jobs_and_its_placement_stay_and_forgotten_after() -> None:
    """`GrowRefusals`: the next round starts from the refusal (no pass finds it again), until a job arrives or
    leaves or the refused job is moved; a set of jobs asked about in the last round keeps its own refusals
    (the fair-share layer asks about the whole cluster and about groups), an older one starts afresh."""
    a, b, d = refusing()
    view = ClusterView(TWO_BY_FOUR, (a, b, d))
    e = Job(JobSpec("e", "u", 1, 1, 0.0, total_work=1e6))  # waiting
    mem = GrowRefusals()
    passes: list[dict[str, int]] = []

    def count(limit: Callable[[Job], int]) -> dict[str, int]:
        out = {"a": min(4, limit(a)), "b": 2}
        out["d"] = 8 - out["a"] - 2
        passes.append(out)
        return out

    def place(counts: dict[str, int]) -> Plan:
        return realize(view, [a, b, d], counts)[0].plan(view)

    def limit(j: Job) -> int:
        return j.spec.max_gpus

    def round_(at: float, v: ClusterView = view) -> list[dict[str, int]]:
        passes.clear()
        settled_plan(replace(v, now=at), count, place, limit, mem)
        return list(passes)

    settled, refused = {"a": 2, "b": 2, "d": 4}, {"a": 4, "b": 2, "d": 2}
    assert settled_plan(view, count, place, limit, mem).decisions == ()
    assert passes == [refused, settled]  # refused, then settled
    assert round_(1.0) == [settled]  # the next round starts from it: one pass
    assert round_(2.0, ClusterView(TWO_BY_FOUR, (a.evolve(placement=gp("n1", 2, 3)), b.evolve(
        placement=gp("n1", 0, 1)), d)))[0] == refused  # moved: forgotten
    assert round_(3.0) == [refused, settled]
    assert round_(3.0, ClusterView(TWO_BY_FOUR, (a, b, d, e)))[0] == refused  # another set: none of its caps
    assert round_(4.0) == [settled]  # asked about in the last round: kept
    assert round_(5.0, ClusterView(TWO_BY_FOUR, (a, b, d, e))) == [refused, settled]  # two rounds ago: afresh
