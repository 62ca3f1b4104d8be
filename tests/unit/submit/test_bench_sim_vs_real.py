"""The sim-vs-real benchmark's pure parts, on a hand-made real run (no Slurm)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
    assert prof.throughput((1,)) == pytest.approx(100.0)
    assert prof.throughput((2,)) == pytest.approx(150.0)
    assert prof.throughput((3,)) == pytest.approx(175.0)  # between 2 and 4
    assert prof.throughput((4,)) == pytest.approx(200.0)
    assert prof.throughput((4, 4)) == pytest.approx(200.0)  # spreading never pays


def test_slice_dead_time_uses_jobs_on_one_count(bench: ModuleType) -> None:
    dead, n = bench.slice_dead_time(_real(), bench.speed_profile(_real()))
    assert n == 2  # job 3 changed its GPU count (and has an open slice)
    assert dead == pytest.approx(3.5)  # median of 5 and 2


def test_simulation_runs_the_same_jobs(bench: ModuleType) -> None:
    from slurm_gandiva.sim.engine import Overheads

    sim = bench.simulate(_real(), Overheads(start=0.0, suspend=0.0, resume=0.0))
    by = {j.job_id: j for j in sim.jobs}
    assert set(by) == {"1", "2", "3"}
    assert (by["2"].min_gpus, by["2"].max_gpus, by["3"].min_gpus, by["3"].max_gpus) == (2, 2, 1, 4)
    assert by["1"].jct == pytest.approx(10.0)  # FIFO, free GPUs, no overheads: pure work
    assert bench.compare(_real(), sim, 0.15) is False  # real run 1 took 16 s: 10/16 is out of tolerance
