"""Gantt layout (pure), PNG rendering, and the JCT summary."""

from __future__ import annotations

from pathlib import Path

from slurm_gandiva.model import GpuRef, JobSpec, JobState, Placement, Topology
from slurm_gandiva.report.gantt import draw_gantt, jct_summary, layout, render_jct
from slurm_gandiva.store import JobRecord, SliceEnd, SliceRecord

G = GpuRef
SLICES = (
    SliceRecord(1, "1", "a", 1, Placement((G("n1", 0), G("n1", 2))), 100.0, 160.0, SliceEnd.MIGRATE),
    SliceRecord(2, "1", "a", 2, Placement((G("n1", 0), G("n1", 1))), 165.0, 300.0, SliceEnd.DONE),
    SliceRecord(3, "2", "b", 1, Placement((G("n2", 0),), shared=True), 110.0, 170.0, SliceEnd.QUANTUM),
    SliceRecord(4, "3", "b", 1, Placement((G("n2", 0),), shared=True), 120.0, None, None),
    SliceRecord(5, "2", "b", 2, Placement((G("n2", 0),), shared=True), 200.0, 260.0, SliceEnd.DONE),
)


def test_layout_rows_bars_lanes_and_markers() -> None:
    lay = layout(SLICES, now=400.0)
    assert lay.rows == (G("n1", 0), G("n1", 1), G("n1", 2), G("n2", 0))
    assert lay.jobs == ("1", "2", "3")
    assert len(lay.bars) == 2 + 2 + 1 + 1 + 1
    assert (lay.t0, lay.t1) == (100.0, 400.0)  # the open slice runs to now
    shared = {(b.job_id, b.start): b.lane for b in lay.bars if b.shared}
    # job 3 overlaps job 2's first slice -> other lane; job 2's second slice reuses lane 0
    assert shared == {("2", 110.0): 0, ("3", 120.0): 1, ("2", 200.0): 0}
    assert sorted((m.job_id, m.gpu, m.reason) for m in lay.markers) == [
        ("1", G("n1", 0), SliceEnd.MIGRATE),
        ("1", G("n1", 2), SliceEnd.MIGRATE),
        ("2", G("n2", 0), SliceEnd.QUANTUM),
    ]


def test_layout_with_topology_shows_idle_gpus() -> None:
    lay = layout(SLICES[:1], now=200.0, topology=Topology.uniform(2, 2))
    assert set(lay.rows) == {G("n1", 0), G("n1", 1), G("n1", 2), G("n2", 0), G("n2", 1)}


def test_draw_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "g.png"
    draw_gantt(layout(SLICES, now=400.0), out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000


def test_draw_empty_history(tmp_path: Path) -> None:
    out = tmp_path / "e.png"
    draw_gantt(layout((), now=5.0), out)
    assert out.read_bytes()[:4] == b"\x89PNG"


def _rec(job_id: str, state: JobState, submit: float) -> JobRecord:
    return JobRecord(JobSpec(job_id, "a", 1, 2, submit), state, "", "", submit, submit)


def test_jct_summary() -> None:
    jobs = [_rec("1", JobState.DONE, 90.0), _rec("2", JobState.DONE, 100.0), _rec("3", JobState.RUNNING, 100.0)]
    summary = jct_summary(jobs, SLICES, now=400.0)
    by_id = {j.job_id: j for j in summary.jobs}
    assert by_id["1"].jct == 210.0 and by_id["1"].queueing == 10.0 and by_id["1"].slices == 2
    assert by_id["1"].gpu_seconds == 60 * 2 + 135 * 2
    assert by_id["2"].jct == 160.0
    assert by_id["3"].jct is None and by_id["3"].gpu_seconds == 280.0
    assert summary.mean_jct == 185.0 and summary.median_jct == 185.0 and summary.max_jct == 210.0
    assert summary.makespan == 300.0 - 90.0
    text = render_jct(summary)
    assert "finished 2/3" in text and "mean JCT 185.0 s" in text
    assert len(text.splitlines()) == 2 + 3 + 1
