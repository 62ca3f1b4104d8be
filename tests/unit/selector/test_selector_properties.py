"""Property tests: for any view, every policy's plan is feasible and keeps the view consistent."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gandiva.model import (
    ClusterView,
    GpuRef,
    Job,
    JobSpec,
    JobState,
    Locality,
    Placement,
    RateTable,
    Topology,
    Trial,
    TrialKind,
)
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.selector import POLICY_NAMES, make_policy

RIGID = ("fifo", "srtf", "tiresias")
POLICIES = {name: make_policy(name) for name in POLICY_NAMES}
# Short windows so that trials and slices conclude inside the generated time spans.
POLICIES["gandiva-fast"] = make_policy("gandiva", quantum=10.0, trial_window=5.0)
POLICIES["default-fast"] = make_policy("default", min_slice=5.0, probe=5.0, trial_window=5.0)
POLICIES["fifo-backfill"] = make_policy("fifo", backfill=True)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    topo = Topology.uniform(
        nodes,
        per_node,
        gpus_per_switch=draw(st.sampled_from([1, 2, 4])),
        sockets=draw(st.sampled_from([1, 2])),
        shards=draw(st.integers(1, 3)),
    )
    return topo


def _rates(draw: st.DrawFn) -> RateTable:
    if draw(st.booleans()):
        return RateTable()
    base = draw(st.floats(1.0, 100.0))
    rates: dict[tuple[int, Locality], float] = {(1, Locality.SWITCH): base}
    for k in (2, 4, 8):
        for loc in draw(st.sets(st.sampled_from(list(Locality)), max_size=2)):
            rates[(k, loc)] = base * k * draw(st.floats(0.3, 1.0))
    return RateTable(rates)


@st.composite
def views(draw: st.DrawFn) -> ClusterView:
    """A consistent view (running jobs booked without conflicts), after which some nodes may go down."""
    topo = draw(topologies())
    now = draw(st.floats(0.0, 1000.0))
    whole: set[GpuRef] = set()
    shards: dict[GpuRef, int] = {}
    cap = {n.name: n.shards for n in topo.nodes}
    all_gpus = list(topo.all_gpus())
    jobs = []
    for i in range(draw(st.integers(0, 14))):
        lo = draw(st.integers(1, 4))
        hi = draw(st.integers(lo, lo + 4))
        spec = JobSpec(
            f"j{i}",
            "u",
            lo,
            hi,
            draw(st.floats(0.0, now)),
            total_work=draw(st.one_of(st.none(), st.floats(1.0, 1e6))),
        )
        state = draw(st.sampled_from(list(JobState)))
        max_nodes = draw(st.sampled_from([None, 1, 1, 2]))
        job = Job(spec, rates=_rates(draw), attained_service=draw(st.floats(0.0, 1e5)))
        job = job.evolve(
            times_scheduled=draw(st.integers(0, 3)),
            failed_trials=frozenset(draw(st.sets(st.sampled_from(list(TrialKind))))),
        )
        if state is JobState.RUNNING:
            k = draw(st.integers(lo, hi))
            shared = draw(st.booleans())
            if shared:
                free = [g for g in all_gpus if g not in whole and shards.get(g, 0) < cap[g.node]]
            else:
                free = [g for g in all_gpus if g not in whole and g not in shards]
            if len(free) < k:
                state = JobState.SUSPENDED
            else:
                gpus = draw(st.permutations(free))[:k]
                for g in gpus:
                    if shared:
                        shards[g] = shards.get(g, 0) + 1
                    else:
                        whole.add(g)
                placement = Placement(tuple(gpus), shared=shared)
                if max_nodes is not None and len(placement.nodes) > max_nodes:
                    max_nodes = len(placement.nodes)  # what it already holds is allowed
                start = draw(st.floats(0.0, now))
                trial = None
                if draw(st.booleans()):
                    prev: Placement | None = Placement(tuple(draw(st.permutations(all_gpus))[: max(1, k - 1)]))
                    if prev is not None and max_nodes is not None and len(prev.nodes) > max_nodes:
                        prev = None
                    trial = Trial(
                        draw(st.sampled_from(list(TrialKind))),
                        draw(st.floats(0.0, now)),
                        draw(st.floats(0.0, 100.0)),
                        draw(st.one_of(st.none(), st.just(prev))),
                    )
                job = job.evolve(
                    state=state,
                    placement=placement,
                    slice_start=start,
                    first_start=start,
                    times_scheduled=max(1, job.times_scheduled),
                    trial=trial,
                    measured_rate=draw(st.one_of(st.none(), st.floats(0.0, 200.0))),
                )
        job = job.evolve(spec=replace(job.spec, max_nodes=max_nodes))
        if state is not JobState.RUNNING:
            job = job.evolve(state=state, placement=None)
        if state is JobState.QUEUED:
            job = job.evolve(times_scheduled=0, first_start=None)
        elif state is JobState.SUSPENDED:
            job = job.evolve(last_run_end=draw(st.floats(0.0, now)))
        jobs.append(job)
    view = ClusterView(topo, tuple(jobs), now)
    assert view.consistency_errors() == []
    down = draw(st.sets(st.sampled_from([n.name for n in topo.nodes])))
    if down:
        nodes = tuple(replace(n, up=n.name not in down) for n in topo.nodes)
        view = ClusterView(Topology(nodes), view.jobs, now)
    return view


def _check(name: str, view: ClusterView, plan: Plan) -> ClusterView:
    down = {n.name for n in view.topology.nodes if not n.up}
    for d in plan.decisions:
        job = view.job(d.job_id)
        assert not job.state.finished, f"{name} touched finished job {d.job_id}"
        if d.placement is not None:
            assert not set(d.placement.nodes) & down, f"{name} placed {d.job_id} on a down node"
            assert job.spec.min_gpus <= d.placement.count <= job.spec.max_gpus, f"{name}: {d}"
            if job.spec.max_nodes is not None:
                assert len(d.placement.nodes) <= job.spec.max_nodes, f"{name} spans too many nodes: {d}"
            if name.startswith(RIGID) and d.action in (Action.START, Action.RESUME):
                assert d.placement.count == job.spec.min_gpus
    after = plan.apply(view)
    assert after.consistency_errors() == [], (name, after.consistency_errors(), plan)
    for g, (whole, shards) in after.usage.items():
        assert whole <= 1 and not (whole and shards)
    return after


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views())
def test_every_policy_plan_is_feasible(view: ClusterView) -> None:
    for name, policy in POLICIES.items():
        plan = policy.decide(view, view.now)
        _check(name, view, plan)
        if name.startswith("fifo"):
            for d in plan.by_action(Action.SUSPEND):
                job = view.job(d.job_id)
                assert job.placement is not None
                assert set(job.placement.nodes) & {n.name for n in view.topology.nodes if not n.up}, (
                    "FIFO preempted a job on healthy nodes"
                )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views(), st.floats(1.0, 300.0), st.floats(0.2, 2.0))
def test_rounds_stay_consistent(view: ClusterView, step: float, rate_factor: float) -> None:
    """Several rounds in a row (with time passing and rates measured) never break consistency."""
    for name, policy in POLICIES.items():
        cur = view
        for _ in range(5):
            now = cur.now + step
            jobs = tuple(
                j.evolve(
                    measured_rate=j.rates.throughput(j.gpus) * rate_factor,
                    attained_service=j.attained_service + step * j.gpus,
                    progress=j.progress + step,
                )
                if j.state is JobState.RUNNING
                else j
                for j in cur.jobs
            )
            cur = ClusterView(cur.topology, jobs, now)
            plan = policy.decide(cur, now)
            cur = _check(name, cur, plan)
        # A quiet cluster stays quiet: deciding again at once changes nothing for event-only policies.
        if policy.quantum is None and name.startswith(("fifo", "srtf", "afs-l")):  # type: ignore[attr-defined]
            assert not policy.decide(cur, cur.now), name


def test_plan_is_deterministic() -> None:
    topo = Topology.uniform(2, 4)
    jobs = tuple(Job(JobSpec(f"j{i}", "u", 1, 3, float(i), total_work=100.0 * (i + 1))) for i in range(9))
    view = ClusterView(topo, jobs, 0.0)
    for policy in POLICIES.values():
        assert policy.decide(view, 0.0) == policy.decide(view, 0.0)


def test_down_node_gets_nothing() -> None:
    a, b = Topology.uniform(2, 2).nodes
    topo = Topology((replace(a, up=False), b))
    jobs = tuple(Job(JobSpec(f"j{i}", "u", 1, 1, float(i))) for i in range(3))
    view = ClusterView(topo, jobs, 0.0)
    for name, policy in POLICIES.items():
        after = _check(name, view, policy.decide(view, 0.0))
        whole = [j for j in after.jobs if j.state is JobState.RUNNING and j.placement and not j.placement.shared]
        assert len(whole) <= 2
