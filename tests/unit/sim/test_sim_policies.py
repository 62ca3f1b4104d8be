"""Every real policy (the controller's objects, by name) runs in the simulator: plans accepted, views
consistent, all jobs done, and the same result twice."""

from __future__ import annotations

import pytest

from slurm_gandiva.model import ClusterView
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.sim.engine import SimConfig, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob

# 24 jobs of mixed sizes and models arriving in bursts on 8 GPUs (2 nodes x 4): oversubscribed.
TRACE = Trace(
    "mix",
    tuple(
        TraceJob(f"j{i}", 120.0 * (i // 4), 600.0 + 450.0 * (i % 5), (1, 2, 1, 4)[i % 4], model=m)
        for i, m in enumerate(["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"] * 4)
    ),
)


class Checked:
    """Wraps a policy; asserts that each plan leaves a consistent view."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.quantum = getattr(inner, "quantum", None)
        self.elastic = getattr(inner, "elastic", None)
        self.rotation_grid = getattr(inner, "rotation_grid", None)
        self.calls = 0

    def decide(self, view: ClusterView, now: float) -> Plan:
        assert view.consistency_errors() == []
        plan = self.inner.decide(view, now)
        after = plan.apply(view, now)
        assert after.consistency_errors() == [], (self.name, now, plan)
        self.calls += 1
        return plan


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_runs_to_completion_in_the_simulator(name: str) -> None:
    cfg = SimConfig(nodes=2, gpus_per_node=4, seed=3)
    pol = Checked(make_policy(name))
    res = Simulator(TRACE, pol, cfg).run()
    assert pol.calls == res.decisions > 0
    assert all(j.finish is not None for j in res.jobs), [j.job_id for j in res.jobs if j.finish is None]
    assert all(j.jct is not None and j.jct > 0 for j in res.jobs)
    again = Simulator(TRACE, make_policy(name), cfg).run()
    assert again.jobs == res.jobs


def test_aligned_gandiva_rotates_on_the_quantum_grid_in_the_simulator() -> None:
    """Two 1-GPU jobs on one GPU, quantum 30 s, no costs: the engine wakes at the rotations, so every
    suspend is decided at a multiple of 30 s (not 30 s after each slice began)."""
    from slurm_gandiva.plan import Action
    from slurm_gandiva.sim.engine import Overheads

    suspends: list[float] = []

    class Spy(Checked):
        def decide(self, view: ClusterView, now: float) -> Plan:
            plan = super().decide(view, now)
            suspends.extend(now for d in plan.decisions if d.action is Action.SUSPEND)
            return plan

    jobs = (TraceJob("a", 5.0, 100.0, 1, model="cifar10"), TraceJob("b", 12.0, 100.0, 1, model="cifar10"))
    trace = Trace("two", jobs)
    cfg = SimConfig(nodes=1, gpus_per_node=1, overheads=Overheads(start=0.0, suspend=0.0, resume=0.0))
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    res = Simulator(trace, Spy(pol), cfg).run()
    assert all(j.finish is not None for j in res.jobs)
    assert suspends and all(t % 30.0 == pytest.approx(0.0) for t in suspends), suspends
