"""Co-held GPUs in the simulator (issue 31, `SimConfig.park`): parks cost the park/unpark figures, never
two jobs of a group compute at once, a group keeps within its shards and its host memory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_gandiva.model import ClusterView, GpuRef, Job, Placement
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.sim.engine import Overheads, PlanRejected, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob, load_philly
from tests.unit.sim.sim_toy_policies import ToyRoundRobin

COSTS = Overheads(start=0, suspend=5, resume=10, park=1, unpark=2)
ONE_GPU = SimConfig(nodes=1, gpus_per_node=1, overheads=COSTS, park=True)


def trace(*jobs: tuple[str, float, float, int]) -> Trace:
    return Trace("t", tuple(TraceJob(j, s, d, g, model="cifar10") for j, s, d, g in jobs))


def by_id(result: SimResult) -> dict[str, tuple[int, int, float, float]]:
    """Each job's suspends, parks, JCT and dead time (rounded to ms)."""
    return {j.job_id: (j.suspends, j.parks, round(j.jct or -1, 3), round(j.overhead_seconds, 3)) for j in result.jobs}


def test_rotation_within_a_group_pays_park_and_unpark_not_the_requeue() -> None:
    """a: 0-60, parks (GPU free at 61); b starts 61, runs to 121, parks (free at 122); a unparks: trains
    from 124, 40 s left -> 164; b unparks at 164, trains from 166 -> 206. With the requeue switch the same
    rotation ends at 180 and 230 (test_sim_engine's time-slicing test)."""
    jobs = trace(("a", 0, 100, 1), ("b", 0, 100, 1))
    res = Simulator(jobs, ToyRoundRobin(60.0), ONE_GPU).run()
    assert by_id(res) == {"a": (0, 1, 164.0, 3.0), "b": (0, 1, 206.0, 3.0)}
    off = Simulator(jobs, ToyRoundRobin(60.0), replace(ONE_GPU, park=False)).run()
    assert by_id(off) == {"a": (1, 0, 180.0, 15.0), "b": (1, 0, 230.0, 15.0)}


def test_a_group_holds_at_most_shards_jobs_the_rest_requeue() -> None:
    """Three jobs take turns on one GPU of 2 shards: one computes, one parks, the third is requeued."""
    seen: list[int] = []
    sim = Simulator(trace(("a", 0, 300, 1), ("b", 0, 300, 1), ("c", 0, 300, 1)), ToyRoundRobin(60.0), ONE_GPU)

    def check(_t: float, running: tuple[Job, ...]) -> None:
        assert sim.parked is not None
        seen.append(len(sim.parked.on))
        assert all(len(h) + 1 <= 2 for h in sim.parked.at.values())
        assert not {j.job_id for j in running} & set(sim.parked.on)

    res = sim.run(on_round=check)
    assert max(seen) == 1
    assert sum(j.parks for j in res.jobs) > 0 and sum(j.suspends for j in res.jobs) > 0
    assert all(j.finish is not None for j in res.jobs)


def test_gandiva_on_philly_never_computes_two_jobs_of_a_group_at_once() -> None:
    """Gandiva (packing, migration and all) with co-held GPUs: every round, the computing jobs hold
    disjoint GPUs apart from packed shards, no parked job computes, and each group keeps within its
    GPUs' shards; the rotations are parks and unparks where they can be."""
    sim = Simulator(load_philly(vc="2869ce", jobs=30), make_policy("gandiva"), SimConfig(park=True))
    rounds = 0

    def check(_t: float, running: tuple[Job, ...]) -> None:
        nonlocal rounds
        rounds += 1
        assert sim.parked is not None
        whole: dict[GpuRef, str] = {}
        for j in running:
            assert j.placement is not None and j.job_id not in sim.parked.on
            for g in j.placement.gpus:
                if not j.placement.shared:
                    assert g not in whole, f"{j.job_id} and {whole[g]} both compute on {g}"
                    whole[g] = j.job_id
        for jid, keys in sim.parked.on.items():
            held = {GpuRef(n, i) for n, i in keys}
            on = {whole.get(g) for g in held}
            assert len(on) == 1, f"parked {jid}'s GPUs are split between {on}"
            (computing,) = on
            if computing is not None:
                p = next(j.placement for j in running if j.job_id == computing)
                assert p is not None and set(p.gpus) == held
        assert all(len(h) + 1 <= 2 for h in sim.parked.at.values())

    res = sim.run(on_round=check)
    assert rounds > 100
    assert sum(j.parks for j in res.jobs) > 0
    assert all(j.finish is not None for j in res.jobs)


class _UnparkOntoBusy:
    """Parks a, starts b on its GPU, then unparks a while b still computes there: a plan to refuse."""

    name = "toy-unpark-busy"
    elastic = False
    quantum = 10.0

    def decide(self, view: ClusterView, now: float) -> Plan:
        g = Placement((next(iter(view.topology.all_gpus())),))
        a, b = view.job("a"), view.job("b")
        if a.times_scheduled == 0:
            return Plan((Decision(Action.START, "a", g),))
        if b.times_scheduled == 0 and now >= 20:
            return Plan((Decision(Action.PARK, "a"), Decision(Action.START, "b", g)))
        if now >= 40 and b.placement is not None:
            return Plan((Decision(Action.UNPARK, "a", g),))
        return Plan()


def test_the_engine_refuses_two_computing_on_a_group_and_a_park_without_co_holding() -> None:
    jobs = trace(("a", 0, 500, 1), ("b", 0, 500, 1))
    with pytest.raises(PlanRejected, match=r"job a placed on .*, which job b holds"):
        Simulator(jobs, _UnparkOntoBusy(), ONE_GPU).run()
    with pytest.raises(PlanRejected, match="park of job a"):
        Simulator(jobs, _UnparkOntoBusy(), replace(ONE_GPU, park=False)).run()


def test_without_co_holding_nothing_parks() -> None:
    res = Simulator(load_philly(vc="2869ce", jobs=30), make_policy("gandiva"), SimConfig()).run()
    assert sum(j.parks for j in res.jobs) == 0 and sum(j.suspends for j in res.jobs) > 0
