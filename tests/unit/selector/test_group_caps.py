"""Group caps (a job array's %MAX) as every policy sees them: `JobSpec.group` and `ClusterView.group_caps`.

The policies plan within a group's cap themselves; a time-slicing policy rotates the group's jobs through
its places even while other GPUs are free.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.selector.common import GroupRoom, within_group_caps
from tests.unit.selector.test_selector_properties import POLICIES, views

TOPO = Topology.uniform(2, 4)  # 8 GPUs


def running_of(view: ClusterView, group: str) -> int:
    return sum(1 for j in view.running if j.spec.group == group)


def array_view(tasks: int = 12, cap: int = 6, *, others: int = 0, now: float = 0.0, gpus: int = 1) -> ClusterView:
    jobs = [Job(JobSpec(f"7_{t}", "u", gpus, gpus, float(t), total_work=1e6, group="7")) for t in range(tasks)]
    jobs += [Job(JobSpec(f"{100 + i}", "v", 1, 1, 50.0 + i, total_work=1e6)) for i in range(others)]
    return ClusterView(TOPO, tuple(jobs), now, group_caps={"7": cap})


def test_a_view_without_caps_and_one_with_an_overrun() -> None:
    view = array_view(cap=2)
    assert view.group_overruns() == {} and view.group_cap(view.jobs[0]) == 2
    running = tuple(
        j.evolve(state=JobState.RUNNING, placement=Placement((GpuRef("n1", i),)), slice_start=0.0)
        for i, j in enumerate(view.jobs[:3])
    )
    assert replace(view, jobs=running + view.jobs[3:]).group_overruns() == {"7": 3}
    assert view.group_cap(Job(JobSpec("x", "u", 1, 1, 0.0))) is None


def test_group_room_counts_places_per_capped_group_only() -> None:
    view = array_view(tasks=3, cap=2, others=1)
    room = GroupRoom(view.group_caps)
    a, b, c, other = view.jobs
    assert room.claim(a) and room.claim(b) and not room.fits(c) and not room.claim(c)
    assert room.claim(other) and room.claim(other)  # no group: always fits
    room.give(a)
    assert room.fits(c)
    assert not GroupRoom({})  # falsy without caps: callers skip it


def test_every_policy_starts_at_most_cap_tasks_and_gives_the_other_gpus_to_other_jobs() -> None:
    view = array_view(tasks=12, cap=6, others=2)
    for name in POLICY_NAMES:
        plan = make_policy(name).decide(view, 0.0)
        after = plan.apply(view)
        assert after.consistency_errors() == [], name
        assert running_of(after, "7") == 6, name
        assert {"100", "101"} <= {j.job_id for j in after.running}, name  # the free GPUs are used by others


def test_the_least_served_tasks_take_the_places() -> None:
    view = array_view(tasks=4, cap=2)
    jobs = tuple(j.evolve(attained_service=100.0 * (3 - i)) for i, j in enumerate(view.jobs))
    view = replace(view, jobs=jobs)  # 7_3 served least, then 7_2
    plan = make_policy("gandiva", service_ratio=0.0).decide(view, 0.0)
    assert {d.job_id for d in plan.by_action(Action.START)} == {"7_2", "7_3"}


def test_gandiva_time_slices_an_array_through_its_places_while_gpus_are_free() -> None:
    """%6 on 8 GPUs, 12 tasks: 6 run at a time, and each rotation swaps them (as with 6 GPUs)."""
    policy = make_policy("gandiva", quantum=60.0, service_ratio=0.0)  # linear tiers: round robin
    view = array_view(tasks=12, cap=6)
    suspended: Counter[str] = Counter()
    resumed: Counter[str] = Counter()
    for r in range(8):
        now = 60.0 * r
        view = replace(view, now=now)
        plan = policy.decide(view, now)
        for d in plan.decisions:
            if d.action is Action.SUSPEND:
                suspended[d.job_id] += 1
            elif d.action is Action.RESUME:
                resumed[d.job_id] += 1
        view = plan.apply(view, now)
        assert view.consistency_errors() == []
        assert running_of(view, "7") == 6, r
        assert len(view.free_gpus()) == 2  # the throttle, not the GPUs, is what runs out
        # a quantum of service for every running task
        view = replace(
            view,
            jobs=tuple(
                j.evolve(attained_service=j.attained_service + 60.0) if j.state is JobState.RUNNING else j
                for j in view.jobs
            ),
        )
    # Slices last about two quanta (hysteresis): every task was suspended, the first six resumed.
    assert len(suspended) == 12 and set(resumed) == {f"7_{t}" for t in range(6)}
    served = [j.attained_service for j in view.jobs]
    assert max(served) - min(served) <= 120.0  # shared evenly


def test_the_default_gives_never_run_tasks_a_first_slice_within_the_cap() -> None:
    policy = make_policy("default", min_slice=60.0, probe=60.0)
    view = array_view(tasks=6, cap=2)
    seen: set[str] = set()
    for r in range(4):
        now = 120.0 * r
        plan = policy.decide(replace(view, now=now), now)
        view = plan.apply(replace(view, now=now), now)
        assert running_of(view, "7") <= 2
        seen |= {j.job_id for j in view.running}
    assert seen == {f"7_{t}" for t in range(6)}


def test_a_lowered_cap_stops_the_tasks_over_it() -> None:
    view = array_view(tasks=4, cap=4)
    view = make_policy("gandiva").decide(view, 0.0).apply(view, 0.0)
    assert running_of(view, "7") == 4
    view = replace(view, group_caps={"7": 1}, now=600.0)
    for name in ("gandiva", "default", "srtf", "tiresias", "afs-l", "afs-p"):
        after = make_policy(name).decide(view, 600.0).apply(view, 600.0)
        assert running_of(after, "7") == 1, name


def test_within_group_caps_drops_the_lowest_priority_newcomers() -> None:
    view = array_view(tasks=4, cap=2)
    running = view.jobs[0].evolve(state=JobState.RUNNING, placement=Placement((GpuRef("n1", 0),)), slice_start=0.0)
    view = replace(view, jobs=(running, *view.jobs[1:]))
    plan = Plan(tuple(Decision(Action.START, f"7_{t}", Placement((GpuRef("n1", t),))) for t in (1, 2, 3)))
    order = [view.job("7_3"), view.job("7_2"), view.job("7_1"), view.job("7_0")]
    out = within_group_caps(plan, view, order)
    assert {d.job_id for d in out.decisions} == {"7_3"}
    stop = Plan((Decision(Action.SUSPEND, "7_0"), *plan.decisions))
    assert {d.job_id for d in within_group_caps(stop, view, order).decisions} == {"7_0", "7_3", "7_2"}
    assert within_group_caps(plan, replace(view, group_caps={}), order) is plan


@st.composite
def capped_views(draw: st.DrawFn) -> ClusterView:
    view = draw(views())
    groups = [draw(st.sampled_from([None, "a", "b"])) for _ in view.jobs]
    jobs = tuple(j.evolve(spec=replace(j.spec, group=g)) for j, g in zip(view.jobs, groups, strict=True))
    caps = {"a": draw(st.integers(1, 3)), "b": draw(st.integers(1, 2))}
    return replace(view, jobs=jobs, group_caps=caps)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(capped_views(), st.sampled_from(sorted(POLICIES)))
def test_no_policy_runs_more_of_a_group_than_its_cap(view: ClusterView, name: str) -> None:
    after = POLICIES[name].decide(view, view.now).apply(view)
    assert after.consistency_errors() == []
    for group, cap in view.group_caps.items():
        # Jobs already over a cap (a lowered %MAX) may keep running under policies that never preempt.
        assert running_of(after, group) <= max(cap, running_of(view, group)), (name, group)
