"""The %MAX throttle of job arrays: the round's group caps (a pure filter on each round's plan)."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_gandiva.controller.arrays import array_members
from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector.round import throttle_groups
from slurm_gandiva.slurm.base import HoldKind, SlurmJob

TOPO = Topology.uniform(2, 4)


def pl(node: str, k: int) -> Placement:
    return Placement((GpuRef(node, k),))


def task(jid: str, state: str = "PENDING", *, limit: int = 2) -> SlurmJob:
    return SlurmJob(job_id=jid, name="hp", user="u", state=state, reason="None", hold=HoldKind.NONE, nodes=(),
                    array_id=jid.split("_")[0] if "_" in jid else "", array_max_tasks=limit if "_" in jid else 0)


def view_of(jobs: dict[str, tuple[JobState, Placement | None, float]]) -> ClusterView:
    out = []
    for i, (jid, (state, where, served)) in enumerate(jobs.items()):
        spec = JobSpec(jid, "u", 1, 1, float(i))
        out.append(Job(spec, state=state, placement=where, attained_service=served,
                       slice_start=0.0 if state is JobState.RUNNING else None))
    return ClusterView(TOPO, tuple(out), 100.0)


def throttle_arrays(plan: Plan, view: ClusterView, slurm: Mapping[str, SlurmJob]) -> Plan:
    """The round's group caps on the array tasks as Slurm counts them (what the controller applies)."""
    return throttle_groups(plan, view, array_members(slurm))[0]


def ids(plan: Plan, action: Action) -> set[str]:
    return {d.job_id for d in plan.by_action(action)}


def test_never_more_than_max_tasks_of_one_array_are_placed() -> None:
    view = view_of({"7_0": (JobState.RUNNING, pl("n1", 0), 50.0), "7_1": (JobState.QUEUED, None, 0.0),
                    "7_2": (JobState.QUEUED, None, 0.0), "7_3": (JobState.QUEUED, None, 0.0)})
    slurm = {"7_0": task("7_0", "RUNNING"), "7_1": task("7_1"), "7_2": task("7_2"), "7_3": task("7_3")}
    plan = Plan(tuple(Decision(Action.START, f"7_{t}", pl("n1", t)) for t in (1, 2, 3)))
    out = throttle_arrays(plan, view, slurm)
    assert ids(out, Action.START) == {"7_1"}  # one place left of 2; the earliest submitted of equals


def test_suspends_free_places_and_the_least_served_task_takes_them_first() -> None:
    view = view_of({"7_0": (JobState.RUNNING, pl("n1", 0), 60.0), "7_1": (JobState.RUNNING, pl("n1", 1), 60.0),
                    "7_2": (JobState.SUSPENDED, None, 30.0), "7_3": (JobState.QUEUED, None, 0.0),
                    "7_4": (JobState.QUEUED, None, 0.0)})
    slurm = {jid: task(jid, "RUNNING" if jid in ("7_0", "7_1") else "PENDING") for jid in view_ids(view)}
    plan = Plan((Decision(Action.SUSPEND, "7_0"), Decision(Action.SUSPEND, "7_1"),
                 Decision(Action.RESUME, "7_2", pl("n1", 0)), Decision(Action.START, "7_3", pl("n1", 1)),
                 Decision(Action.START, "7_4", pl("n1", 2))))
    out = throttle_arrays(plan, view, slurm)
    assert ids(out, Action.SUSPEND) == {"7_0", "7_1"}
    assert ids(out, Action.START) == {"7_3", "7_4"} and ids(out, Action.RESUME) == set()


def test_a_task_slurm_still_tears_down_counts_as_running() -> None:
    view = view_of({"7_0": (JobState.SUSPENDED, None, 60.0), "7_1": (JobState.QUEUED, None, 0.0)})
    slurm = {"7_0": task("7_0", "COMPLETING", limit=1), "7_1": task("7_1", limit=1)}
    plan = Plan((Decision(Action.START, "7_1", pl("n1", 1)),))
    assert throttle_arrays(plan, view, slurm) == Plan()


def test_other_jobs_other_arrays_moves_and_unthrottled_arrays_are_left_alone() -> None:
    view = view_of({"7_0": (JobState.RUNNING, pl("n1", 0), 5.0), "7_1": (JobState.QUEUED, None, 0.0),
                    "8_0": (JobState.QUEUED, None, 0.0), "9_0": (JobState.QUEUED, None, 0.0),
                    "9_1": (JobState.QUEUED, None, 0.0), "42": (JobState.QUEUED, None, 0.0)})
    slurm = {"7_0": task("7_0", "RUNNING", limit=1), "7_1": task("7_1", limit=1), "8_0": task("8_0", limit=1),
             "9_0": task("9_0", limit=0), "9_1": task("9_1", limit=0), "42": task("42")}
    plan = Plan((Decision(Action.MIGRATE, "7_0", pl("n2", 0)), Decision(Action.START, "7_1", pl("n1", 1)),
                 Decision(Action.START, "8_0", pl("n1", 2)), Decision(Action.START, "9_0", pl("n1", 3)),
                 Decision(Action.START, "9_1", pl("n2", 1)), Decision(Action.START, "42", pl("n2", 2))))
    out = throttle_arrays(plan, view, slurm)
    assert ids(out, Action.MIGRATE) == {"7_0"}
    assert ids(out, Action.START) == {"8_0", "9_0", "9_1", "42"}


def test_no_array_no_change() -> None:
    view = view_of({"1": (JobState.QUEUED, None, 0.0)})
    plan = Plan((Decision(Action.START, "1", pl("n1", 0)),))
    assert throttle_arrays(plan, view, {"1": task("1")}) is plan


def view_ids(view: ClusterView) -> list[str]:
    return [j.job_id for j in view.jobs]
