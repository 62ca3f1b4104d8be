"""The sim-vs-real benchmark's pure parts, on a hand-made real run (no Slurm)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from slurm_gandiva.demo import DemoResult, JobResult

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_sim_vs_real.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sim_vs_real", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _job(jid: str, lo: int, hi: int, samples: int, submitted: float, ended: float,
         rates: tuple[tuple[int, float], ...], slices: tuple[tuple[float, float | None, int, str], ...]) -> JobResult:
    return JobResult(jid, f"j{jid}", lo, hi, samples, submitted, slices[0][0], ended, "done", len(slices), "h",
                     rates, slices)


def _real() -> DemoResult:
    return DemoResult(
        (
            # 1 GPU at 100 samples/s: 1000 samples = 10 s of work in a 15 s slice -> 5 s dead
            _job("1", 1, 1, 1000, 0.0, 16.0, ((1, 100.0),), ((1.0, 16.0, 1, "done"),)),
            # 2 GPUs at 150 samples/s: 1500 samples = 10 s in two slices of 7 s -> 2 s dead per slice
            _job("2", 2, 2, 1500, 0.0, 30.0, ((2, 150.0),), ((1.0, 8.0, 2, "quantum"), (20.0, 27.0, 2, "done"))),
            _job("3", 1, 4, 1000, 5.0, 40.0, ((4, 200.0),), ((6.0, 40.0, 1, "resize"), (41.0, None, 4, ""))),
        ),
        0.0, 60.0, 20.0, "fifo", (),
    )


def test_speed_profile_interpolates_measured_rates(bench: ModuleType) -> None:
    prof = bench.speed_profile(_real())
    # Job 2 also ran on 1 GPU, at 120 samples/s: the shared profile takes the median (110), its own 120.
    real = _real()
    two = replace(real.jobs[1], rates=((1, 120.0), (2, 150.0)))
    real = replace(real, jobs=(real.jobs[0], two, real.jobs[2]))
    assert bench.speed_profile(real).throughput((1,)) == pytest.approx(110.0)
    own = bench.speed_profile(real, own=two)
    assert own.name == "demo-2" and own.throughput((1,)) == pytest.approx(120.0)
    assert own.throughput((4,)) == pytest.approx(200.0)  # never measured on 4: the others' rate
    assert prof.throughput((1,)) == pytest.approx(100.0)
    assert prof.throughput((2,)) == pytest.approx(150.0)
    assert prof.throughput((3,)) == pytest.approx(175.0)  # between 2 and 4
    assert prof.throughput((4,)) == pytest.approx(200.0)
    assert prof.throughput((4, 4)) == pytest.approx(200.0)  # spreading never pays


def test_costs_are_measured_from_the_store_and_the_wrappers_events(bench: ModuleType, tmp_path: Path) -> None:
    """start: intent -> fresh_start; resume: intent -> resumed; suspend: intent -> outcome; finish: training
    done -> the wrapper's exit (Slurm's end is whole seconds); lag: submission -> registration."""
    from slurm_gandiva.model import GpuRef, JobSpec, Placement
    from slurm_gandiva.plan import Action
    from slurm_gandiva.sim.engine import Overheads
    from slurm_gandiva.store import Outcome, SliceEnd, Store

    real = _real()
    (tmp_path / "controller").mkdir()
    store = Store(f"sqlite:///{tmp_path / 'controller' / 'gandiva.db'}")
    one = Placement((GpuRef("n1", 0),))
    times = {"1": [("fresh_start", 7.0), ("training_done", 15.5), ("exit", 16.3)],
             "2": [("fresh_start", 8.0), ("resumed", 26.0), ("training_done", 29.0), ("exit", 30.2)]}
    for j in real.jobs[:2]:
        store.upsert_job(JobSpec(j.job_id, "u", j.min_gpus, j.max_gpus, j.submitted), at=j.submitted + 1.5)
        log = tmp_path / "cluster" / "jobs" / j.job_id / "events.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"event": ev, "time": at, "outcome": "done"}) + "\n"
                               for ev, at in times[j.job_id]))
    for jid, action, at, done in (("1", Action.START, 2.0, 3.0), ("2", Action.START, 2.0, 3.0),
                                  ("2", Action.SUSPEND, 10.0, 10.5), ("2", Action.RESUME, 20.0, 21.0)):
        did = store.record_intent(jid, action, None if action is Action.SUSPEND else one, "", at)
        store.record_outcome(did, Outcome.SUCCEEDED, "", done)
    # The controller opens a slice when Slurm runs the job: service counts from then.
    for jid, start, end in (("1", 2.8, 16.0), ("2", 2.9, 10.5), ("2", 20.7, None)):
        store.open_slice(jid, one, start)
        if end is not None:
            store.close_slice(jid, end, SliceEnd.QUANTUM)
    store.close()
    m = bench.measure(tmp_path, real, Overheads())
    assert m.overheads.start == pytest.approx(5.5)  # median of 5 and 6
    assert m.overheads.resume == pytest.approx(6.0) and m.overheads.suspend == pytest.approx(0.5)
    assert m.exits == pytest.approx({"1": 0.8, "2": 1.2})  # each job's exit, for the replay
    assert m.overheads.finish == pytest.approx(1.0)  # their median
    assert m.lag == pytest.approx({"1": 1.5, "2": 1.5})
    assert m.overheads.launch == pytest.approx(1.0)  # start / resume decision -> Slurm runs it
    # Each job's start-ups, in order, for the replay: from its round's tick (multiples of 3 s), where the
    # simulator decides (decisions at 2 s and 20 s: ticks 0 and 18).
    assert m.events == {"1": [7.0], "2": [8.0, 8.0]}
    # How long after its round's tick (multiples of 3 s) each decision was done: the next tick waits.
    assert m.acts["1"] == pytest.approx([3.0]) and m.acts["2"] == pytest.approx([3.0, 1.5, 3.0])
    assert m.submit == {j.job_id: j.submitted for j in real.jobs[:2]}  # what the controller's policy saw
    # Each slice's opening after its round's tick, for the replay (the resume's round began at 18 s).
    assert m.launches["1"] == pytest.approx([2.8]) and m.launches["2"] == pytest.approx([2.9, 2.7])
    # The suspend closed job 2's slice 1.5 s after its round's tick (9 s).
    assert list(m.stops) == ["2"] and m.stops["2"] == pytest.approx([1.5])
    # A round that still saw job 1 running at 16.5 s (its wrapper exited at 16.3 s): Slurm said it ended
    # after that round's snapshot, so its GPUs were free only then.
    seen = {"at": 16.5, "decisions": [], "jobs": [{"job": "1", "state": "running"}]}
    (tmp_path / "controller" / "rounds.jsonl").write_text(json.dumps(seen) + "\n")
    assert bench.measure(tmp_path, real, Overheads()).exits == pytest.approx({"1": 1.1, "2": 1.2})


def test_cost_fit_recovers_base_per_gpu_and_crowd(bench: ModuleType) -> None:
    def cost(action: str, gpus: int, others: int) -> float:
        return {"start": 6.0, "resume": 4.0}[action] + 2.0 * (gpus - 1) + 1.5 * others

    shapes = [("start", 1, 6), ("start", 2, 6), ("start", 4, 2), ("start", 1, 2), ("resume", 1, 0), ("resume", 1, 3)]
    base, per_gpu, crowd = bench.fit_costs([(a, g, n, cost(a, g, n)) for a, g, n in shapes])
    assert base == pytest.approx({"start": 6.0, "resume": 4.0}) and per_gpu == pytest.approx(2.0)
    assert crowd == pytest.approx(1.5)
    # Crowding that makes start-ups *faster* is noise: that slope is dropped (0), the rest refitted.
    base, per_gpu, crowd = bench.fit_costs([("start", 1, n, 10.0 - n) for n in range(4)])
    assert crowd == 0.0 and per_gpu == 0.0 and base == pytest.approx({"start": 8.5})


def test_simulation_runs_the_same_jobs(bench: ModuleType) -> None:
    from slurm_gandiva.sim.engine import Overheads

    real = _real()
    sim, jct = bench.simulate(real, Overheads(start=0.0, suspend=0.0, resume=0.0))
    by = {j.job_id: j for j in sim.jobs}
    assert set(by) == {"1", "2", "3"}
    assert (by["2"].min_gpus, by["2"].max_gpus, by["3"].min_gpus, by["3"].max_gpus) == (2, 2, 1, 4)
    assert by["1"].jct == pytest.approx(10.0)  # FIFO, free GPUs, no overheads: pure work
    assert bench.compare(real, sim, jct, 0.15) is False  # real run 1 took 16 s: 10/16 is out of tolerance
    # Registered 3.5 s after its submission, in the round of the tick at 3 s (ticks at multiples of 3 s):
    # started then, and its JCT still counts from its submission.
    _, jct = bench.simulate(real, Overheads(start=0.0, suspend=0.0, resume=0.0), {"1": 3.5}, {"1": 0.0})
    assert jct["1"] == pytest.approx(13.0)
    # Replayed: job 1's first start-up costs what it cost live (4 s), whatever the model says (0 s).
    _, jct = bench.simulate(real, Overheads(start=0.0, suspend=0.0, resume=0.0), replay={"1": [4.0]})
    assert jct["1"] == pytest.approx(14.0)
    # ... and its exit too (1.5 s from its last sample to its GPUs being free).
    _, jct = bench.simulate(real, Overheads(start=0.0, suspend=0.0, resume=0.0), exits={"1": 1.5})
    assert jct["1"] == pytest.approx(11.5)


def test_round_times_count_from_the_rounds_tick(bench: ModuleType) -> None:
    """A round's decisions run in waves: each is done some time after the tick that began the round."""
    acted = [(30.2, 30.8), (30.9, 32.5), (45.1, 45.4), (31.0, 31.6)]  # the 4th: in the first round's waves
    assert bench.round_times(acted, 3.0) == pytest.approx([0.8, 2.5, 0.4, 1.6])
    # A wave that begins a few ms after the last one's outcome is the same round (not the tick at 33).
    waves = [(90.1, 90.9), (90.92, 94.4), (94.45, 95.1)]
    assert bench.round_times(waves, 3.0) == pytest.approx([0.9, 4.4, 5.1])
    # The controller's round log says which round each decision belongs to, whatever the gaps.
    assert bench.round_times([(90.1, 90.9), (92.0, 92.5), (96.2, 96.4)], 3.0, [90.05, 96.1]) == pytest.approx(
        [0.9, 2.5, 0.4]
    )


def test_first_divergence_names_the_round_and_what_each_side_saw(bench: ModuleType) -> None:
    t0 = 1000.0

    def rnd(at: float, jobs: list[tuple[str, str, float]], decided: list[tuple[str, str]]) -> dict[str, Any]:
        return {
            "at": at,
            "jobs": [{"job": j, "state": st, "gpus": "", "service": svc, "slice_start": None, "left_s": None,
                      "held_indices": []} for j, st, svc in jobs],
            "decisions": [{"job": j, "action": a, "gpus": "", "reason": ""} for j, a in decided],
        }

    real = [rnd(t0 + 30.04, [("1", "running", 30.0)], []), rnd(t0 + 60.1, [("1", "running", 60.0)], [("1", "suspend")])]
    sim = [rnd(30.0, [("1", "running", 30.0)], []), rnd(60.0, [("1", "running", 60.2)], [("1", "suspend")])]
    assert bench.first_divergence(real, sim, t0, 3.0) is None  # the same decisions, round by round
    sim[1] = rnd(60.0, [("1", "running", 52.0)], [])
    got = bench.first_divergence(real, sim, t0, 3.0)
    assert got is not None and got.splitlines()[:3] == [
        "first round that differs: 60 s", "  real: suspend 1", "  sim:  nothing"
    ]
    assert "job 1 (real vs sim): service 60.0 vs 52.0" in got
    sim[1] = rnd(60.0, [("1", "running", 60.0), ("2", "running", 1.0)], [])
    got = bench.first_divergence(real, sim, t0, 3.0)
    assert got is not None and "job 2: the simulator sees it running, the real run does not" in got


def test_replayed_start_up_counts_from_the_rounds_tick(bench: ModuleType) -> None:
    """A replayed start-up was measured from its round's tick, waiting for the GPUs' previous job to
    checkpoint included: the simulator does not add that wait again (it did: 0.6 s later, a tick late)."""
    from types import SimpleNamespace

    from slurm_gandiva.model import GpuRef, Placement
    from slurm_gandiva.plan import Action, Decision

    d = Decision(Action.START, "9", Placement((GpuRef("n2", 1),)), "time-slice")
    stub = SimpleNamespace(_measured=lambda kind, table, job_id: 9.58, replay={"9": [9.58]})
    begins = bench.WorkloadSimulator.training_begins
    assert begins(stub, d, 1, 0.0, 90.0, 90.6) == pytest.approx(99.58)  # not 90.6 + 9.58
    assert begins(stub, d, 1, 0.0, 90.0, 100.5) == pytest.approx(100.5)  # never before its GPUs are free
