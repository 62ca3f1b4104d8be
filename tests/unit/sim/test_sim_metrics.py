"""Summary metrics, tables and the files `--out` writes."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from slurm_gandiva.sim.engine import JobResult, Overheads, Sample, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.metrics import Summary, format_summary, percentile, write_results
from slurm_gandiva.sim.trace import Trace, TraceJob
from tests.unit.sim.sim_toy_policies import ToyFifo


def job(i: int, submit: float, start: float | None, finish: float | None, **kw: int) -> JobResult:
    return JobResult(
        job_id=f"j{i}",
        model="bert",
        gpus=1,
        min_gpus=1,
        max_gpus=1,
        submit=submit,
        first_start=start,
        finish=finish,
        first_feedback=None if start is None else start + 1,
        suspends=kw.get("suspends", 0),
        migrations=kw.get("migrations", 0),
        resizes=kw.get("resizes", 0),
        packs=0,
        gpu_seconds=0.0 if start is None or finish is None else finish - start,
        overhead_seconds=0.0,
    )


def result(jobs: tuple[JobResult, ...], policy: str = "p", samples: tuple[Sample, ...] = ()) -> SimResult:
    return SimResult(policy, "t", 2, False, Overheads(), jobs, samples, 100.0, 1, 1)


def test_percentile_matches_numpy_linear() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 99) == pytest.approx(4 + 0.96 * 6)
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_summary_figures() -> None:
    jobs = (
        job(0, 0, 0, 10, suspends=2),
        job(1, 0, 10, 30, migrations=1),
        job(2, 5, 30, 65, resizes=3),
        job(3, 50, None, None),
    )
    samples = (Sample(0, 1, 1, 1), Sample(10, 2, 2, 0), Sample(30, 1, 1, 0), Sample(65, 0, 0, 0))
    s = Summary.of(result(jobs, samples=samples))
    assert (s.jobs, s.finished) == (4, 3)
    assert s.avg_jct == pytest.approx((10 + 30 + 60) / 3)
    assert s.median_jct == 30
    assert s.avg_queueing == pytest.approx((0 + 10 + 25) / 3)
    assert s.avg_time_to_feedback == pytest.approx((1 + 11 + 26) / 3)
    assert s.makespan == 65
    assert s.gpu_utilisation == pytest.approx((1 * 10 + 2 * 20 + 1 * 35) / (2 * 65))
    assert (s.suspends_per_job, s.migrations_per_job, s.resizes_per_job) == (0.5, 0.25, 0.75)


def test_format_summary_shows_ratios_to_baseline() -> None:
    a = Summary.of(result((job(0, 0, 0, 3600),), "fifo"))
    b = Summary.of(result((job(0, 0, 0, 1800),), "default"))
    text = format_summary([a, b], "default")
    lines = text.splitlines()
    assert lines[0].split()[0] == "policy"
    fifo_line = next(line for line in lines if line.startswith("fifo"))
    assert "1.00 (2.00x)" in fifo_line
    assert "(" not in next(line for line in lines if line.startswith("default"))


def test_write_results_and_plots(tmp_path: Path) -> None:
    tr = Trace("t", (TraceJob("a", 0, 100, 1, "cifar10"), TraceJob("b", 10, 50, 1, "cifar10")))
    res = Simulator(tr, ToyFifo(), SimConfig(nodes=1, gpus_per_node=1)).run()
    paths = write_results(res, tmp_path / "out")
    summary = json.loads(paths[0].read_text())
    assert summary["summary"]["finished"] == 2
    assert summary["summary"]["avg_jct"] == pytest.approx(120.0)
    assert summary["summary"]["gpu_utilisation"] == pytest.approx(1.0)  # the one GPU was never idle
    assert summary["summary"]["makespan"] == pytest.approx(150.0)
    with paths[1].open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["job_id"] for r in rows] == ["a", "b"]
    assert float(rows[1]["jct"]) == pytest.approx(140.0)
    with paths[2].open() as fh:
        assert next(csv.reader(fh)) == ["time", "gpus_busy", "running", "waiting"]

    from slurm_gandiva.sim.plots import plot_jct_cdf, plot_timeline

    for p in (plot_jct_cdf([res], tmp_path / "cdf.png"), plot_timeline(res, tmp_path / "tl.png")):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
