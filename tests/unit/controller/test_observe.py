"""observe: Slurm jobs + store records + progress -> ClusterView (pure parts)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from slurm_gandiva.controller.observe import (
    PROGRESS_CARRY_S,
    JobInputs,
    build_view,
    foreign_gpus,
    is_managed,
    requested_gpu_count,
    requested_placement,
)
from slurm_gandiva.model import GpuRef, JobSpec, JobState, Locality, Topology
from slurm_gandiva.selector import make_policy
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store.api import RateRecord, SliceEnd, SliceRecord
from tests.unit.controller.controller_fakes import nodes, pl, sjob

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


@dataclass(frozen=True)
class Prog:
    samples: int = 0
    total_samples: int | None = None
    samples_per_s: float = 0.0
    world_size: int = 1
    updated: float = 0.0
    started: float | None = None


def spec(jid: str, lo: int = 1, hi: int = 1, total: float | None = None) -> JobSpec:
    return JobSpec(jid, "alice", lo, hi, 1000.0, total)


def test_requested_gpus_and_placement() -> None:
    assert requested_gpu_count(sjob("1", tres="gres:gpu:3")) == 3
    assert requested_gpu_count(sjob("1", tres="gres:shard:g1:1,gres:shard:g3:1")) == 2
    j = sjob("1", tres="gres:gpu:g1:1,gres:gpu:g3:1", nodes=("n2",))
    assert requested_placement(j) == pl("n2", 1, 3)
    assert requested_placement(sjob("1", tres="gres:gpu:2", nodes=("n2",))) is None


def test_managed_needs_mark_and_partition() -> None:
    assert is_managed(sjob("1"), ("gpu",))
    assert is_managed(sjob("1", partition="other"), ())
    assert not is_managed(sjob("1", partition="other"), ("gpu",))
    assert not is_managed(sjob("1", comment="x"), ())


def test_states_placements_and_history() -> None:
    now = 2000.0
    s_old = SliceRecord(1, "2", "alice", 1, pl("n1", 0), 1100.0, 1200.0, SliceEnd.QUANTUM)
    s_open = SliceRecord(2, "3", "alice", 1, pl("n1", 1, 2), 1900.0)
    inputs = [
        JobInputs(sjob("1"), spec("1")),  # held, never ran -> queued
        JobInputs(sjob("2", restarts=1), spec("2"), slices=(s_old,)),  # ran before -> suspended
        JobInputs(sjob("3", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (1, 2)}), spec("3", 1, 4), slices=(s_open,)),
        JobInputs(sjob("4", "COMPLETED", hold=HoldKind.NONE), spec("4")),  # finished: not in view
    ]
    view = build_view(TOPO, nodes(), inputs, {}, now)
    assert [j.job_id for j in view.jobs] == ["1", "2", "3"]
    assert view.job("1").state is JobState.QUEUED
    s = view.job("2")
    assert s.state is JobState.SUSPENDED and s.times_scheduled == 1 and s.last_run_end == 1200.0
    assert s.attained_service == 100.0
    assert s.last_gpus == pl("n1", 0).gpus and s.requeue_indices == frozenset({0})  # Slurm keeps them
    r = view.job("3")
    assert r.state is JobState.RUNNING and r.placement == pl("n1", 1, 2)
    assert r.slice_start == 1900.0 and r.attained_service == 200.0 and r.spec.elastic
    assert view.consistency_errors() == []


def test_measured_rate_feeds_rate_table_only_when_fresh_and_matching() -> None:
    sl = SliceRecord(1, "1", "alice", 1, pl("n1", 0, 1), 1000.0)
    running = sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0, 1)})
    old = RateRecord(1, "1", 1, Locality.SWITCH, 50.0, 900.0)
    fresh = Prog(samples=640, total_samples=6400, samples_per_s=90.0, world_size=2, updated=1010.0)
    view = build_view(TOPO, nodes(), [JobInputs(running, spec("1", 1, 2), (sl,), (old,), fresh)], {}, 1011.0)
    j = view.job("1")
    assert j.measured_rate == 90.0 and j.progress == 640.0 + 90.0  # carried 1 s past the report
    assert j.rates.throughput(2, Locality.SWITCH) == 90.0 and j.rates.throughput(1) == 50.0
    assert j.spec.total_work == 6400.0  # from progress when the spec has none
    stale = Prog(samples=640, samples_per_s=90.0, world_size=2, updated=1001.0)  # within warm-up
    v2 = build_view(TOPO, nodes(), [JobInputs(running, spec("1", 1, 2), (sl,), (), stale)], {}, 1011.0)
    assert v2.job("1").measured_rate is None
    wrong = Prog(samples=640, samples_per_s=90.0, world_size=1, updated=1010.0)  # old world size
    v3 = build_view(TOPO, nodes(), [JobInputs(running, spec("1", 1, 2), (sl,), (), wrong)], {}, 1011.0)
    assert v3.job("1").measured_rate is None
    assert v2.job("1").progress == v3.job("1").progress == 640.0  # no measured rate: not carried forward


def test_progress_is_carried_to_now_at_the_measured_rate_up_to_the_end_and_a_limit() -> None:
    """The wrapper reports every few seconds: a job 5 s from its end must not look 10 s from it."""
    sl = SliceRecord(1, "1", "alice", 1, pl("n1", 0), 1000.0)
    running = sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)})
    prog = Prog(samples=5000, total_samples=6000, samples_per_s=100.0, world_size=1, updated=1100.0)

    def at(now: float) -> float:
        return build_view(TOPO, nodes(), [JobInputs(running, spec("1"), (sl,), (), prog)], {}, now).job("1").progress

    assert at(1100.0) == 5000.0 and at(1104.0) == 5400.0
    assert at(1200.0) == 6000.0  # never past the end
    far = Prog(samples=100, total_samples=100_000, samples_per_s=100.0, world_size=1, updated=1100.0)
    stalled = build_view(TOPO, nodes(), [JobInputs(running, spec("1"), (sl,), (), far)], {}, 1500.0).job("1")
    assert stalled.progress == 100 + 100.0 * PROGRESS_CARRY_S  # a job that stopped reporting stalls


def test_foreign_jobs_take_gpus_out_and_down_nodes_show() -> None:
    other = sjob("9", "RUNNING", hold=HoldKind.NONE, gpus={"n2": (3,)}, comment="")
    foreign = foreign_gpus([other, sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)})], ("gpu",))
    assert foreign == {"n2": {3}}
    from dataclasses import replace

    ns = (nodes()[0], replace(nodes()[1], state="DOWN"))
    view = build_view(TOPO, ns, [], foreign, 0.0)
    assert GpuRef("n2", 3) not in view.topology.all_gpus(up_only=False)
    assert view.free_gpus() == tuple(GpuRef("n1", i) for i in range(4))


def test_scaling_prior_fills_unmeasured_counts_anchored_to_measurements() -> None:
    from slurm_gandiva.controller.observe import with_prior
    from slurm_gandiva.model import RateTable

    measured = RateTable().with_rate(1, Locality.SWITCH, 50.0)
    t = with_prior(measured, {1: 1.0, 2: 1.8, 3: 2.5})
    assert t.throughput(1) == 50.0 and t.throughput(2) == 90.0 and t.throughput(3) == 125.0
    both = measured.with_rate(2, Locality.NODE, 70.0)  # a measurement always wins over the prior
    assert with_prior(both, {1: 1.0, 2: 1.8}).rates == both.rates
    assert with_prior(RateTable(), {1: 1.0, 2: 1.8}).rates == {}  # nothing to anchor to
    sl = SliceRecord(1, "1", "alice", 1, pl("n1", 0), 1000.0)
    running = sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)})
    prog = Prog(samples=64, samples_per_s=40.0, world_size=1, updated=1010.0)
    inp = JobInputs(running, spec("1", 1, 2), (sl,), (), prog, speedup={1: 1.0, 2: 1.9})
    j = build_view(TOPO, nodes(), [inp], {}, 1011.0).job("1")
    assert j.rates.speedup(2) == 1.9


def test_max_nodes_from_the_config_caps_every_job_and_spans_are_even() -> None:
    """The controller's `max_nodes` (config) caps every managed job, whatever its spec; a job across nodes
    gets the same GPUs on each (Slurm's per-node gres)."""
    from slurm_gandiva.selector import make_policy
    from slurm_gandiva.selector.placement import is_even

    wide = JobSpec("1", "alice", 8, 8, 1000.0, max_nodes=1)
    view = build_view(TOPO, nodes(), [JobInputs(sjob("1"), wide)], {}, 1001.0, max_nodes=None)
    assert view.job("1").spec.max_nodes is None and view.same_gpus_per_node
    for name in ("gandiva", "default", "afs-l"):
        plan = make_policy(name).decide(view, 1001.0)
        assert [len(d.placement.nodes) for d in plan.decisions if d.placement] == [2], name
        assert all(is_even(d.placement) for d in plan.decisions if d.placement)
    one = build_view(TOPO, nodes(), [JobInputs(sjob("1"), JobSpec("1", "alice", 2, 8, 1000.0))], {}, 1001.0,
                     max_nodes=1)
    assert one.job("1").spec.max_nodes == 1
    for name in ("gandiva", "default", "afs-l"):
        plan = make_policy(name).decide(one, 1001.0)
        assert [len(d.placement.nodes) for d in plan.decisions if d.placement] == [1], name


def test_slice_starts_at_the_first_progress_report_not_the_slurm_start() -> None:
    """Start-up (10-20 s of process launch and torch import) does not count towards the minimum slice."""
    from slurm_gandiva.model import STARTUP_GRACE_S

    sl = SliceRecord(1, "1", "alice", 1, pl("n1", 0), 1000.0)
    running = sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)}, start=1000.0)

    def start(prog: Prog | None, rates: tuple[RateRecord, ...] = (), now: float = 1030.0) -> float | None:
        return build_view(TOPO, nodes(), [JobInputs(running, spec("1"), (sl,), rates, prog)], {}, now).job(
            "1"
        ).slice_start

    assert start(None) == 1000.0  # nothing reported yet: the Slurm start
    assert start(Prog(samples=64, world_size=1, updated=990.0)) == 1000.0  # a report from the last slice
    first = Prog(samples=64, samples_per_s=0.0, world_size=1, updated=1016.0)
    assert start(first) == 1016.0  # reported, not measured yet: the report
    later = Prog(samples=640, samples_per_s=40.0, world_size=1, updated=1029.0)
    rates = (
        RateRecord(1, "1", 1, Locality.SWITCH, 35.0, 900.0),  # an earlier slice's
        RateRecord(2, "1", 1, Locality.SWITCH, 38.0, 1018.0),
        RateRecord(3, "1", 1, Locality.SWITCH, 40.0, 1024.0),
    )
    assert start(later, rates) == 1018.0  # the first rate measured in this slice
    assert start(later, rates[:1]) == 1029.0
    slow = Prog(samples=64, world_size=1, updated=1500.0)  # start-up counts for at most the grace
    assert start(slow, now=1600.0) == 1000.0 + STARTUP_GRACE_S
    # The wrapper's own training start wins over the (late) first rate record ...
    told = Prog(samples=640, samples_per_s=40.0, world_size=1, updated=1029.0, started=1007.5)
    assert start(told, rates) == 1007.5
    # ... unless it is an earlier incarnation's (the report is stale), and it is still capped by the grace.
    stale = Prog(samples=64, world_size=1, updated=1029.0, started=950.0)
    assert start(stale, rates) == 1018.0
    assert start(Prog(samples=64, world_size=1, updated=1590.0, started=1580.0), now=1600.0) == 1060.0
    # With a 20 s quantum (rotations at multiples of 20), at the rotation at 1020 a job 20 s past its
    # Slurm start but 4 s into training keeps its GPU.
    from slurm_gandiva.selector import make_policy

    waiting = JobInputs(sjob("2", restarts=0, submit=1001.0), spec("2"))
    for p, kept in ((None, False), (first, True)):
        inputs = [JobInputs(running, spec("1"), (sl,), (), p), waiting]
        one_gpu = Topology.uniform(1, 1)
        view = build_view(one_gpu, nodes()[:1], inputs, {}, 1020.5)
        plan = make_policy("gandiva", quantum=20.0, pack=False, hysteresis=0.0).decide(view, 1020.5)
        assert (not any(d.job_id == "1" for d in plan.decisions)) is kept, (p, plan)


def test_memory_counts_only_where_slurm_allocates_it() -> None:
    # n1: 8000 MB, 7000 allocated: a managed job runs there with 3000, so outside jobs hold 4000.
    n1, n2 = nodes()
    ns = (replace(n1, cpus=8, memory=8000, alloc_cpus=3, alloc_memory=7000),
          replace(n2, cpus=8, memory=8000, alloc_memory=0))
    running = replace(sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)}), min_cpus_per_node=1,
                      min_memory_per_node=3000)
    inputs = [JobInputs(running, spec("1"))]
    counted = build_view(TOPO, ns, inputs, {}, 1000.0, memory=True).topology
    assert (counted.node("n1").memory_mb, counted.node("n1").memory_taken_mb) == (8000, 4000)
    assert (counted.node("n2").memory_mb, counted.node("n2").memory_taken_mb) == (8000, 0)
    assert (counted.node("n1").cpus, counted.node("n1").cpus_taken) == (8, 2)
    # Memory not consumable (CR_Core): not counted at all, whatever the nodes say; CPUs still are.
    plain = build_view(TOPO, ns, inputs, {}, 1000.0).topology
    assert (plain.node("n1").memory_mb, plain.node("n1").memory_taken_mb) == (0, 0)
    assert plain.node("n1").cpus_taken == 2
    # A node Slurm does not list is not counted (and is down).
    only_n1 = build_view(TOPO, ns[:1], inputs, {}, 1000.0, memory=True).topology
    assert only_n1.node("n2").memory_mb == 0 and not only_n1.node("n2").up


def test_a_node_whose_memory_outside_jobs_hold_is_not_offered() -> None:
    # n1's memory is all held by jobs outside the view: a waiting 1-GPU job is placed on n2 only.
    n1, n2 = nodes()
    ns = (replace(n1, cpus=8, memory=8000, alloc_cpus=2, alloc_memory=8000), replace(n2, cpus=8, memory=8000))
    waiting = replace(sjob("1"), min_cpus_per_node=1, min_memory_per_node=1000)
    view = build_view(TOPO, ns, [JobInputs(waiting, spec("1"))], {}, 1000.0, memory=True)
    plan = make_policy("gandiva").decide(view, view.now)
    assert [d.placement.nodes for d in plan.decisions if d.placement is not None] == [("n2",)]
