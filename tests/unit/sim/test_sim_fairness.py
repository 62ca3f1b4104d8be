"""Fairness among tenants (issue 30): rho, GPU-time against shares, Jain's index."""

from __future__ import annotations

import math

import pytest

from slurm_gandiva.selector import make_policy
from slurm_gandiva.sim.engine import JobResult, Overheads, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.fairness import (
    Fairness,
    entitled_fractions,
    format_fairness,
    isolated_config,
    isolated_jcts,
    jain,
)
from slurm_gandiva.sim.trace import Trace, TraceJob


def done(jid: str, submit: float, finish: float, gpu_s: float) -> JobResult:
    return JobResult(jid, "bert", 1, 1, 1, submit, submit, finish, None, 0, 0, 0, 0, gpu_s, 0.0)


TRACE = Trace(
    "t",
    (
        TraceJob("j0", 0.0, 50.0, 1, user="alice", account="a"),
        TraceJob("j1", 0.0, 50.0, 1, user="alice", account="a"),
        TraceJob("j2", 0.0, 100.0, 1, user="bob", account="b"),
    ),
)


def test_rho_received_and_jain_by_hand() -> None:
    jobs = (done("j0", 0, 100, 100), done("j1", 0, 200, 100), done("j2", 0, 300, 100))
    res = SimResult("p", "t", 2, False, Overheads(), jobs, (), 300.0, 1, 1)
    fair = Fairness.of(res, TRACE, {}, {"j0": 50.0, "j1": 100.0, "j2": 100.0})
    alice, bob = fair.tenants
    assert (alice.avg_rho, alice.worst_rho, bob.avg_rho) == (2.0, 2.0, 3.0)
    assert fair.worst_tenant_rho == 3.0 and fair.avg_rho == pytest.approx(7 / 3)
    # alice: half of 2 GPUs over [0, 200] = 200 GPU-s due, 200 got; bob: 300 due, 100 got.
    assert (alice.entitled, alice.received, bob.entitled, bob.received) == (200.0, 200.0, 300.0, 100.0)
    assert fair.jain == pytest.approx((1 + 1 / 3) ** 2 / (2 * (1 + 1 / 9)))  # 0.8
    assert "a/alice" in format_fairness(fair) and "0.800" in format_fairness(fair)


def test_entitled_fractions_follow_account_shares_then_users() -> None:
    f = entitled_fractions([("a", "x"), ("a", "y"), ("b", "z")], {"a": 3})
    assert f == {("a", "x"): 0.375, ("a", "y"): 0.375, ("b", "z"): 0.25}


def test_jain() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0]) == 0.5
    assert math.isnan(jain([]))


def test_isolated_runs_give_each_tenant_its_share() -> None:
    # Two tenants, equal shares, 2 GPUs: alone each has 1 GPU. Alice's two 1-GPU jobs run one after
    # the other alone (JCT 50 and 100 s, in the seeded tie order); bob's job runs at once (100 s).
    cfg = SimConfig(nodes=1, gpus_per_node=2, gpus_per_switch=2)
    shared = Simulator(TRACE, make_policy("fifo"), cfg).run()
    alone = isolated_jcts(TRACE, shared, lambda: make_policy("fifo"), cfg)
    assert sorted(alone) == ["j0", "j1", "j2"]
    assert sorted([alone["j0"], alone["j1"]]) == [pytest.approx(50.0), pytest.approx(100.0)]
    assert alone["j2"] == pytest.approx(100.0)
    fair = Fairness.of(shared, TRACE, {}, alone)
    jct = {j.job_id: j.jct or math.nan for j in shared.jobs}
    assert fair.job_rho == {jid: pytest.approx(jct[jid] / alone[jid]) for jid in alone}
    assert sum(jct.values()) == pytest.approx(250.0)  # shared: two start at once, the third waits 50 s


def test_isolated_config_keeps_whole_nodes() -> None:
    cfg = SimConfig(nodes=64, gpus_per_node=4)
    assert isolated_config(cfg, 64).topology().total_gpus == 64
    assert isolated_config(cfg, 2).topology().total_gpus == 2
