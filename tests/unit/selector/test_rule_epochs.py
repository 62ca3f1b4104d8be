"""`RuleEpochs`: the elastic rule of the default, AFS-L and AFS-P decides anew when a job arrives or
leaves, once more when the holds of that round have run out, and whenever a job waits; between those
rounds running jobs keep their counts however their remaining times drift."""

from __future__ import annotations

from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Locality, Placement, RateTable
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.selector.afs import AfsL, AfsP
from slurm_gandiva.selector.gandiva import Default
from tests.helpers import TWO_BY_FOUR, gp


def running(jid: str, at: Placement, work: float, since: float = -1000.0) -> Job:
    spec = JobSpec(jid, "u", 1, 4, 0.0, total_work=work)
    return Job(spec).evolve(state=JobState.RUNNING, placement=at, times_scheduled=3, slice_start=since)


def resized(plan: Plan) -> set[str]:
    return {d.job_id for d in plan.decisions if d.action is Action.RESIZE}


def jobs(since: float = -1000.0) -> tuple[Job, Job, Job]:
    """a (long) holds all of n2, b (short) and c (between) two GPUs of n1 each: the rule, scaling linear,
    would take two GPUs from a and give b and c one each."""
    return (
        running("a", gp("n2", 0, 1, 2, 3), 1e9, since),
        running("b", gp("n1", 0, 1), 1e4),
        running("c", gp("n1", 2, 3), 1e6),
    )


def at(t: float, *js: Job) -> ClusterView:
    return ClusterView(TWO_BY_FOUR, js, now=t)


def test_counts_stay_while_the_same_jobs_run_and_the_rule_decides_on_an_arrival() -> None:
    pol = Default()
    assert resized(pol.decide(at(0.0, *jobs()), 0.0)) == {"a", "b", "c"}  # the first round that sees them
    assert resized(Default().decide(at(5.0, *jobs()), 5.0)) == {"a", "b", "c"}  # a fresh policy still would
    assert pol.decide(at(5.0, *jobs()), 5.0).decisions == ()  # this one keeps their counts
    assert pol.decide(at(600.0, *jobs()), 600.0).decisions == ()
    a, b, c = jobs()
    measured = a.evolve(rates=RateTable({(4, Locality.NODE): 4.0}))  # a rate at a new count: decided anew
    assert "a" in resized(pol.decide(at(601.0, measured, b, c), 601.0))
    assert pol.decide(at(602.0, measured, b, c), 602.0).decisions == ()
    e = Job(JobSpec("e", "u", 1, 1, 590.0, total_work=1e3))  # arrives: the rule decides again
    assert "a" in resized(pol.decide(at(605.0, *jobs(), e), 605.0))
    assert pol.decide(at(610.0, *jobs()), 610.0).decisions != ()  # e left: another set, decided afresh


def test_the_rule_decides_once_more_when_the_holds_of_its_round_have_run_out() -> None:
    pol = Default()  # a was resized 10 s ago: its hold (min_slice, 60 s) keeps its four GPUs until 50 s
    assert "a" not in resized(pol.decide(at(0.0, *jobs(-10.0)), 0.0))
    assert pol.decide(at(45.0, *jobs(-10.0)), 45.0).decisions == ()
    assert "a" in resized(pol.decide(at(55.0, *jobs(-10.0)), 55.0))  # once more, after the hold
    assert pol.decide(at(60.0, *jobs(-10.0)), 60.0).decisions == ()


def test_time_slicing_still_rotates_while_a_job_waits() -> None:
    # Eight 1-GPU jobs fill the cluster and d waits: the epochs never freeze a round with a waiter.
    jobs = tuple(running(f"j{i}", gp(f"n{1 + i // 4}", i % 4), 1e9) for i in range(8))
    d = Job(JobSpec("d", "u", 1, 1, 0.0, total_work=1e3)).evolve(times_scheduled=1, last_run_end=-500.0)
    pol = Default()
    for t in (0.0, 5.0, 10.0):
        plan = pol.decide(ClusterView(TWO_BY_FOUR, (*jobs, d), now=t), t)
        assert "d" in {x.job_id for x in plan.decisions if x.action in (Action.START, Action.RESUME)}, t


def test_afs_l_and_afs_p_keep_counts_between_arrivals_too() -> None:
    # live they are asked every tick, as the default is; in the simulator they decide on events only
    for pol in (AfsL(), AfsP(lease=0.0)):
        assert resized(pol.decide(at(0.0, *jobs()), 0.0)) == {"a", "b", "c"}, pol.name
        assert pol.decide(at(5.0, *jobs()), 5.0).decisions == (), pol.name
        e = Job(JobSpec("e", "u", 1, 1, 590.0, total_work=1e3))
        assert "a" in resized(pol.decide(at(605.0, *jobs(), e), 605.0)), pol.name
