"""One round (selector/round.py): the policy's plan and the live round's rules, in the controller and the
simulator alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector.round import FINISH_MARGIN_S, Claim, Member, RoundInputs, run_round, spared_until
from slurm_gandiva.sim.engine import Overheads, SimConfig, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob

TOPO = Topology.uniform(1, 4)


def gpu(k: int) -> Placement:
    return Placement((GpuRef("n1", k),))


@dataclass
class Fixed:
    """Returns the plan it is given."""

    plan: Plan
    name: str = "fixed"
    quantum: float | None = None
    seen: list[float] = field(default_factory=list)

    def decide(self, view: ClusterView, now: float) -> Plan:
        self.seen.append(now)
        return self.plan


def test_the_rules_apply_in_order_and_say_what_they_kept_back() -> None:
    jobs = (
        Job(JobSpec("done", "u", 1, 1, 0.0), JobState.RUNNING, gpu(0)),
        Job(JobSpec("a0", "u", 1, 1, 1.0, group="a"), JobState.RUNNING, gpu(1)),
        Job(JobSpec("a1", "u", 1, 1, 2.0, group="a")),
        Job(JobSpec("late", "u", 1, 1, 3.0)),
        Job(JobSpec("failed", "u", 1, 1, 4.0), JobState.RUNNING, gpu(3)),
    )
    view = ClusterView(TOPO, jobs, 50.0, group_caps={"a": 1})
    decided = Plan((
        Decision(Action.SUSPEND, "done"),
        Decision(Action.START, "late", gpu(0)),  # counted on done's GPU
        Decision(Action.START, "a1", gpu(2)),  # a0 still runs: over a's cap of 1
        Decision(Action.MIGRATE, "failed", gpu(2)),  # backed off until 60
    ))
    policy = Fixed(decided)
    done = {"done": Claim(45.0, 45.0)}  # seen 5 s ago: still spared
    out = run_round(policy, view, RoundInputs(finishing=done, backoff={"failed": 60.0, "old": 10.0}))
    assert policy.seen == [50.0] and out.decided is decided
    assert out.plan == Plan() and (out.spared, out.throttled, out.held_back) == (("done",), ("a1",), ("failed",))
    # The cluster's own count of a group (Slurm still counts a0 while it stops) wins over the view's.
    members = {"a0": Member("a", 1, False), "a1": Member("a", 1, False)}
    out = run_round(policy, view, RoundInputs(finishing=done, backoff={"failed": 50.0}, members=members))
    assert {d.job_id for d in out.plan.decisions} == {"a1", "failed"} and out.spared == ("done",)
    assert run_round(policy, view, RoundInputs(members={})).plan is decided


def test_a_claim_of_finishing_spares_a_job_for_a_bounded_time_then_it_is_stopped() -> None:
    """A job that says it is done is spared from the first round that saw it: its measured finish plus
    a margin, at most one quantum; after that, the plan's stop goes ahead (same rule in controller and
    simulator)."""
    jobs = (Job(JobSpec("liar", "u", 1, 1, 0.0), JobState.RUNNING, gpu(0)), Job(JobSpec("new", "u", 1, 1, 1.0)))
    decided = Plan((Decision(Action.SUSPEND, "liar"), Decision(Action.START, "new", gpu(0))))
    claim = Claim(since=100.0, eta=100.0)
    assert spared_until(claim, 60.0) == 100.0 + FINISH_MARGIN_S  # done already: the margin to exit
    assert spared_until(claim, 10.0) == 110.0  # never more than a quantum
    assert spared_until(Claim(100.0, 115.0), 60.0) == 115.0 + FINISH_MARGIN_S  # its measured finish, then the margin
    assert spared_until(Claim(100.0, 1e9), 60.0) == 160.0  # a far finish: one quantum
    for now, stopped in ((100.0, False), (129.0, False), (130.0, True), (500.0, True)):
        out = run_round(Fixed(decided), ClusterView(TOPO, jobs, now), RoundInputs({"liar": claim}, quantum=60.0))
        assert (out.plan is decided) is stopped, now
        assert out.spared == (() if stopped else ("liar",)) and out.overdue == (("liar",) if stopped else ())


class Bully:
    """Starts a waiting job on a free GPU, else stops a running job for it, on its GPUs."""

    name = "bully"
    quantum: float | None = None
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        free = list(view.free_gpus())
        if free and view.waiting:
            return Plan((Decision(Action.START, view.waiting[0].job_id, Placement((free[0],))),))
        out: list[Decision] = []
        for run, wait in zip(view.running, view.waiting, strict=False):
            out += [Decision(Action.SUSPEND, run.job_id), Decision(Action.START, wait.job_id, run.placement)]
        return Plan(tuple(out))


def test_the_simulator_spares_a_finishing_job_as_the_controller_does() -> None:
    """`a` has done its last sample at 100 s and exits until 130 s; `b` arrives at 110 s. The policy would
    stop `a` for `b`; the round (as the live one) spares it, and `b` starts once `a` has gone."""
    trace = Trace("t", (TraceJob("a", 0.0, 100.0, 1, model="cifar10"), TraceJob("b", 110.0, 10.0, 1, model="cifar10")))
    config = SimConfig(nodes=1, gpus_per_node=1, overheads=Overheads(start=0.0, finish=30.0))
    res = {j.job_id: j for j in Simulator(trace, Bully(), config).run().jobs}
    assert res["a"].suspends == 0 and res["a"].finish == pytest.approx(130.0)
    assert res["b"].first_start == pytest.approx(130.0)


@pytest.mark.parametrize("name", ["fifo", "gandiva", "tiresias"])
def test_a_backed_off_job_is_not_shown_to_the_policy_so_its_gpus_go_to_others(name: str) -> None:
    from slurm_gandiva.selector import make_policy

    jobs = (Job(JobSpec("stuck", "u", 4, 4, 0.0)), Job(JobSpec("other", "v", 4, 4, 1.0)))
    view = ClusterView(TOPO, jobs, 50.0)
    policy = make_policy(name)
    # Without a back-off the first job takes the node's 4 GPUs.
    assert {d.job_id for d in run_round(policy, view).plan.decisions if d.action is Action.START} == {"stuck"}
    # While it waits for its back-off, the other job gets them; a spent back-off changes nothing.
    out = run_round(policy, view, RoundInputs(backoff={"stuck": 120.0}))
    assert [(d.action, d.job_id) for d in out.plan.decisions] == [(Action.START, "other")]
    out = run_round(policy, view, RoundInputs(backoff={"stuck": 50.0}))
    assert {d.job_id for d in out.plan.decisions if d.action is Action.START} == {"stuck"}


def test_the_backoff_doubles_with_each_failure_in_a_row_up_to_a_cap() -> None:
    from slurm_gandiva.selector.round import BACKOFF_DOUBLINGS, backoff_delay

    assert [backoff_delay(n, 60.0) for n in (1, 2, 3, 4, 5)] == [60.0, 120.0, 240.0, 480.0, 960.0]
    assert backoff_delay(50, 60.0) == 60.0 * 2**BACKOFF_DOUBLINGS == 960.0
