"""The round's co-held switch (`selector.cohold.co_held`, issue 31): a switch between two jobs on the same
GPUs becomes a park and an unpark where the view allows co-held placements, and nothing changes where it
does not (the live controller's view)."""

from __future__ import annotations

from dataclasses import replace

from slurm_gandiva.model import ClusterView, CoHold, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.cohold import co_held
from slurm_gandiva.selector.round import run_round

TOPO = Topology.uniform(1, 2, shards=2)
G0, G1 = TOPO.all_gpus()
GB = 1_000_000_000


def job(jid: str, state: JobState = JobState.SUSPENDED, at: Placement | None = None, gpus: int = 1) -> Job:
    return Job(JobSpec(jid, "u", gpus, gpus, 0.0), state=state, placement=at, times_scheduled=1, slice_start=0.0)


def view(jobs: list[Job], parked: dict[str, Placement], host: int = 64 * GB) -> ClusterView:
    state = dict.fromkeys((j.job_id for j in jobs), 8 * GB)
    return ClusterView(TOPO, tuple(jobs), 100.0, co_hold=CoHold(parked, state, {n.name: host for n in TOPO.nodes}))


def actions(plan: Plan) -> dict[str, Action]:
    return {d.job_id: d.action for d in plan.decisions}


ON0 = Placement((G0,))


def test_a_swap_on_the_same_gpus_parks_and_unparks() -> None:
    v = view([job("a", JobState.RUNNING, ON0), job("b")], {"b": ON0})
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.RESUME, "b", ON0)))
    assert actions(co_held(plan, v)) == {"a": Action.PARK, "b": Action.UNPARK}


def test_a_new_job_on_the_gpus_parks_the_one_it_replaces() -> None:
    v = view([job("a", JobState.RUNNING, ON0), job("c", JobState.QUEUED)], {})
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.START, "c", ON0)))
    assert actions(co_held(plan, v)) == {"a": Action.PARK, "c": Action.START}


def test_a_full_group_requeues_instead() -> None:
    """b is parked on g0 (2 shards): a cannot park there too while c computes; b stays parked."""
    v = view([job("a", JobState.RUNNING, ON0), job("b"), job("c", JobState.QUEUED)], {"b": ON0})
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.START, "c", ON0)))
    assert actions(co_held(plan, v)) == {"a": Action.SUSPEND, "c": Action.START}


def test_no_room_in_host_memory_requeues_instead() -> None:
    v = view([job("a", JobState.RUNNING, ON0), job("c", JobState.QUEUED)], {}, host=4 * GB)
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.START, "c", ON0)))
    assert actions(co_held(plan, v)) == {"a": Action.SUSPEND, "c": Action.START}


def test_a_parked_job_whose_gpus_go_to_a_wider_job_leaves_them() -> None:
    """d takes g0 and g1: b, parked on g0, is requeued off it; a, on g0 alone, cannot park under d."""
    v = view([job("a", JobState.RUNNING, ON0), job("b"), job("d", JobState.QUEUED, gpus=2)], {"b": ON0})
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.START, "d", Placement((G0, G1)))))
    assert actions(co_held(plan, v)) == {"a": Action.SUSPEND, "b": Action.SUSPEND, "d": Action.START}


def test_a_parked_job_resumed_elsewhere_is_a_resume() -> None:
    v = view([job("b")], {"b": ON0})
    plan = Plan((Decision(Action.RESUME, "b", Placement((G1,))),))
    assert co_held(plan, v) is plan


def test_without_co_holding_the_round_plans_exactly_as_before() -> None:
    """The live controller's view has no `co_hold`: the rule returns the very plan it was given, and a
    Gandiva round with co-holding off is the round without the rule."""
    a = replace(job("a", JobState.RUNNING, ON0), attained_service=900.0)
    b = replace(job("b", JobState.RUNNING, Placement((G1,))), attained_service=800.0)
    jobs = [a, b, job("c", JobState.QUEUED)]
    live = ClusterView(TOPO, tuple(jobs), 960.0)  # a rotation (multiple of the quantum)
    plan = Plan((Decision(Action.SUSPEND, "a"), Decision(Action.START, "c", ON0)))
    assert co_held(plan, live) is plan
    out = run_round(make_policy("gandiva", pack=False), live)
    assert out.plan == out.decided
    assert actions(out.plan) == {"a": Action.SUSPEND, "c": Action.START}
    room = CoHold(state_bytes={"a": GB, "b": GB}, host_bytes={n.name: 64 * GB for n in TOPO.nodes})
    on = run_round(make_policy("gandiva", pack=False), replace(live, co_hold=room))
    assert actions(on.plan) == {"a": Action.PARK, "c": Action.START}
