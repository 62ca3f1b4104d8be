"""The `slurm` baseline's multifactor priority (issue 30): Fair Tree and classic fairshare, age, as Slurm."""

from __future__ import annotations

import math

import pytest

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Topology
from slurm_gandiva.selector import check_params, make_policy
from slurm_gandiva.selector.baselines import Slurm, classic_factors, fair_tree_factors
from slurm_gandiva.sim.engine import SimConfig, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob
from tests.helpers import gp

NOW = 1000.0


def test_fair_tree_ranks_accounts_first_then_users_by_level_fs() -> None:
    # a: S=1/2, U=400/400 -> LevelFS 0.5; b: no usage -> inf, so b's user is above both of a's.
    # In a: u1 S=1/2 U=3/4 -> 0.67, u2 S=1/2 U=1/4 -> 2.
    usage = {("a", "u1"): 300.0, ("a", "u2"): 100.0}
    f = fair_tree_factors({("a", "u1"), ("a", "u2"), ("b", "u3")}, usage, {}, {})
    assert f == {("b", "u3"): 1.0, ("a", "u2"): pytest.approx(2 / 3), ("a", "u1"): pytest.approx(1 / 3)}
    # b's share 1/3 of a's 2/3: b (S=1/3 over U=100/500) -> 1.67 stays above a (S=2/3, U=0.8) -> 0.83
    usage[("b", "u3")] = 100.0
    f = fair_tree_factors(set(usage), usage, {"a": 2, "b": 1}, {})
    assert max(f, key=lambda t: f[t]) == ("b", "u3")


def test_fair_tree_ties_share_a_rank() -> None:
    f = fair_tree_factors({("a", "x"), ("b", "y")}, {}, {}, {})
    assert f == {("a", "x"): 1.0, ("b", "y"): 1.0}


def test_classic_factor_is_two_to_the_minus_effective_usage_over_shares() -> None:
    # a/x has all the usage: EffectvUsage 1, NormShares 1/2 -> 2^-2; b/y none -> 1.
    f = classic_factors({("a", "x"), ("b", "y")}, {("a", "x"): 100.0}, {}, {})
    assert f == {("a", "x"): 0.25, ("b", "y"): 1.0}
    # Two users in the one account a (equal shares), x used 3/4 of all, w 1/4: a's EffectvUsage 1;
    # x: 0.75 + (1 - 0.75) * 1/2 = 0.875 over NormShares 1/2 * 1/1 -> 2^-1.75; w: 0.625 / 0.5.
    f = classic_factors({("a", "x"), ("a", "w")}, {("a", "x"): 75.0, ("a", "w"): 25.0}, {}, {})
    assert f[("a", "x")] == pytest.approx(2**-1.75)
    assert f[("a", "w")] == pytest.approx(2**-1.25)


def waiting(jid: str, user: str, account: str, submit: float) -> Job:
    return Job(JobSpec(jid, user, 2, 2, submit, total_work=100.0, account=account))


def alice_running() -> Job:
    return Job(JobSpec("r", "alice", 2, 2, 0.0, total_work=1e9, account="a")).evolve(
        state=JobState.RUNNING, placement=gp("n1", 0, 1), attained_service=2 * NOW, slice_start=0.0,
        first_start=0.0, times_scheduled=1,
    )


@pytest.mark.parametrize("mode", ["fair_tree", "classic"])
def test_a_user_without_usage_goes_before_an_earlier_job_of_a_heavy_user(mode: str) -> None:
    jobs = (alice_running(), waiting("alice2", "alice", "a", 10.0), waiting("bob1", "bob", "b", 600.0))
    view = ClusterView(Topology.uniform(1, 4), jobs, NOW)
    plan = make_policy("slurm", fairshare=mode).decide(view, NOW)
    assert [d.job_id for d in plan.decisions] == ["bob1"]
    plain = make_policy("slurm", fairshare="off").decide(view, NOW)
    assert [d.job_id for d in plain.decisions] == ["alice2"]  # strict submit order: today's baseline
    zero = make_policy("slurm", weight_fairshare=0.0, weight_age=0.0).decide(view, NOW)
    assert [d.job_id for d in zero.decisions] == ["alice2"]


def test_age_breaks_a_fairshare_tie_and_usage_decays() -> None:
    pol = Slurm(max_age=100.0)
    jobs = (waiting("late", "x", "a", 900.0), waiting("early", "y", "b", 0.0))
    prio = pol.priorities(ClusterView(Topology.uniform(1, 4), jobs, NOW), jobs)
    assert prio == {"late": 10000 + 1000, "early": 10000 + 1000}  # both ages past max_age: a tie
    pol.usage.usage[("a", "x")] = 8.0
    pol.usage.at = 0.0
    pol.decide(ClusterView(Topology.uniform(1, 4), jobs, 2 * 7 * 86400.0), 2 * 7 * 86400.0)
    assert pol.usage.usage[("a", "x")] == pytest.approx(2.0)  # two half-lives


def test_one_tenant_runs_exactly_as_strict_submit_order() -> None:
    trace = Trace(
        "one", tuple(TraceJob(f"j{i}", 300.0 * i, 3600.0 * (1 + i % 3), 1 + i % 4, model="cifar10") for i in range(30))
    )
    cfg = SimConfig(nodes=2, gpus_per_node=4)
    multi = Simulator(trace, make_policy("slurm"), cfg).run()
    plain = Simulator(trace, make_policy("slurm", fairshare="off"), cfg).run()
    assert [(j.job_id, j.first_start, j.finish) for j in multi.jobs] == [
        (j.job_id, j.first_start, j.finish) for j in plain.jobs
    ]
    assert all(j.finish is not None and math.isfinite(j.finish) for j in multi.jobs)


def test_fairshare_parameters_are_checked() -> None:
    assert check_params("slurm", {"fairshare": "classic", "half_life": 3600}) == {
        "fairshare": "classic",
        "half_life": 3600.0,
    }
    with pytest.raises(ConfigError, match="fair_tree, classic, off"):
        check_params("slurm", {"fairshare": "fairtree"})
    with pytest.raises(ConfigError, match="positive"):
        check_params("slurm", {"max_age": 0})
    with pytest.raises(ConfigError, match="not be negative"):
        check_params("slurm", {"weight_age": -1})
    with pytest.raises(ValueError, match="fairshare must be one of"):
        make_policy("slurm", fairshare="nope")


def test_two_users_in_the_simulator_bob_goes_first_once_alices_first_wave_ends() -> None:
    # 8 GPUs; alice: 40 x 4 h one-GPU jobs at t=0; bob: 4 such at 10 min. Slurm never preempts, so bob
    # waits for the first wave (4 h) under fairshare; in submit order he waits for all of alice's.
    hours4 = 4 * 3600.0
    jobs = [TraceJob(f"a{i}", 0.0, hours4, 1, model="cifar10", user="alice", account="a") for i in range(40)]
    jobs += [TraceJob(f"b{i}", 600.0, hours4, 1, model="cifar10", user="bob", account="b") for i in range(4)]
    trace, cfg = Trace("two", tuple(jobs)), SimConfig(nodes=2, gpus_per_node=4)

    def bob(**params: object) -> float:
        res = Simulator(trace, make_policy("slurm", **params), cfg).run()
        return sum(j.jct or math.inf for j in res.jobs if j.job_id.startswith("b")) / 4

    assert bob() < 2 * hours4
    assert bob(fairshare="classic") < 2 * hours4
    assert bob(fairshare="off") > 5 * hours4
