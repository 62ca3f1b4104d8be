"""The `slurm` baseline (priority FIFO with EASY backfill) on hand-built views.

Jobs have no measured rates, so a job's rate on k GPUs is k work units per second (`RateTable`'s
linear prior): a job with `work` W on k GPUs runs W / k seconds.
"""

from __future__ import annotations

import pytest

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector import check_params, make_policy
from slurm_gandiva.selector.baselines import PAST_LIMIT_S
from slurm_gandiva.selector.common import Speeds
from tests.helpers import gp

NODE4 = Topology.uniform(1, 4)
NOW = 10.0


def job(jid: str, gpus: int, *, submit: float, work: float) -> Job:
    return Job(JobSpec(jid, "u", gpus, gpus, submit, total_work=work))


def running(jid: str, placement: Placement, *, work: float, done: float, since: float = 0.0, **kw: object) -> Job:
    """A job running on `placement` since `since` with `done` of its `work` done."""
    k = placement.count
    return job(jid, k, submit=since, work=work).evolve(
        state=JobState.RUNNING,
        placement=placement,
        progress=done,
        attained_service=k * (NOW - since),
        slice_start=since,
        first_start=since,
        times_scheduled=1,
        **kw,
    )


def started(plan: Plan) -> list[str]:
    assert all(d.action.value == "start" for d in plan.decisions), plan
    return [d.job_id for d in plan.decisions]


def decide(*jobs: Job, topo: Topology = NODE4, **params: object) -> list[str]:
    return started(make_policy("slurm", **params).decide(ClusterView(topo, jobs, NOW), NOW))


# `a` holds GPUs 0-1 and ends at t=100 (180 work units left at 2/s); `head` needs all 4 GPUs, so its
# reservation starts at t=100 and needs every GPU.
A = running("a", gp("n1", 0, 1), work=200.0, done=20.0)
HEAD = job("head", 4, submit=1.0, work=400.0)


def test_a_short_later_job_backfills_into_idle_gpus_while_the_head_waits() -> None:
    short = job("short", 1, submit=2.0, work=90.0)  # ends at exactly t=100, the reservation's start
    assert decide(A, HEAD, short) == ["short"]
    assert decide(A, HEAD, short, reserve=0) == ["short"]
    assert not make_policy("fifo").decide(ClusterView(NODE4, (A, HEAD, short), NOW), NOW)  # strict FIFO waits


def test_a_long_later_job_that_would_delay_the_reservation_does_not_start() -> None:
    long = job("long", 1, submit=2.0, work=91.0)  # ends at t=101: the head would start a second late
    assert decide(A, HEAD, long) == []
    assert decide(A, HEAD, long, reserve=0) == ["long"]  # no reservation: greedy backfill starts it
    greedy = make_policy("fifo", backfill=True).decide(ClusterView(NODE4, (A, HEAD, long), NOW), NOW)
    assert started(greedy) == ["long"]


def test_a_long_later_job_on_gpus_the_reservation_does_not_need_starts() -> None:
    head3 = job("head", 3, submit=1.0, work=300.0)  # at t=100 it needs 3 of the 4 GPUs: one is spare
    long1 = job("long1", 1, submit=2.0, work=1e6)
    long2 = job("long2", 1, submit=3.0, work=1e6)  # the spare GPU is taken by long1
    assert decide(A, head3, long1, long2) == ["long1"]
    long_pair = job("pair", 2, submit=2.0, work=1e6)  # needs 2 GPUs past t=100: one more than spare
    assert decide(A, head3, long_pair) == []


def test_overestimated_time_limits_stop_a_job_that_fit_exactly() -> None:
    # `a` runs at half its nominal rate (a poor placement): 160 s left at its measured 1/s, but its limit
    # is set from the nominal 2/s. With exact estimates `fits` ends exactly when the head can start; with
    # limits of 1.5x, Slurm expects `a` to end at 1.5 * 100 - 40 s held = 110 s from now and `fits` to
    # run 1.5 * 160 = 240 s.
    slow = running("a", gp("n1", 0, 1), work=200.0, done=40.0, since=NOW - 40.0, measured_rate=1.0)
    fits = job("fits", 1, submit=2.0, work=160.0)
    assert decide(slow, HEAD, fits) == ["fits"]
    assert decide(slow, HEAD, fits, overestimate=1.5) == []


def test_a_running_job_past_its_limit_is_expected_to_end_soon() -> None:
    # Limit 1.5 * 100 s, held 200 s already: Slurm would be killing it; expected PAST_LIMIT_S from now.
    late = running("a", gp("n1", 0, 1), work=200.0, done=100.0, since=NOW - 200.0)
    pol = make_policy("slurm", overestimate=1.5)
    assert pol.expected(late, 2, Speeds()) == PAST_LIMIT_S == 60.0  # type: ignore[attr-defined]
    within = job("within", 1, submit=2.0, work=40.0)  # limit 60 s: ends as the head can start
    beyond = job("beyond", 1, submit=2.0, work=41.0)
    assert decide(late, HEAD, within, overestimate=1.5) == ["within"]
    assert decide(late, HEAD, beyond, overestimate=1.5) == []


def test_never_preempts_a_running_job() -> None:
    # `b` was backfilled earlier; `head`, submitted before it, waits for the GPUs it holds.
    b = running("b", gp("n1", 2, 3), work=1e9, done=0.0)
    first = job("first", 4, submit=-5.0, work=4.0)
    for params in ({}, {"reserve": 500}, {"overestimate": 3.0}):
        assert decide(A, b, first, **params) == []


def test_submit_order_is_kept_among_jobs_that_fit() -> None:
    late = job("late", 1, submit=3.0, work=1e6)
    early = job("early", 1, submit=1.0, work=1e6)
    mid = job("mid", 1, submit=2.0, work=1e6)
    assert decide(A, late, early, mid) == ["early", "mid"]  # two free GPUs, oldest first
    # The first job that does not fit gets the reservation, not a later one: `big4` needs every GPU
    # at t=100, so `late` may not run past it (a reservation for `big3` would leave it one GPU).
    big4 = job("big4", 4, submit=0.5, work=4.0)
    big3 = job("big3", 3, submit=0.7, work=3.0)
    assert decide(A, big4, big3, late) == []
    assert decide(A, big3, big4, late) == []  # view order is not priority: submit order is
    assert decide(A, big3, late) == ["late"]


def test_conservative_reservations_protect_every_job_tested() -> None:
    # `b` is reserved 3 GPUs over [100, 150); `c` needs all 4: EASY gives it no reservation, so the
    # long 1-GPU `d` starts; reserving for every job (Slurm's own planner) puts `c` at [150, 160) and
    # `d` would delay it.
    b = job("b", 3, submit=1.0, work=150.0)
    c = job("c", 4, submit=2.0, work=40.0)
    d = job("d", 1, submit=3.0, work=1e6)
    assert decide(A, b, c, d) == ["d"]
    assert decide(A, b, c, d, reserve=2) == []
    assert decide(A, b, c, d, reserve=500) == []


def test_depth_and_window_bound_the_planner() -> None:
    short = job("short", 1, submit=2.0, work=10.0)
    assert decide(A, HEAD, short, depth=1) == []  # only the head is examined
    assert decide(A, HEAD, short, depth=2) == ["short"]
    # The jobs ahead of the first that cannot start are not counted (Slurm's main scheduler starts them).
    ones = [job(f"j{i}", 1, submit=float(i), work=1e6) for i in range(4)]
    assert decide(*ones, depth=1) == ["j0", "j1", "j2", "j3"]
    long = job("long", 2, submit=2.0, work=1e6)
    assert decide(A, HEAD, long) == []
    assert decide(A, HEAD, long, window=60.0) == ["long"]  # the head's start (90 s ahead) is past the window
    assert decide(A, HEAD, long, window=90.0) == []


def test_a_job_no_cluster_can_hold_gets_no_reservation() -> None:
    huge = job("huge", 8, submit=0.0, work=8.0)  # more GPUs than the cluster has
    long = job("long", 2, submit=1.0, work=1e6)
    assert decide(A, huge, long) == ["long"]


def test_unknown_remaining_work_never_ends() -> None:
    forever = running("a", gp("n1", 0, 1), work=200.0, done=20.0).evolve(
        spec=JobSpec("a", "u", 2, 2, 0.0, total_work=None)
    )
    short = job("short", 2, submit=2.0, work=2.0)
    assert decide(forever, HEAD, short) == ["short"]  # the head's reservation never comes: nothing to delay


def test_parameters_are_checked() -> None:
    assert check_params("slurm", {"overestimate": 2, "depth": 100, "reserve": 0}) == {
        "overestimate": 2.0,
        "depth": 100,
        "reserve": 0,
    }
    with pytest.raises(ConfigError, match="at least 1"):
        check_params("slurm", {"overestimate": 0.5})
    with pytest.raises(ConfigError, match="positive"):
        check_params("slurm", {"depth": 0})
    with pytest.raises(ValueError, match="at least 1"):
        make_policy("slurm", overestimate=0.9)
    pol = make_policy("slurm")
    assert (pol.name, pol.quantum, pol.elastic) == ("slurm", None, False)  # type: ignore[attr-defined]
