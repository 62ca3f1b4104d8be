"""GPU limits (association and QOS `GrpTRES`/`MaxTRESPerUser` on gres/gpu) as a rule of the round."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from slurm_gandiva.model import ClusterView, GpuLimit, GpuRef, Job, JobSpec, JobState, Placement, Tenants, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.selector.round import limit_gpus, run_round
from tests.unit.selector.test_round import Fixed

TOPO = Topology.uniform(2, 3)  # 6 GPUs


def gpus(*ks: int) -> Placement:
    return Placement(tuple(GpuRef(f"n{1 + k // 3}", k % 3) for k in ks))


def job(jid: str, account: str, user: str = "u", *, n: int = 1, qos: str = "", at: float = 0.0,
        state: JobState = JobState.QUEUED, on: Placement | None = None, served: float = 0.0) -> Job:
    spec = JobSpec(jid, user, n, n, at, total_work=1e6, account=account, qos=qos)
    return Job(spec, state, on, attained_service=served)


def held(view: ClusterView, limit: GpuLimit) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for j in view.running:
        if (s := limit.scope(j.spec)) is not None:
            out[s] = out.get(s, 0) + j.gpus
    return out


def test_a_start_past_an_account_limit_is_dropped_and_a_suspend_frees_first() -> None:
    lim = GpuLimit(2, account="bio")
    jobs = (
        job("r1", "bio", state=JobState.RUNNING, on=gpus(0)),
        job("r2", "bio", state=JobState.RUNNING, on=gpus(1)),
        job("w1", "bio", at=1.0, served=50.0),
        job("w2", "bio", at=2.0),
        job("p", "physics", at=3.0),
    )
    view = ClusterView(TOPO, jobs, 10.0, tenants=Tenants(limits=(lim,)))
    starts = (Decision(Action.START, "w1", gpus(2)), Decision(Action.START, "w2", gpus(3)),
              Decision(Action.START, "p", gpus(4)))
    out = run_round(Fixed(Plan(starts)), view)
    assert out.limited == ("w1", "w2") and [d.job_id for d in out.plan.decisions] == ["p"]
    # One suspend frees one place: the least served (w2) takes it.
    plan = Plan((Decision(Action.SUSPEND, "r1"), *starts))
    kept, dropped = limit_gpus(plan, view)
    assert dropped == ("w1",) and {d.job_id for d in kept.decisions} == {"r1", "w2", "p"}
    assert held(kept.apply(view), lim) == {("bio", "", "", ""): 2}
    # No tenants, or no limit: the plan stands as it is.
    assert run_round(Fixed(Plan(starts)), replace(view, tenants=None)).plan == Plan(starts)


def test_a_qos_limit_per_user_counts_each_user_apart() -> None:
    lim = GpuLimit(1, qos="small", per_user=True)
    jobs = (job("a1", "x", "alice", qos="small"), job("a2", "x", "alice", qos="small", at=1.0),
            job("b1", "y", "bob", qos="small", at=2.0), job("n", "x", "alice", at=3.0))
    view = ClusterView(TOPO, jobs, 0.0, tenants=Tenants(limits=(lim,)))
    plan = Plan(tuple(Decision(Action.START, j.job_id, gpus(i)) for i, j in enumerate(jobs)))
    kept, dropped = limit_gpus(plan, view)
    assert dropped == ("a2",) and {d.job_id for d in kept.decisions} == {"a1", "b1", "n"}


def test_a_job_asking_more_than_its_limit_waits_with_a_reason_and_its_gpus_go_to_others() -> None:
    lim = GpuLimit(1, qos="small")
    jobs = (job("big", "bio", qos="small", n=2), job("p", "physics", at=1.0, n=2))
    view = ClusterView(TOPO, jobs, 0.0, tenants=Tenants(limits=(lim,)))
    out = run_round(make_policy("gandiva", quantum=60.0), view)
    assert out.over_limit == {"big": "QOS small allows 1 GPU, the job asks 2"}
    assert {d.job_id for d in out.plan.by_action(Action.START)} == {"p"}
    acct = GpuLimit(3, account="bio", user="ann", per_user=True)
    assert run_round(Fixed(Plan()), replace(view, jobs=(job("x", "bio", "ann", n=4),),
                                            tenants=Tenants(limits=(acct,)))).over_limit == {
        "x": "the association of user ann in account bio allows 3 GPUs per user, the job asks 4"}


@pytest.mark.parametrize("name", ["gandiva", "default", "afs-l"])
def test_no_policy_ever_runs_a_limited_account_past_its_gpus(name: str) -> None:
    """Many rounds of a policy under fair shares and a limit of 1 GPU on bio: never more than 1."""
    lim = GpuLimit(1, account="bio")
    jobs = tuple(job(f"b{i}", "bio", "ann", at=float(i)) for i in range(6))
    jobs += tuple(job(f"p{i}", "physics", "pat", at=float(i)) for i in range(6))
    tenants = Tenants(shares={"physics": 1.0, "bio": 5.0}, limits=(lim,))  # bio's share would be 5 GPUs
    policy = cast(Policy, FairShare(make_policy(name, quantum=60.0) if name == "gandiva" else make_policy(name)))
    view = ClusterView(TOPO, jobs, 0.0, tenants=tenants)
    for r in range(6):
        out = run_round(policy, view)
        view = out.plan.apply(view)
        assert view.consistency_errors() == []
        assert sum(held(view, lim).values()) <= 1, (name, r)
        view = replace(view, now=view.now + 61.0, jobs=tuple(
            j.evolve(attained_service=j.attained_service + 61.0 * j.gpus) for j in view.jobs))
    # the rest go to physics (gandiva may pack two of its jobs on one GPU: 6 jobs on its 5)
    assert sum(j.gpus for j in view.running if j.spec.account == "physics") >= 5


def test_a_share_of_0_gets_only_the_gpus_no_other_tenant_can_use() -> None:
    """Slurm's Fairshare=0 (read_tenants keeps 0.0): no division by zero, last in the rounding order."""
    from slurm_gandiva.selector.fairshare import water_fill

    assert water_fill(5, {"a": 9, "z": 9}, {"a": 1.0, "z": 0.0}, ["z", "a"]) == {"a": 5, "z": 0}
    assert water_fill(5, {"a": 2, "z": 9}, {"a": 1.0, "z": 0.0}, ["z", "a"]) == {"a": 2, "z": 3}
    assert water_fill(5, {"y": 9, "z": 9}, {"y": 0.0, "z": 0.0}, ["y", "z"]) == {"y": 3, "z": 2}
    jobs = tuple(job(f"p{i}", "physics", "pat", at=float(i)) for i in range(4))
    jobs += tuple(job(f"z{i}", "zero", "zed", at=float(i)) for i in range(6))
    fair = FairShare(make_policy("default"))
    policy = cast(Policy, fair)
    view = ClusterView(TOPO, jobs, 0.0, tenants=Tenants(shares={"physics": 1.0, "zero": 0.0}))
    assert fair.caps(view) == {("physics", "pat"): 4, ("zero", "zed"): 2}
    for _ in range(2):  # the first round may leave a GPU idle (the inner plan's surplus is dropped)
        view = run_round(policy, view).plan.apply(view)
    assert sum(j.gpus for j in view.running if j.spec.account == "physics") == 4
    users = Tenants(user_shares={("physics", "pat"): 0.0})
    jobs += tuple(job(f"q{i}", "physics", "quin", at=float(i)) for i in range(6))
    caps = FairShare(make_policy("default")).caps(ClusterView(TOPO, jobs, 0.0, tenants=users))
    assert caps[("physics", "pat")] == 0 and caps[("physics", "quin")] == 3
