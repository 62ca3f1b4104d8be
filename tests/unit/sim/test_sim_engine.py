"""The discrete-event engine on hand-checkable traces, overhead charging, plan checks, determinism."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import ClusterView, GpuRef, Placement
from slurm_gandiva.plan import Plan
from slurm_gandiva.profiles import load_profile
from slurm_gandiva.sim.engine import Overheads, PlanRejected, SimConfig, SimResult, Simulator, _Rec
from slurm_gandiva.sim.trace import Trace, TraceJob, load_philly
from tests.unit.sim.sim_toy_policies import ToyDoubleBook, ToyFifo, ToyGrowShrink, ToyPackAll, ToyRoundRobin

ZERO = Overheads(start=0, suspend=0, resume=0)
ONE_GPU = SimConfig(nodes=1, gpus_per_node=1, overheads=ZERO)
CIFAR_STEP = load_profile("cifar10").step_time((1,))


def trace(*jobs: tuple[str, float, float, int]) -> Trace:
    return Trace("t", tuple(TraceJob(j, s, d, g, model="cifar10") for j, s, d, g in jobs))


def jcts(result: SimResult) -> dict[str, float | None]:
    return {j.job_id: j.jct for j in result.jobs}


def test_two_jobs_one_gpu_fifo_exact() -> None:
    res = Simulator(trace(("a", 0, 100, 1), ("b", 10, 50, 1)), ToyFifo(), ONE_GPU).run()
    assert jcts(res) == pytest.approx({"a": 100.0, "b": 140.0})
    a, b = res.jobs
    assert (a.queueing_delay, b.queueing_delay) == pytest.approx((0.0, 90.0))
    assert a.time_to_feedback == pytest.approx(100 * CIFAR_STEP)
    assert b.time_to_feedback == pytest.approx(90 + 100 * CIFAR_STEP)
    assert a.gpu_seconds == pytest.approx(100.0) and b.gpu_seconds == pytest.approx(50.0)
    assert res.end_time == pytest.approx(150.0)


def test_start_cost_is_charged_as_dead_time() -> None:
    cfg = replace(ONE_GPU, overheads=Overheads(start=5, suspend=0, resume=0))
    res = Simulator(trace(("a", 0, 100, 1), ("b", 10, 50, 1)), ToyFifo(), cfg).run()
    assert jcts(res) == pytest.approx({"a": 105.0, "b": 150.0})
    assert res.jobs[0].overhead_seconds == pytest.approx(5.0)
    assert res.jobs[0].time_to_feedback == pytest.approx(5 + 100 * CIFAR_STEP)


def test_time_slicing_charges_suspend_and_resume() -> None:
    """a: 0-60 runs; b: starts 60, waits for a's checkpoint until 65, runs to 125 (its slice counts from
    its training start, 65: 60 s done); a: resumes 125, GPU busy with b's checkpoint until 130, +10
    resume, 40 s left -> done 180; b: resumes 180, +10, 40 s left -> done 230."""
    cfg = replace(ONE_GPU, overheads=Overheads(start=0, suspend=5, resume=10))
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1)), ToyRoundRobin(60.0), cfg).run()
    assert jcts(res) == pytest.approx({"a": 180.0, "b": 230.0})
    a, b = res.jobs
    assert (a.suspends, b.suspends) == (1, 1)
    assert a.overhead_seconds == pytest.approx(15.0)
    assert b.overhead_seconds == pytest.approx(5.0 + 10.0)


def test_a_suspended_jobs_service_includes_its_suspend() -> None:
    """The controller closes a slice when the job has stopped: a, suspended at 60 with a 5 s suspend, has
    65 s of service from then on in what the policy sees (it was 60 s, the suspend left out)."""
    seen: list[tuple[float, float]] = []

    class Watch(ToyRoundRobin):
        def decide(self, view: ClusterView, now: float) -> Plan:
            for a in view.jobs:
                if a.job_id == "a" and a.state.value == "suspended":
                    seen.append((now, a.attained_service))
            return super().decide(view, now)

    cfg = replace(ONE_GPU, overheads=Overheads(start=0, suspend=5, resume=10))
    Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1)), Watch(60.0), cfg).run()
    assert seen and all(svc == pytest.approx(65.0) for _, svc in seen), seen


def test_time_slicing_without_overheads_shares_the_gpu() -> None:
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1)), ToyRoundRobin(60.0), ONE_GPU).run()
    # a 0-60, b 60-120, a 120-160 done, b 160-200 done
    assert jcts(res) == pytest.approx({"a": 160.0, "b": 200.0})
    assert res.decisions >= 3


def test_packing_applies_interference_only_while_shared() -> None:
    cfg = replace(ONE_GPU, interference=0.5)
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 50, 1)), ToyPackAll(), cfg).run()
    # both at half speed until b finishes at 100 (50 s of work), then a alone at full speed: 50 s left
    assert jcts(res) == pytest.approx({"a": 150.0, "b": 100.0})


def test_elastic_job_grows_and_counts_resizes() -> None:
    cfg = SimConfig(nodes=1, gpus_per_node=4, overheads=Overheads(start=0, suspend=0, resume=0, resize=3))
    tr = trace(("a", 0, 100, 1), ("b", 10, 100, 1))
    sim = Simulator(tr, ToyGrowShrink(), cfg)
    assert sim.elastic
    res = sim.run()
    a, b = res.jobs
    assert (a.min_gpus, a.max_gpus) == (1, sim._speeds["cifar10"].max_useful_gpus(4))
    assert a.finish is not None and a.finish < 100  # it ran on more GPUs than asked
    assert b.resizes == 0 and a.resizes == 0  # head keeps its GPUs; b waits, then starts whole
    assert b.queueing_delay == pytest.approx(a.finish - 10)


def test_rigid_config_overrides_policy() -> None:
    cfg = SimConfig(nodes=1, gpus_per_node=4, elastic=False, overheads=ZERO)
    sim = Simulator(trace(("a", 0, 100, 2)), ToyGrowShrink(), cfg)
    res = sim.run()
    assert (res.jobs[0].min_gpus, res.jobs[0].max_gpus) == (2, 2)
    assert res.jobs[0].jct == pytest.approx(100.0)


def test_double_booking_is_rejected() -> None:
    with pytest.raises(PlanRejected, match="holds"):
        Simulator(trace(("a", 0, 10, 1), ("b", 0, 10, 1)), ToyDoubleBook(), SimConfig(nodes=1)).run()


def test_out_of_range_count_is_rejected() -> None:
    with pytest.raises(PlanRejected, match=r"outside 2\.\.2"):
        Simulator(trace(("a", 0, 10, 2)), ToyRoundRobin(), SimConfig(nodes=1, overheads=ZERO)).run()


class Idle:
    name = "idle"
    quantum = 60.0
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        return Plan()


def test_a_policy_that_never_starts_leaves_jobs_unfinished_and_stops() -> None:
    res = Simulator(trace(("a", 0, 10, 1), ("b", 5, 10, 1)), Idle(), SimConfig(nodes=1)).run()
    assert [j.finish for j in res.jobs] == [None, None]
    assert res.decisions == 2


def test_oversized_jobs_are_clamped_to_the_cluster() -> None:
    res = Simulator(trace(("a", 0, 10, 128)), ToyFifo(), SimConfig(nodes=2, gpus_per_node=4, overheads=ZERO)).run()
    assert res.jobs[0].gpus == 8 and res.jobs[0].jct == pytest.approx(10.0)


def test_deterministic_for_a_seed_and_seed_changes_models() -> None:
    tr = load_philly(vc="0e4a51", jobs=120, load=3.0)
    cfg = SimConfig(nodes=4, gpus_per_node=4, seed=7)
    r1 = Simulator(tr, ToyFifo(), cfg).run()
    r2 = Simulator(tr, ToyFifo(), cfg).run()
    assert r1 == r2
    r3 = Simulator(tr, ToyFifo(), replace(cfg, seed=8)).run()
    assert [j.model for j in r1.jobs] != [j.model for j in r3.jobs]
    assert all(j.finish is not None for j in r1.jobs)


def test_progress_callback_reaches_the_end() -> None:
    seen: list[tuple[int, int]] = []
    Simulator(trace(("a", 0, 10, 1), ("b", 1, 10, 1)), ToyFifo(), ONE_GPU).run(
        progress=lambda d, n, t: seen.append((d, n))
    )
    assert seen[-1] == (2, 2)


def test_max_time_stops_early() -> None:
    cfg = replace(ONE_GPU, max_time=50.0)
    res = Simulator(trace(("a", 0, 100, 1)), ToyFifo(), cfg).run()
    assert res.jobs[0].finish is None and res.end_time == 50.0
    assert res.jobs[0].gpu_seconds == pytest.approx(50.0)


def test_overheads_from_requeue_json(tmp_path: Path) -> None:
    d = tmp_path / "benchmarks" / "results"
    d.mkdir(parents=True)
    (d / "requeue.json").write_text('{"suspend": {"median": 2.5, "mean": 3}, "resume_s": 7, "migrate": 11}')
    oh = Overheads.default([tmp_path / "nowhere", tmp_path])
    assert (oh.suspend, oh.resume, oh.migrate, oh.start) == (2.5, 7.0, 11.0, 0.0)
    assert oh.source.endswith("requeue.json")
    assert Overheads.default([tmp_path / "nowhere"]) == Overheads()
    (d / "requeue.json").write_text('{"suspend": -1}')
    with pytest.raises(ConfigError, match="suspend"):
        Overheads.from_file(d / "requeue.json")


class RoundRobinWithWake(ToyRoundRobin):
    """Round robin that says exactly when it needs the next call (the optional `next_decision` hook)."""

    def __init__(self, quantum: float) -> None:
        super().__init__(quantum)
        self.calls: list[float] = []

    def next_decision(self, view: ClusterView, now: float) -> float | None:
        self.calls.append(now)
        return now + self.quantum if len(view.active) > 1 else None


def test_next_decision_hook_replaces_the_quantum() -> None:
    pol = RoundRobinWithWake(60.0)
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1)), pol, ONE_GPU).run()
    assert jcts(res) == pytest.approx({"a": 160.0, "b": 200.0})
    assert pol.calls == [0.0, 60.0, 120.0, 160.0]


class BadWake(ToyFifo):
    def next_decision(self, view: ClusterView, now: float) -> float | None:
        return now


def test_next_decision_must_move_forward() -> None:
    with pytest.raises(PlanRejected, match="not after now"):
        Simulator(trace(("a", 0, 100, 1)), BadWake(), ONE_GPU).run()


class ToySwap(ToyFifo):
    """FIFO, except that when a third job shows up, the jobs on n1:0 and n1:1 swap GPUs in one plan."""

    name = "toy-swap"

    def decide(self, view: ClusterView, now: float) -> Plan:
        a, b = GpuRef("n1", 0), GpuRef("n1", 1)
        on = {j.placement.gpus[0]: j for j in view.running if j.placement is not None}
        if a in on and b in on and on[a].job_id == "a" and len(view.active) == 3:
            return Plan.from_targets(view, {"a": Placement((b,)), "b": Placement((a,))})
        return super().decide(view, now)


def test_a_chain_of_moves_in_one_plan_is_judged_by_its_end_state() -> None:
    """Swap at 50: each job's new GPU is busy with the other's checkpoint until 55, then the migrate
    costs 5 + 10: both resume at 70 with 50 s left -> 120; c starts at 120 and runs 10 s."""
    cfg = SimConfig(nodes=1, gpus_per_node=2, overheads=Overheads(start=0, suspend=5, resume=10))
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1), ("c", 50, 10, 1)), ToySwap(), cfg).run()
    assert jcts(res) == pytest.approx({"a": 120.0, "b": 120.0, "c": 80.0})
    assert [j.migrations for j in res.jobs] == [1, 1, 0]


def test_tick_decides_as_often_as_the_controller() -> None:
    """A policy without a quantum is only asked on events; with `tick` the engine asks every tick, so a
    20 s slice ends at the first tick after 20 s (as the controller's tick would end it), not never."""

    class SliceAfter20:
        name = "slice-after-20"
        elastic = False
        quantum = None

        def decide(self, view: ClusterView, now: float) -> Plan:
            return ToyRoundRobin(20.0).decide(view, now)

    cfg = replace(ONE_GPU, overheads=Overheads(start=0, suspend=0, resume=0))
    jobs = trace(("a", 0, 100, 1), ("b", 0, 100, 1))
    quiet = Simulator(jobs, SliceAfter20(), cfg).run()
    assert [j.suspends for j in quiet.jobs] == [0, 0]  # asked only on events: a ran to the end, then b
    ticked = Simulator(jobs, SliceAfter20(), replace(cfg, tick=7.0)).run()
    assert ticked.jobs[0].suspends >= 1 and ticked.decisions > quiet.decisions
    assert ticked.jobs[0].first_start == 0.0 and ticked.jobs[1].first_start == pytest.approx(21.0)


def test_with_a_tick_events_are_acted_on_at_the_next_tick_only() -> None:
    """Ticks every 4 s from the first arrival (0): b, submitted at 1, starts at the tick at 4 on the second
    GPU; a's GPU frees at 10 and c (submitted at 5) gets it at the tick at 12, not at 10."""
    cfg = replace(ONE_GPU, gpus_per_node=2, tick=4.0)
    res = Simulator(trace(("a", 0, 10, 1), ("b", 1, 100, 1), ("c", 5, 10, 1)), ToyFifo(), cfg).run()
    starts = {j.job_id: j.first_start for j in res.jobs}
    assert starts == pytest.approx({"a": 0.0, "b": 4.0, "c": 12.0})
    assert jcts(res) == pytest.approx({"a": 10.0, "b": 103.0, "c": 17.0})


def test_a_late_arrival_is_seen_late_and_its_jct_counts_from_submission() -> None:
    class Late(Simulator):
        def make_jobs(self) -> list[_Rec]:
            recs = super().make_jobs()
            recs[0].arrive = 3.0  # the controller registered it 3 s after its submission
            return recs

    res = Late(trace(("a", 0, 10, 1)), ToyFifo(), ONE_GPU).run()
    assert res.jobs[0].first_start == 3.0 and res.jobs[0].jct == pytest.approx(13.0)


def test_finish_overhead_holds_the_gpus_after_the_last_sample() -> None:
    """With finish=3, a 100 s job ends at 103 and the next one on its GPU starts then."""
    cfg = replace(ONE_GPU, overheads=Overheads(start=0, suspend=0, resume=0, finish=3.0))
    res = Simulator(trace(("a", 0, 100, 1), ("b", 0, 100, 1)), ToyFifo(), cfg).run()
    assert jcts(res) == pytest.approx({"a": 103.0, "b": 206.0})
    assert res.jobs[0].overhead_seconds == pytest.approx(3.0)


def test_learned_rates_show_policies_only_what_was_measured() -> None:
    """With learn_rates a job's table starts as the subclass left it (empty here) and gains the rate it
    ran at, at its GPU count and locality, once it trains: what the controller's rate records hold."""
    from slurm_gandiva.model import JobState, Locality, RateTable

    seen: list[RateTable] = []

    class Spy(ToyFifo):
        def decide(self, view: ClusterView, now: float) -> Plan:
            seen.extend(j.rates for j in view.jobs if j.state is JobState.RUNNING)
            return super().decide(view, now)

    class Blank(Simulator):
        def make_jobs(self) -> list[_Rec]:
            recs = super().make_jobs()
            for r in recs:
                r.job = replace(r.job, rates=RateTable())
            return recs

    cfg = replace(ONE_GPU, tick=5.0, learn_rates=True)
    Blank(trace(("a", 0, 20, 1)), Spy(), cfg).run()
    assert seen and all(set(t.rates) == {(1, Locality.SWITCH)} for t in seen)
    seen.clear()
    Blank(trace(("a", 0, 20, 1)), Spy(), replace(cfg, learn_rates=False)).run()
    assert seen and all(t.rates == {} for t in seen)  # without learning the (blank) table stays as it was


def test_a_tick_that_comes_while_the_round_still_acts_is_skipped() -> None:
    """Ticks every 2 s; the start of a (at 0) keeps the actor busy until Slurm runs it, 7 s (`launch`):
    the ticks at 2, 4 and 6 are skipped as the controller's are, so b (submitted at 1) starts at 8."""
    cfg = replace(ONE_GPU, gpus_per_node=2, tick=2.0, overheads=Overheads(start=0, suspend=0, resume=0, launch=7.0))
    res = Simulator(trace(("a", 0, 10, 1), ("b", 1, 10, 1)), ToyFifo(), cfg).run()
    assert {j.job_id: j.first_start for j in res.jobs} == pytest.approx({"a": 0.0, "b": 8.0})
