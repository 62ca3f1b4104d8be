"""Small hand-built views with the exact plans each mechanism must produce."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_gandiva.errors import ConfigError
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
from slurm_gandiva.selector.afs import afs_counts
from slurm_gandiva.selector.common import Speeds
from slurm_gandiva.selector.gandiva import tiers
from slurm_gandiva.selector.gandiva_round import finishing, young
from slurm_gandiva.selector.placement import LOCALITY_PRIOR, GpuPool, locality_factor, realize
from tests.helpers import TWO_BY_FOUR, gp


def job(
    jid: str,
    lo: int = 1,
    hi: int | None = None,
    *,
    submit: float = 0.0,
    work: float | None = 1000.0,
    rates: RateTable | None = None,
    **kw: object,
) -> Job:
    spec = JobSpec(jid, "u", lo, hi if hi is not None else lo, submit, total_work=work)
    return Job(spec, rates=rates or RateTable()).evolve(**kw)


def running(jid: str, placement: Placement, *, since: float = 0.0, **kw: object) -> Job:
    lo = kw.pop("lo", placement.count)
    hi = kw.pop("hi", lo)
    return job(
        jid,
        lo,  # type: ignore[arg-type]
        hi,  # type: ignore[arg-type]
        state=JobState.RUNNING,
        placement=placement,
        slice_start=since,
        first_start=since,
        times_scheduled=1,
        **kw,  # type: ignore[arg-type]
    )


def steps(plan: Plan) -> list[tuple[str, str, str]]:
    return [(d.action.value, d.job_id, str(d.placement) if d.placement else "-") for d in plan.decisions]


def place(view: ClusterView, j: Job, k: int) -> Placement | None:
    pool = GpuPool(view.topology)
    for other in view.running:
        assert other.placement is not None
        assert pool.book(other.placement)
        pool.settle(other.placement)  # they stay
    return pool.find(j, k)


# -- affinity placement --------------------------------------------------------------------------


def test_same_affinity_node_first_then_best_fit_switch() -> None:
    view = ClusterView(TWO_BY_FOUR, (running("a", gp("n1", 0)),))
    assert place(view, job("x"), 1) == gp("n1", 1)  # same affinity (1-GPU jobs), the half-used switch


def test_free_node_before_other_affinity_then_other_affinity() -> None:
    view = ClusterView(TWO_BY_FOUR, (running("a", gp("n1", 0, 1)),))
    assert place(view, job("x"), 1) == gp("n2", 0)
    view = ClusterView(TWO_BY_FOUR, (running("a", gp("n1", 0, 1)), running("b", gp("n2", 0, 1))))
    assert place(view, job("x"), 1) == gp("n1", 2)  # no same-affinity or free node: other affinity


def test_multi_gpu_job_gets_one_switch() -> None:
    view = ClusterView(TWO_BY_FOUR, (running("a", gp("n1", 0)), running("b", gp("n1", 2))))
    assert place(view, job("x", 2), 2) == gp("n2", 0, 1)  # n1 has 2 free GPUs, but on two sockets
    empty = ClusterView(TWO_BY_FOUR, ())
    assert place(empty, job("x", 2), 2) == gp("n1", 0, 1)
    assert place(empty, job("x", 3), 3) == gp("n1", 0, 1, 2)


def test_locality_sensitivity_decides_between_tiers() -> None:
    view = ClusterView(TWO_BY_FOUR, (running("a", gp("n1", 0, 2)),))  # n1: affinity 2, free 1 and 3
    # No measurements: the prior says two sockets cost more than the affinity tier is worth.
    assert place(view, job("x", 2), 2) == gp("n2", 0, 1)
    # Measured: this job does not care where its GPUs are, so it stays in the same-affinity node.
    flat = RateTable({(2, Locality.SWITCH): 20.0, (2, Locality.NODE): 20.0})
    assert place(view, job("x", 2, rates=flat), 2) == gp("n1", 1, 3)


def test_large_job_spans_fewest_nodes() -> None:
    p = place(ClusterView(TWO_BY_FOUR, ()), job("x", 6), 6)
    assert p == Placement(gp("n1", 0, 1, 2, 3).gpus + gp("n2", 0, 1).gpus)
    assert TWO_BY_FOUR.locality(p.gpus) is Locality.CROSS_NODE


def test_a_requeued_job_avoids_nodes_where_its_old_gpu_indices_are_taken() -> None:
    # b last ran on n1:1; Slurm 22.05 keeps that index and would leave b pending on any node where
    # another job holds GPU 1, whatever GPUs the release names.
    b = job("b", state=JobState.SUSPENDED, last_gpus=gp("n1", 1).gpus, times_scheduled=1)
    assert b.requeue_indices == frozenset({1})
    n1_busy = ClusterView(TWO_BY_FOUR, (running("c", gp("n1", 1)), running("d", gp("n2", 0))))
    assert place(n1_busy, b, 1) == gp("n2", 1)  # n1 (same affinity, free GPUs) is no good: c holds n1:1
    # A preference, not a rule: with every node tied, b still gets the placement it would get untied.
    both_busy = ClusterView(TWO_BY_FOUR, (running("c", gp("n1", 1)), running("d", gp("n2", 1))))
    assert place(both_busy, b, 1) == place(both_busy, job("fresh"), 1) is not None
    # A 5-GPU job tied to indices 0 and 1 must span both nodes, and c holds n2:0: no clear placement
    # exists, so it gets the untied one.
    w = job("w", 5, state=JobState.SUSPENDED, last_gpus=gp("n1", 0, 1).gpus, times_scheduled=1)
    spread = place(ClusterView(TWO_BY_FOUR, (running("c", gp("n2", 0)),)), w, 5)
    assert spread is not None and len(spread.gpus) == 5
    # A running job is not tied (moves are left free: see Job.requeue_indices).
    assert running("r", gp("n1", 2, 3)).requeue_indices == frozenset()


def test_only_gpus_of_jobs_that_stay_tie_a_requeued_job() -> None:
    """A job starting in the same plan on GPU 0 does not tie b (last on GPU 0): the actor resumes b
    first (its waves). A running job staying on GPU 0 does: with strict ties b gets nothing there."""
    one = Topology.uniform(1, 2)
    b = job("b", state=JobState.SUSPENDED, last_gpus=gp("n1", 0).gpus, times_scheduled=1)
    pool = GpuPool(one, strict_ties=True)
    assert pool.book(gp("n1", 0))  # a start in this plan
    assert pool.find(b, 1) == gp("n1", 1)
    pool.settle(gp("n1", 0))  # a running job that stays
    assert pool.find(b, 1) is None
    pool.release(gp("n1", 0))
    assert pool.find(b, 1) == gp("n1", 0)


def test_a_requeued_job_gets_its_own_gpu_index_back_whoever_is_placed_first() -> None:
    """n1:0 and n1:2 are free (one on each switch); f last ran on GPU 0 and s on GPU 2 of another node.
    Each gets its own index back, in either placement order (it then ties no other GPU in Slurm)."""
    f = job("f", state=JobState.SUSPENDED, last_gpus=gp("n2", 0).gpus, times_scheduled=1)
    s = job("s", state=JobState.SUSPENDED, last_gpus=gp("n2", 2).gpus, times_scheduled=1)
    for first, second in ((f, s), (s, f)):
        pool = GpuPool(TWO_BY_FOUR)
        for taken in (gp("n1", 1, 3), gp("n2", 0, 1, 2, 3)):
            assert pool.book(taken)
        got = {}
        for j in (first, second):
            p = pool.find(j, 1)
            assert p is not None and pool.book(p)
            got[j.job_id] = p
        assert got == {"f": gp("n1", 0), "s": gp("n1", 2)}


def test_gandiva_leaves_a_job_slurm_would_hold_waiting_and_gives_its_turn_to_the_next() -> None:
    """b (least service) last ran on GPU 1; c and d hold GPU 1 of both nodes. Slurm would keep b pending
    wherever it goes (the controller would wait on it, a whole round blocked), so Gandiva does not
    resume it; e, next in line, takes a free GPU. The count-based default still places b (a preference
    there: see `GpuPool.find`)."""
    topo = Topology.uniform(2, 2)
    c = running("c", gp("n1", 1), since=55.0, attained_service=5.0)
    d = running("d", gp("n2", 1), since=55.0, attained_service=5.0)
    b = job("b", state=JobState.SUSPENDED, last_gpus=gp("n1", 1).gpus, times_scheduled=1, attained_service=1.0)
    e = job("e", submit=5.0)
    e = e.evolve(attained_service=2.0)
    view = ClusterView(topo, (c, d, b, e), 60.5)
    plan = make_policy("gandiva", pack=False, quantum=30.0).decide(view, 60.5)
    assert [(a, j) for a, j, _ in steps(plan)] == [("start", "e")]
    assert "b" in {x.job_id for x in make_policy("default").decide(view, 60.5).decisions}


def test_a_running_job_moved_off_its_gpus_avoids_nodes_where_its_indices_are_taken() -> None:
    """x runs on n1:1; GPUs kept for another job take n1 (as `_reservation` does), so `realize` moves x.
    Moved, it is requeued and keeps index 1: n2 (y holds n2:1) would leave it pending; n3 does not."""
    topo = Topology.uniform(3, 2)
    x, y, z = running("x", gp("n1", 1)), running("y", gp("n2", 1)), running("z", gp("n3", 0))
    view = ClusterView(topo, (x, y, z))
    pool = GpuPool(topo)
    assert pool.book(gp("n1", 0, 1))
    targets, _ = realize(view, [y, z, x], {"x": 1, "y": 1, "z": 1}, pool=pool)
    assert targets.placements == {"x": gp("n3", 1)}
    # With no node clear of index 1, it still moves (a preference: it may wait in Slurm).
    pool = GpuPool(topo)
    assert pool.book(gp("n1", 0, 1)) and pool.book(gp("n3", 1))
    targets, _ = realize(view, [y, z, x], {"x": 1, "y": 1, "z": 1}, pool=pool)
    assert targets.placements == {"x": gp("n2", 0)}


# -- time-slicing --------------------------------------------------------------------------------

ONE_GPU = Topology.uniform(1, 1)


def test_time_slice_waits_for_min_slice_then_rotates() -> None:
    pol = make_policy("gandiva", pack=False, service_ratio=0.0)  # linear tiers: the paper's round robin
    a = running("a", gp("n1", 0), since=0.0, attained_service=30.0)
    b = job("b", submit=10.0)
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 30.0), 30.0)  # a's slice is younger than 60 s
    a = a.evolve(attained_service=70.0)  # 10 s past the hysteresis: less than a service step (15 s)
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 120.0), 120.0)
    a = a.evolve(attained_service=76.0)
    plan = pol.decide(ClusterView(ONE_GPU, (a, b), 121.0), 121.0)
    assert steps(plan) == [("suspend", "a", "-"), ("start", "b", "n1:0")]
    # Kept at the rotation at 120: it keeps its GPU until the next rotation (window: a quarter quantum).
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 136.0), 136.0)
    assert pol.quantum == 60.0  # type: ignore[attr-defined]


def test_start_up_jitter_does_not_decide_who_is_suspended() -> None:
    """Two jobs started in the same round differ by a second of service (their slices opened a second
    apart); the later-submitted one yields to the waiting job whichever got the extra second."""
    topo = Topology.uniform(1, 2)
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    c = job("c", submit=20.0)
    for sa, sb in ((31.2, 31.9), (31.9, 31.2)):
        a = running("a", gp("n1", 0), since=0.0, attained_service=sa, submit=0.0)
        b = running("b", gp("n1", 1), since=0.0, attained_service=sb, submit=5.0)
        plan = pol.decide(ClusterView(topo, (a, b, c), 30.5), 30.5)
        assert [(x, j) for x, j, _ in steps(plan)] == [("suspend", "b"), ("start", "c")], (sa, sb)


def test_time_slice_picks_least_service_then_longest_waiting() -> None:
    pol = make_policy("gandiva", pack=False, service_ratio=0.0)
    a = running("a", gp("n1", 0), since=0.0, attained_service=200.0)
    b = job("b", state=JobState.SUSPENDED, attained_service=50.0, last_run_end=20.0, times_scheduled=1)
    c = job("c", state=JobState.SUSPENDED, attained_service=50.0, last_run_end=10.0, times_scheduled=1)
    d = job("d", state=JobState.SUSPENDED, attained_service=80.0, last_run_end=5.0, times_scheduled=1)
    plan = pol.decide(ClusterView(ONE_GPU, (a, b, c, d), 240.0), 240.0)
    assert steps(plan) == [("suspend", "a", "-"), ("resume", "c", "n1:0")]


def test_tiers_start_at_the_values_not_at_fixed_edges() -> None:
    assert tiers({"a": 0.0, "b": 7.0, "c": 7.6, "d": 20.0}, 7.5) == {"a": 0, "b": 0, "c": 1, "d": 2}
    # 44 and 46 are one group although a fixed 7.5 s grid would put an edge (45) between them.
    assert tiers({"x": 44.0, "y": 46.0}, 7.5) == {"x": 0, "y": 0}
    assert tiers({"a": 1.0, "b": 1.0, "c": 2.0}, 0.0) == {"a": 0, "b": 0, "c": 1}


def test_jobs_stopped_in_the_same_round_wait_equally_long() -> None:
    """b and c stopped 0.8 s apart (one round): the earlier submission resumes first, not the earlier stop."""
    pol = make_policy("gandiva", pack=False)
    b = job("b", submit=5.0, state=JobState.SUSPENDED, attained_service=30.0, last_run_end=10.0, times_scheduled=1)
    c = job("c", submit=3.0, state=JobState.SUSPENDED, attained_service=30.0, last_run_end=10.8, times_scheduled=1)
    plan = pol.decide(ClusterView(ONE_GPU, (b, c), 50.0), 50.0)
    assert steps(plan) == [("resume", "c", "n1:0")]
    c = c.evolve(last_run_end=13.0)  # a later round: b has waited longer
    assert steps(pol.decide(ClusterView(ONE_GPU, (b, c), 50.0), 50.0)) == [("resume", "b", "n1:0")]


def test_aligned_slices_end_only_at_rotations() -> None:
    """quantum 30: a slice whose training began at 21 may end at the rotation at 60, not at 51 when it
    is 30 s old; one that began at 31 waits for the rotation at 90 (it is only 29 s old at 60)."""
    a = running("a", gp("n1", 0), since=21.0)
    assert young(a, 51.4, 30.0) is False and young(a, 51.4, 30.0, 30.0) is True
    assert young(a, 60.5, 30.0, 30.0) is False
    assert young(a.evolve(slice_start=31.0), 60.5, 30.0, 30.0) is True
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    b = job("b", submit=0.0)
    busy = a.evolve(attained_service=40.0)
    assert not pol.decide(ClusterView(ONE_GPU, (busy, b), 57.0), 57.0)  # 36 s old, but no rotation yet
    rotated = pol.decide(ClusterView(ONE_GPU, (busy, b), 60.5), 60.5)
    assert steps(rotated) == [("suspend", "a", "-"), ("start", "b", "n1:0")]
    # Not aligned: the slice ends as soon as it is 30 s old.
    free = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0, aligned=False)
    assert steps(free.decide(ClusterView(ONE_GPU, (busy, b), 57.0), 57.0))[0] == ("suspend", "a", "-")


def test_a_job_about_to_finish_is_not_stopped_at_a_rotation() -> None:
    """a has 5 s of work left at 100 samples/s (quantum 30: grace 7.5 s): suspending it would cost a
    checkpoint, a resume and a whole wait; it keeps its GPU and b waits a few seconds. With 20 s left it
    is rotated out as usual."""
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    rates = RateTable({(1, Locality.SWITCH): 100.0})
    a = running("a", gp("n1", 0), since=0.0, attained_service=60.0, rates=rates, work=6000.0, progress=5500.0)
    b = job("b", submit=0.0)
    assert finishing(a, 7.5) and not pol.decide(ClusterView(ONE_GPU, (a, b), 60.5), 60.5)
    rotated = pol.decide(ClusterView(ONE_GPU, (a.evolve(progress=4000.0), b), 60.5), 60.5)
    assert steps(rotated) == [("suspend", "a", "-"), ("start", "b", "n1:0")]


def test_time_slice_hysteresis_avoids_swapping_every_round() -> None:
    pol = make_policy("gandiva", pack=False, service_ratio=0.0)  # hysteresis defaults to one quantum (60 s)
    a = running("a", gp("n1", 0), since=0.0, attained_service=100.0)
    b = job("b", state=JobState.SUSPENDED, attained_service=50.0, last_run_end=0.0, times_scheduled=1)
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 100.0), 100.0)  # b is only 50 s behind
    # 61 s behind: after the hysteresis, within one service step (15 s) of b: a tie, the running job stays.
    assert not pol.decide(ClusterView(ONE_GPU, (a.evolve(attained_service=111.0), b), 111.0), 111.0)
    plan = pol.decide(ClusterView(ONE_GPU, (a.evolve(attained_service=126.0), b), 126.0), 126.0)
    assert steps(plan) == [("suspend", "a", "-"), ("resume", "b", "n1:0")]


def test_a_rotation_needs_a_job_served_four_times_less_in_geometric_tiers() -> None:
    """By default (service_ratio 4) a waiting job takes the GPU only from a job with at least four times its
    service (the running one counts its hysteresis, 60 s, less): between jobs of similar service a rotation
    does not pay. Linear tiers (service_ratio 0, the paper's round robin) rotate at once. (Both jobs are
    past their early feedback here: `feedback_service` 0 keeps least service in force past it.)"""
    pol = make_policy("gandiva", pack=False, feedback_service=0.0)
    a = running("a", gp("n1", 0), since=0.0, attained_service=3000.0)
    b = job("b", state=JobState.SUSPENDED, attained_service=800.0, last_run_end=0.0, times_scheduled=1)
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 3000.0), 3000.0)  # 2940 s against 800 s: under 4x
    swap = [("suspend", "a", "-"), ("resume", "b", "n1:0")]
    linear = make_policy("gandiva", pack=False, service_ratio=0.0)
    assert steps(linear.decide(ClusterView(ONE_GPU, (a, b), 3000.0), 3000.0)) == swap
    b = b.evolve(attained_service=700.0)  # over 4x behind
    assert steps(pol.decide(ClusterView(ONE_GPU, (a, b), 3000.0), 3000.0)) == swap


def test_past_its_early_feedback_a_job_runs_in_response_ratio_order() -> None:
    """Past `feedback_service` (600 s per GPU) a job no longer rotates by least service: a long job keeps
    its GPU against one with far less service but a lower response ratio (least service alone would
    swap them), yields to one with a higher ratio (a short job that has waited), and to any job still
    short of its early feedback (a new one)."""
    pol = make_policy("gandiva", pack=False)
    now = 6000.0  # a rotation
    # ratio (6000 + 94000) / 94000: about 1.06
    a = running("a", gp("n1", 0), since=0.0, attained_service=6000.0, progress=6000.0, work=100_000.0)

    def stopped(jid: str, submit: float, work: float) -> Job:
        return job(jid, submit=submit, work=work, state=JobState.SUSPENDED, attained_service=700.0,
                   progress=700.0, last_run_end=submit + 700.0, times_scheduled=1)

    long_new = stopped("c", 4000.0, 1_000_700.0)  # (2000 + 1e6) / 1e6: about 1.002
    assert not pol.decide(ClusterView(ONE_GPU, (a, long_new), now), now)
    las = make_policy("gandiva", pack=False, feedback_service=0.0)
    assert steps(las.decide(ClusterView(ONE_GPU, (a, long_new), now), now)) == [
        ("suspend", "a", "-"), ("resume", "c", "n1:0")]
    short_old = stopped("b", 0.0, 2000.0)  # (6000 + 1300) / 1300: about 5.6
    assert steps(pol.decide(ClusterView(ONE_GPU, (a, long_new, short_old), now), now)) == [
        ("suspend", "a", "-"), ("resume", "b", "n1:0")]
    fresh = job("d", submit=5990.0)
    assert steps(pol.decide(ClusterView(ONE_GPU, (a, short_old, fresh), now), now)) == [
        ("suspend", "a", "-"), ("start", "d", "n1:0")]


def test_past_feedback_a_running_job_keeps_its_gpus_unless_a_ratio_beats_it_by_the_margin() -> None:
    """Past its early feedback a running job counts its response ratio `response_margin` (here 1.25; default
    1.0) times higher: a waiting job of a slightly higher ratio does not take its GPU (no swap back and forth
    as ratios creep past each other), one of a clearly higher ratio does."""
    pol = make_policy("gandiva", pack=False, response_margin=1.25)
    now = 6000.0
    a = running("a", gp("n1", 0), since=0.0, attained_service=3000.0, progress=3000.0, work=13_000.0)  # 1.6

    def stopped(work: float) -> Job:
        return job("b", work=work, state=JobState.SUSPENDED, attained_service=700.0, progress=700.0,
                   last_run_end=700.0, times_scheduled=1)

    assert not pol.decide(ClusterView(ONE_GPU, (a, stopped(8_700.0)), now), now)  # (6000 + 8000) / 8000: 1.75
    assert steps(pol.decide(ClusterView(ONE_GPU, (a, stopped(5_700.0)), now), now)) == [  # 2.2: over 1.6 x 1.25
        ("suspend", "a", "-"), ("resume", "b", "n1:0")]
    even = make_policy("gandiva", pack=False, response_margin=1.0)
    assert steps(even.decide(ClusterView(ONE_GPU, (a, stopped(8_700.0)), now), now)) == [
        ("suspend", "a", "-"), ("resume", "b", "n1:0")]


def test_leftover_gpus_go_in_priority_order_so_a_running_job_keeps_them() -> None:
    """A 2-GPU job on one node (max_nodes 1) is counted for GPUs but fits no node: the GPUs left over go
    to the jobs without any in priority order, so the running job `l` (response ratio 1.6, counted 1.25
    times higher) stays where it is and one waiting job of a lower ratio takes the other free GPU.
    Waiting jobs first stopped `l` for two waiting ones, and swapped them back at the next rotation."""
    pol = make_policy("gandiva", pack=False, migrate=False)
    now = 6000.0
    topo = Topology.uniform(2, 2)

    def high(jid: str, at: Placement) -> Job:  # ratio (6000 + 1000) / 1000: 7
        return running(jid, at, attained_service=5000.0, progress=5000.0, work=6000.0)

    wide = job("w", 2, work=5400.0, state=JobState.SUSPENDED, attained_service=1400.0, progress=1400.0,
               last_run_end=1400.0, times_scheduled=1)  # ratio 4, but needs both GPUs of one node
    wide = wide.evolve(spec=replace(wide.spec, max_nodes=1))
    left = running("l", gp("n1", 1), attained_service=3000.0, progress=3000.0, work=13_000.0)  # ratio 1.6

    def low(jid: str) -> Job:  # ratio (6000 + 30000) / 30000: 1.2
        return job(jid, work=30_700.0, state=JobState.SUSPENDED, attained_service=700.0, progress=700.0,
                   last_run_end=700.0, times_scheduled=1)

    view = ClusterView(topo, (high("x", gp("n1", 0)), high("y", gp("n2", 0)), wide, left, low("z1"), low("z2")), now)
    assert steps(pol.decide(view, now)) == [("resume", "z1", "n2:1")]


def test_a_waiting_four_gpu_job_gets_a_node_kept_for_it_instead_of_starving() -> None:
    """Eight 1-GPU jobs hold both nodes; a 4-GPU job with no service waits. Where young slices pin GPUs
    on both nodes, the free GPU of the node with fewest pinned ones stays idle (no new 1-GPU slice
    starts there); once that node's pinned slices are old, its lowest-priority jobs stop and the 4-GPU
    job starts there (on n2, where the old slices are)."""
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    now = 90.5  # just after a rotation

    def one(jid: str, node: str, i: int, since: float, service: float) -> Job:
        return running(jid, gp(node, i), since=since, attained_service=service)

    old = [one(f"o{i}", "n2", i, 0.0, 100.0 + i) for i in range(4)]  # 100 s of service, slices 100 s old
    young = [one(f"y{i}", "n1", i, 80.0, 10.0) for i in range(3)]  # 10 s old: pinned
    big = job("big", 4, submit=50.0)
    small = job("small", 1, submit=60.0)  # also waits, after the big one in LAS order
    plan = pol.decide(ClusterView(TWO_BY_FOUR, (*old, *young, big, small), now), now)
    got = steps(plan)
    assert ("start", "big", "n2:0+1+2+3") in got
    assert sorted(j for a, j, _ in got if a == "suspend") == ["o0", "o1", "o2", "o3"]
    assert ("start", "small", "n1:3") in got  # a GPU the big job does not need
    # Both nodes pinned: n1 (2 pinned, 2 free) is the big job's; its free GPUs stay idle, nothing stops.
    pinned_n1 = [one(f"y{i}", "n1", i, 80.0, 10.0) for i in range(2)]
    n2 = [one(f"p{i}", "n2", i, 85.0, 5.0) for i in range(3)] + [one("q", "n2", 3, 0.0, 100.0)]
    plan = pol.decide(ClusterView(TWO_BY_FOUR, (*pinned_n1, *n2, big, small), now), now)
    assert not plan, steps(plan)
    # Without the reservation the small job would have started on n1 (the policy before this change).
    alone = pol.decide(ClusterView(TWO_BY_FOUR, (*pinned_n1, *n2, small), now), now)
    assert [(a, j) for a, j, _ in steps(alone)] == [("start", "small")]


def test_gpus_a_job_yields_to_a_big_one_go_on_in_priority_order() -> None:
    """The README demo's rotation at 150 s: 2-GPU jobs b3 (n2) and b2 (n1) ran 46 s; three 1-GPU jobs
    were suspended at 90 s after 60 s of service; a4 (n1:0) ends in about 7.5 s; the 4-GPU c1 waits. c1
    gets n2 (b3 yields). The GPUs b3 was counted for go to the next job in LAS order, b2 (a lower service
    tier than the 1-GPU jobs): it keeps running; the 1-GPU jobs' Slurm indices (2, 3) are b2's, so they
    wait. Before, they went to the 1-GPU jobs (waiting jobs first) and b2 was suspended 14 s from its
    end, but only when a4 counted as finishing: whether its end was 7.2 s or 7.8 s away flipped the
    round (the simulator and the live run diverged on it)."""
    pol = make_policy("gandiva", pack=False, quantum=30.0)
    now = 150.0
    rate = RateTable({(1, Locality.SWITCH): 100.0, (2, Locality.SWITCH): 150.0})

    def waiting(jid: str, i: int, node: str, submit: float) -> Job:
        return job(
            jid, submit=submit, state=JobState.SUSPENDED, attained_service=60.0, last_run_end=90.5,
            times_scheduled=1, last_gpus=gp(node, i).gpus, work=10000.0, progress=6000.0, rates=rate,
        )

    others = (
        waiting("a3", 3, "n1", 27.0),
        waiting("e3", 2, "n2", 29.0),
        waiting("a5", 3, "n2", 29.5),
        running("b3", gp("n2", 2, 3), since=104.3, attained_service=111.1, submit=31.0, rates=rate,
                work=11000.0, progress=7000.0),
        running("b2", gp("n1", 2, 3), since=104.3, attained_service=111.4, submit=34.0, rates=rate,
                work=9300.0, progress=7200.0),
        job("c1", 4, submit=36.0),
    )
    for left in (7.2, 7.8):  # a4 counts as finishing (grace 7.5 s) or not: the same round
        a4 = running("a4", gp("n1", 0), since=112.0, attained_service=98.8, submit=28.0, rates=rate,
                     work=10000.0, progress=10000.0 - 100.0 * left, last_run_end=90.5)
        jobs = tuple(replace(j, spec=replace(j.spec, max_nodes=1)) for j in (a4, *others))  # as the wrapper
        plan = pol.decide(ClusterView(TWO_BY_FOUR, jobs, now), now)
        assert steps(plan) == [("suspend", "b3", "-"), ("start", "c1", "n2:0+1+2+3")], (left, steps(plan))


def test_gpus_kept_for_a_big_job_are_never_taken_from_a_job_ahead_of_it() -> None:
    """Mid-round, a 2-GPU job (less service, submitted first) and a 4-GPU job wait; n2 has two free GPUs.
    The 2-GPU job starts there: the 4-GPU job behind it cannot keep them idle for itself (it could not
    start anyway: young slices pin the rest of both nodes)."""
    pol = make_policy("gandiva", pack=False, quantum=30.0, hysteresis=0.0)
    now = 108.8
    jobs = (
        running("r1", gp("n1", 0, 1), since=96.0, attained_service=2.0),
        running("r2", gp("n1", 2), since=35.0, attained_service=90.0),
        running("r3", gp("n2", 1), since=100.0, attained_service=85.0),
        running("r4", gp("n2", 2), since=92.0, attained_service=50.0),
        job("two", 2, submit=10.0),
        job("four", 4, submit=18.0),
    )
    plan = pol.decide(ClusterView(TWO_BY_FOUR, jobs, now), now)
    assert steps(plan) == [("start", "two", "n2:0+3")]


def test_attained_service_is_per_gpu_for_fairness() -> None:
    topo = Topology.uniform(1, 2)
    pol = make_policy("gandiva", pack=False, hysteresis=0.0, service_ratio=0.0)
    a = running("a", gp("n1", 0, 1), since=0.0, attained_service=100.0)  # 50 s per GPU
    b = job("b", 1, state=JobState.SUSPENDED, attained_service=60.0, last_run_end=0.0, times_scheduled=1)
    assert not pol.decide(ClusterView(topo, (a, b), 120.0), 120.0)  # b ran longer (60 s) than a
    c = job("c", 2, state=JobState.SUSPENDED, attained_service=40.0, last_run_end=0.0, times_scheduled=1)
    plan = pol.decide(ClusterView(topo, (a, c), 120.0), 120.0)
    assert steps(plan) == [("suspend", "a", "-"), ("resume", "c", "n1:0+1")]  # c ran 20 s per GPU


# -- introspection: trials and reverts -----------------------------------------------------------


def test_pack_trial_when_a_job_waits() -> None:
    pol = make_policy("gandiva")
    a = running("a", gp("n1", 0), since=0.0, attained_service=30.0, measured_rate=100.0)
    b = job("b", submit=10.0)
    plan = pol.decide(ClusterView(ONE_GPU, (a, b), 30.0), 30.0)
    assert steps(plan) == [("pack", "a", "n1:0(shared)"), ("start", "b", "n1:0(shared)")]
    assert all(d.trial is TrialKind.PACK for d in plan.decisions)
    after = plan.apply(ClusterView(ONE_GPU, (a, b), 30.0))
    assert after.consistency_errors() == []
    assert after.job("a").trial == Trial(TrialKind.PACK, 30.0, 100.0, gp("n1", 0))


def test_failed_pack_is_reverted_and_not_retried() -> None:
    pol = make_policy("gandiva", service_ratio=0.0)
    rates = RateTable({(1, Locality.SWITCH): 100.0})
    a = running(
        "a",
        gp("n1", 0, shared=True),
        since=0.0,
        work=100_000.0,  # far from done: not spared as finishing
        rates=rates,
        attained_service=300.0,
        trial=Trial(TrialKind.PACK, 0.0, 100.0, gp("n1", 0)),
        measured_rate=40.0,
    )
    b = running(
        "b",
        gp("n1", 0, shared=True),
        since=0.0,
        rates=rates,
        attained_service=200.0,
        trial=Trial(TrialKind.PACK, 0.0, 0.0, None),
        measured_rate=40.0,
    )
    view = ClusterView(ONE_GPU, (a, b), 200.0)
    plan = pol.decide(view, 200.0)
    assert steps(plan) == [("suspend", "b", "-"), ("unpack", "a", "n1:0")]
    assert all(d.revert for d in plan.decisions)
    after = plan.apply(view)
    assert after.consistency_errors() == []
    assert TrialKind.PACK in after.job("a").failed_trials and TrialKind.PACK in after.job("b").failed_trials
    # b waits now; it is never packed again, but time-slicing gives it its turn (less service than a).
    plan = pol.decide(after, 240.0)  # the next rotation
    assert steps(plan) == [("suspend", "a", "-"), ("resume", "b", "n1:0")]
    assert plan.decisions[1].trial is None


def test_good_pack_is_kept() -> None:
    pol = make_policy("gandiva")
    rates = RateTable({(1, Locality.SWITCH): 100.0})
    a = running(
        "a",
        gp("n1", 0, shared=True),
        rates=rates,
        trial=Trial(TrialKind.PACK, 0.0, 100.0, gp("n1", 0)),
        measured_rate=70.0,
    )
    b = running(
        "b", gp("n1", 0, shared=True), rates=rates, trial=Trial(TrialKind.PACK, 0.0, 0.0, None), measured_rate=70.0
    )
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 30.0), 30.0)


def test_grow_trial_onto_idle_gpus_and_revert() -> None:
    topo = Topology.uniform(1, 4)
    pol = make_policy("gandiva")
    a = running("a", gp("n1", 0), since=0.0, lo=1, hi=4, measured_rate=10.0)
    plan = pol.decide(ClusterView(topo, (a,), 100.0), 100.0)
    assert steps(plan) == [("resize", "a", "n1:0+1+2+3")]
    assert plan.decisions[0].trial is TrialKind.GROW
    grown = plan.apply(ClusterView(topo, (a,), 100.0)).job("a").evolve(measured_rate=10.5)
    plan = pol.decide(ClusterView(topo, (grown,), 300.0), 300.0)
    assert steps(plan) == [("resize", "a", "n1:0")]
    assert plan.decisions[0].revert
    # A grow that pays is kept.
    assert not pol.decide(ClusterView(topo, (grown.evolve(measured_rate=30.0),), 300.0), 300.0)
    # A job about to finish (10 s left; grace a quarter quantum, 15 s) is not restarted to grow.
    fast = RateTable({(1, Locality.SWITCH): 10.0, (2, Locality.SWITCH): 20.0, (4, Locality.SWITCH): 40.0})
    ending = a.evolve(rates=fast, progress=900.0)
    assert not pol.decide(ClusterView(topo, (ending,), 100.0), 100.0)
    assert steps(pol.decide(ClusterView(topo, (ending.evolve(progress=0.0),), 100.0), 100.0))[0][0] == "resize"


def test_migrate_to_better_locality_and_revert() -> None:
    pol = make_policy("gandiva")
    a = running("a", Placement((GpuRef("n1", 0), GpuRef("n2", 0))), since=0.0, measured_rate=50.0)
    view = ClusterView(TWO_BY_FOUR, (a,), 100.0)
    plan = pol.decide(view, 100.0)
    assert steps(plan) == [("migrate", "a", "n1:0+1")]
    assert plan.decisions[0].trial is TrialKind.MIGRATE
    moved = plan.apply(view).job("a").evolve(measured_rate=40.0)  # slower after the move
    plan = pol.decide(ClusterView(TWO_BY_FOUR, (moved,), 300.0), 300.0)
    assert steps(plan) == [("migrate", "a", "n1:0,n2:0")] and plan.decisions[0].revert
    # A job about to finish (10 s left, grace 15 s) is not moved: the restart costs more than it saves.
    ending = a.evolve(rates=RateTable({(2, Locality.CROSS_NODE): 50.0}), progress=500.0)
    assert not pol.decide(ClusterView(TWO_BY_FOUR, (ending,), 100.0), 100.0)
    assert steps(pol.decide(ClusterView(TWO_BY_FOUR, (ending.evolve(progress=0.0),), 100.0), 100.0))[0][0] == "migrate"


# -- AFS ------------------------------------------------------------------------------------------


def _afs_pair(gain_l: float, seed: int = 0, pessimistic: bool = False) -> dict[str, int]:
    short = job(
        "l", 1, 2, work=100.0, rates=RateTable({(1, Locality.SWITCH): 10.0, (2, Locality.SWITCH): 10.0 * gain_l})
    )
    long = job("h", 1, 2, work=1000.0, rates=RateTable({(1, Locality.SWITCH): 10.0, (2, Locality.SWITCH): 20.0}))
    return afs_counts([short, long], 3, Speeds(), pessimistic=pessimistic, seed=seed)


def test_afs_l_pairwise_rule_by_hand() -> None:
    # l = the shorter job. 1.9 + 20/10... l wins iff T_l(2)/T_l(1) + T_h(1)/T_h(2) > 2.
    assert _afs_pair(1.9) == {"l": 2, "h": 1}  # 1.9 + 0.5 = 2.4 > 2
    assert _afs_pair(1.1) == {"l": 1, "h": 2}  # 1.1 + 0.5 = 1.6 < 2


def test_afs_p_wins_only_when_robust_else_seeded_tie() -> None:
    # gain 1.1 vs 2.0: h wins whichever is shorter (2 + 1/1.1 > 2 and 1.1 + 1/2 < 2).
    assert all(_afs_pair(1.1, seed, True) == {"l": 1, "h": 2} for seed in range(10))
    # gain 1.9 vs 2.0: each wins when it is the shorter one: a seeded coin decides.
    outcomes = {tuple(sorted(_afs_pair(1.9, seed, True).items())) for seed in range(20)}
    assert outcomes == {(("h", 1), ("l", 2)), (("h", 2), ("l", 1))}
    assert _afs_pair(1.9, 3, True) == _afs_pair(1.9, 3, True)


def test_afs_l_oversubscribed_gives_the_shortest_jobs_one_gpu() -> None:
    topo = Topology.uniform(1, 2)
    jobs = (job("a", 1, 4, work=300.0), job("b", 1, 4, work=100.0), job("c", 1, 4, work=200.0))
    plan = make_policy("afs-l").decide(ClusterView(topo, jobs), 0.0)
    assert sorted(d.job_id for d in plan.by_action(Action.START)) == ["b", "c"]
    assert all(d.placement is not None and d.placement.count == 1 for d in plan.decisions)


def test_afs_l_hands_spare_gpus_out() -> None:
    topo = Topology.uniform(1, 4)
    jobs = (job("a", 1, 4, work=100.0), job("b", 1, 4, work=1000.0))  # linear scaling: gains 2, 1.5, ...
    plan = make_policy("afs-l").decide(ClusterView(topo, jobs), 0.0)
    assert sum(d.placement.count for d in plan.decisions if d.placement) == 4
    counts = {d.job_id: d.placement.count for d in plan.decisions if d.placement}
    # a (shorter): 1->2 gain 2 + 1/2 > 2 wins; then a at 2 (1.5) vs b at 1 (2): 1.5 + 0.5 = 2, not > 2: b.
    assert counts == {"a": 2, "b": 2}


def test_afs_hands_spare_gpus_to_tenants_below_their_caps_first() -> None:
    """`tenant_caps`: the spare GPUs go to the jobs of tenants below their caps first; those a tenant below
    its cap cannot use still go to the others (work-conserving)."""
    linear = RateTable({(k, Locality.SWITCH): 10.0 * k for k in range(1, 9)})
    short = [replace(job(f"s{i}", 1, 8, work=100.0, rates=linear), spec=JobSpec(f"s{i}", "sam", 1, 8, 0.0,
             total_work=100.0, account="a")) for i in range(2)]
    long = replace(job("l", 1, 8, work=10_000.0, rates=linear),
                   spec=JobSpec("l", "lee", 1, 8, 0.0, total_work=10_000.0, account="b"))
    jobs = [*short, long]
    plain = afs_counts(jobs, 8, Speeds(), pessimistic=False)
    assert plain["l"] == 2  # the short jobs win most spare GPUs by AFS-L's rule
    capped = afs_counts(jobs, 8, Speeds(), pessimistic=False, tenant_caps={("a", "sam"): 4, ("b", "lee"): 4})
    assert capped == {"s0": 2, "s1": 2, "l": 4}
    # A tenant below its cap that cannot use more leaves the rest to the others.
    one = replace(long, spec=replace(long.spec, max_gpus=1))
    left = afs_counts([*short, one], 8, Speeds(), pessimistic=False, tenant_caps={("a", "sam"): 4, ("b", "lee"): 4})
    assert left["l"] == 1 and left["s0"] + left["s1"] == 7


def test_afs_p_lease_protects_then_expires() -> None:
    pol = make_policy("afs-p")
    a = running("a", gp("n1", 0), since=0.0, lo=1, hi=1)
    b = job("b", submit=5.0)
    assert not pol.decide(ClusterView(ONE_GPU, (a, b), 100.0), 100.0)
    plan = pol.decide(ClusterView(ONE_GPU, (a, b), 8000.0), 8000.0)
    assert steps(plan) == [("suspend", "a", "-"), ("start", "b", "n1:0")]


# -- baselines -----------------------------------------------------------------------------------


def test_fifo_never_preempts_and_blocks_at_head() -> None:
    topo = Topology.uniform(1, 2)
    a = running("a", gp("n1", 0), work=1e9)
    b = job("b", 2, submit=1.0, work=1.0)
    c = job("c", 1, submit=2.0, work=1.0)
    view = ClusterView(topo, (a, b, c), 10.0)
    assert not make_policy("fifo").decide(view, 10.0)
    assert steps(make_policy("fifo", backfill=True).decide(view, 10.0)) == [("start", "c", "n1:1")]


def test_srtf_preempts_for_shorter_job() -> None:
    a = running("a", gp("n1", 0), work=1000.0)
    b = job("b", submit=1.0, work=10.0)
    plan = make_policy("srtf").decide(ClusterView(ONE_GPU, (a, b), 10.0), 10.0)
    assert steps(plan) == [("suspend", "a", "-"), ("start", "b", "n1:0")]


def test_tiresias_demotes_past_threshold() -> None:
    assert make_policy("tiresias").threshold == 50 * 3600.0  # type: ignore[attr-defined]  # as the AFS evaluation
    pol = make_policy("tiresias", threshold=3600.0)
    b = job("b", submit=1.0)
    young = running("a", gp("n1", 0), attained_service=100.0)
    assert not pol.decide(ClusterView(ONE_GPU, (young, b), 100.0), 100.0)
    old = young.evolve(attained_service=4000.0)
    plan = pol.decide(ClusterView(ONE_GPU, (old, b), 4000.0), 4000.0)
    assert steps(plan) == [("suspend", "a", "-"), ("start", "b", "n1:0")]


# -- the composed default ------------------------------------------------------------------------


def test_default_gives_a_new_job_a_probe_slice_then_allocates_like_afs_l() -> None:
    pol = make_policy("default", pack=False)
    a = running("a", gp("n1", 0), since=0.0, lo=1, hi=1, work=1000.0, attained_service=500.0)
    b = job("b", submit=400.0, work=1e6)
    view = ClusterView(ONE_GPU, (a, b), 500.0)
    plan = pol.decide(view, 500.0)
    assert steps(plan) == [("suspend", "a", "-"), ("start", "b", "n1:0")]  # AFS-L alone would keep a
    assert not make_policy("afs-l").decide(view, 500.0)
    probing = plan.apply(view)
    assert not pol.decide(probing, 560.0)  # the probe slice is protected
    plan = pol.decide(probing, 700.0)
    assert steps(plan) == [("suspend", "b", "-"), ("resume", "a", "n1:0")]


def test_registry() -> None:
    assert POLICY_NAMES == ("slurm", "fifo", "srtf", "tiresias", "gandiva", "afs-l", "afs-p", "default")
    for name in POLICY_NAMES:
        pol = make_policy(name)
        assert pol.name == name
        assert pol.quantum is None or pol.quantum > 0  # type: ignore[attr-defined]
    assert make_policy("afs-p", lease=60.0).lease == 60.0  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("nope")
    with pytest.raises(ConfigError, match="no parameter"):
        make_policy("fifo", quantum_x=1)


def test_default_does_not_resize_a_job_during_its_probe_slice() -> None:
    topo = Topology.uniform(1, 4)
    pol = make_policy("default")
    view = ClusterView(topo, (job("b", 1, 4, work=1e6),), 0.0)
    plan = pol.decide(view, 0.0)
    assert steps(plan) == [("start", "b", "n1:0")]  # the first slice: no resize before feedback
    started = plan.apply(view)
    assert not pol.decide(started, 60.0)
    plan = pol.decide(ClusterView(topo, started.jobs, 200.0), 200.0)
    assert steps(plan) == [("resize", "b", "n1:0+1+2+3")]  # then AFS hands it the idle GPUs


# -- max_nodes: jobs the wrapper runs on one node ------------------------------------------------


def one_node(j: Job) -> Job:
    return j.evolve(spec=replace(j.spec, max_nodes=1))


def test_max_nodes_job_is_never_spread_over_nodes() -> None:
    a, b = running("a", gp("n1", 0, 1)), running("b", gp("n2", 0, 1))  # two free GPUs on each node
    wide = job("w", 4, submit=1.0)
    view = ClusterView(TWO_BY_FOUR, (a, b, wide), 10.0)
    assert place(view, wide, 4) == Placement(gp("n1", 2, 3).gpus + gp("n2", 2, 3).gpus)
    assert place(view, one_node(wide), 4) is None
    assert place(view, one_node(wide), 2) == gp("n1", 2, 3)
    view = ClusterView(TWO_BY_FOUR, (a, b, one_node(wide)), 10.0)
    for name in POLICY_NAMES:
        plan = make_policy(name).decide(view, 10.0)
        assert all(len(d.placement.nodes) == 1 for d in plan.decisions if d.placement), (name, steps(plan))


def test_job_too_big_for_its_nodes_waits_without_holding_gpus() -> None:
    big = one_node(job("big", 6, submit=0.0))  # six GPUs, but a node has four
    small = job("s", 1, submit=1.0)
    view = ClusterView(TWO_BY_FOUR, (big, small), 0.0)
    for name in POLICY_NAMES:
        plan = make_policy(name).decide(view, 0.0)
        assert [(d.action.value, d.job_id) for d in plan.decisions] == [("start", "s")], (name, steps(plan))


def test_elastic_growth_stops_at_what_its_nodes_hold() -> None:
    fresh = one_node(job("e", 1, 8))
    for name in ("afs-l", "afs-p"):
        plan = make_policy(name).decide(ClusterView(TWO_BY_FOUR, (fresh,), 0.0), 0.0)
        assert steps(plan) == [("start", "e", "n1:0+1+2+3")], name
    settled = one_node(running("e", gp("n1", 0), since=0.0, lo=1, hi=8, measured_rate=10.0))
    settled = settled.evolve(times_scheduled=2)
    for name in ("default", "gandiva"):
        plan = make_policy(name).decide(ClusterView(TWO_BY_FOUR, (settled,), 1000.0), 1000.0)
        [d] = plan.decisions
        assert d.action is Action.RESIZE and d.placement is not None, (name, steps(plan))
        assert d.placement.count == 4 and len(d.placement.nodes) == 1, (name, steps(plan))


# -- locality loss when only the poor locality was measured --------------------------------------


def test_locality_factor_estimates_a_better_locality_never_measured() -> None:
    poor = job("a", 2, rates=RateTable({(2, Locality.NODE): 50.0}))
    assert locality_factor(poor, 2, Locality.NODE) == pytest.approx(LOCALITY_PRIOR[Locality.NODE])
    assert locality_factor(poor, 2, Locality.SWITCH) == 1.0
    # Measured at both: the measurements decide, unmeasured localities between them add no loss.
    flat = job("b", 2, rates=RateTable({(2, Locality.SWITCH): 50.0, (2, Locality.NODE): 50.0}))
    assert locality_factor(flat, 2, Locality.NODE) == 1.0
    assert locality_factor(flat, 2, Locality.SOCKET) == 1.0
    hurt = job("c", 2, rates=RateTable({(2, Locality.SWITCH): 50.0, (2, Locality.NODE): 25.0}))
    assert locality_factor(hurt, 2, Locality.NODE) == pytest.approx(0.5)


def test_measured_badly_placed_job_gets_a_migration_trial_and_reverts_if_not_faster() -> None:
    topo = Topology.uniform(1, 4)  # switch 0 = GPUs 0,1 (socket 0); switch 1 = GPUs 2,3 (socket 1)
    rates = RateTable({(2, Locality.NODE): 50.0})  # measured only where it is: across switches and sockets
    a = running("a", gp("n1", 1, 3), since=0.0, measured_rate=50.0, rates=rates)
    assert a.placement is not None and topo.locality(a.placement.gpus) is Locality.NODE
    view = ClusterView(topo, (a,), 1000.0)
    for name in ("gandiva", "default"):
        pol = make_policy(name)
        plan = pol.decide(view, 1000.0)
        assert steps(plan) == [("migrate", "a", "n1:0+1")], name
        assert plan.decisions[0].trial is TrialKind.MIGRATE
        moved = plan.apply(view).job("a")
        moved = moved.evolve(measured_rate=45.0, rates=moved.rates.with_rate(2, Locality.SWITCH, 45.0))
        later = ClusterView(topo, (moved,), 1300.0)
        plan = pol.decide(later, 1300.0)
        assert steps(plan) == [("migrate", "a", "n1:1+3")] and plan.decisions[0].revert, name
        # Faster under one switch: it stays, and nothing else is tried.
        assert not pol.decide(ClusterView(topo, (moved.evolve(measured_rate=60.0),), 1300.0), 1300.0)
