"""progress.json (the contract's Progress) and the reporter that writes it."""

from __future__ import annotations

import json
from pathlib import Path

from job_wrapper.progress import Counters, ProgressReporter, append_event, read_events
from slurm_gandiva.requeue.contract import Progress, read_progress, write_progress


def test_progress_round_trip_and_bad_files(tmp_path: Path) -> None:
    p = Progress(step=3, epoch=1, samples=96, total_samples=None, batch_time_avg=0.5, samples_per_s=64.0,
                 world_size=2, updated=1.5e9, state="suspended")
    path = tmp_path / "progress.json"
    write_progress(path, p)
    assert read_progress(path) == p
    assert [f.name for f in tmp_path.iterdir()] == ["progress.json"]  # no temp file left
    assert read_progress(tmp_path / "missing.json") is None
    for bad in ("{", "[]", '{"step": 1}', json.dumps({**json.loads(p.to_json()), "updated": "NaN"})):
        path.write_text(bad)
        assert read_progress(path) is None, bad
    old = json.loads(p.to_json())
    del old["state"]
    path.write_text(json.dumps(old))
    assert read_progress(path) == Progress(**{**old, "state": "running"})


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_reporter_measures_batch_time_and_rate_from_the_first_step_on(tmp_path: Path) -> None:
    clock = FakeClock()
    counters = Counters(step=10, epoch=0, samples=320, total_samples=1000)
    rep = ProgressReporter(tmp_path / "p.json", lambda: counters, world_size=2, clock=clock,
                           wall_clock=lambda: 7.0, smoothing=0.5)
    first = rep.report()  # resumed at step 10: nothing measured yet
    assert (first.step, first.batch_time_avg, first.samples_per_s, first.updated) == (10, 0.0, 0.0, 7.0)
    clock.t += 30  # start-up: the first step takes long and must not count
    counters = Counters(step=11, epoch=0, samples=352, total_samples=1000)
    assert rep.report().batch_time_avg == 0.0
    clock.t += 2.0
    counters = Counters(step=21, epoch=0, samples=672, total_samples=1000)
    r = rep.report()
    assert r.batch_time_avg == 0.2 and r.samples_per_s == 160.0
    clock.t += 1.0  # idle interval (no step): averages kept
    assert rep.report().batch_time_avg == 0.2
    clock.t += 1.0
    counters = Counters(step=26, epoch=1, samples=832, total_samples=1000)
    r = rep.report()
    assert abs(r.batch_time_avg - 0.5 * (0.2 + 2.0 / 5)) < 1e-12
    assert abs(r.samples_per_s - 0.5 * (160.0 + 160.0 / 2.0)) < 1e-9
    final = rep.stop("done")
    assert final.state == "done" and read_progress(tmp_path / "p.json") == final


def test_reporter_says_when_this_incarnation_began_training(tmp_path: Path) -> None:
    """`started` is the wall time the reporter was made (after the restore), the same in every report."""
    wall = [50.0]
    rep = ProgressReporter(tmp_path / "p.json", lambda: Counters(1, 0, 32, None), world_size=1,
                           clock=FakeClock(), wall_clock=lambda: wall[0])
    wall[0] = 58.0
    assert rep.report().started == 50.0 and rep.report().updated == 58.0
    assert read_progress(tmp_path / "p.json").started == 50.0


def test_reporter_thread_writes_periodically(tmp_path: Path) -> None:
    n = {"step": 0}
    rep = ProgressReporter(tmp_path / "p.json", lambda: Counters(n["step"], 0, n["step"], None), world_size=1,
                           interval=0.01)
    rep.start()
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        n["step"] += 1
        got = read_progress(tmp_path / "p.json")
        if got is not None and got.step >= 5:
            break
        time.sleep(0.005)
    rep.stop("suspended")
    got = read_progress(tmp_path / "p.json")
    assert got is not None and got.state == "suspended" and got.step >= 5


def test_event_log_appends_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    append_event(log, "signal", count=1, path="x")
    append_event(log, "exit", code=75)
    with log.open("a") as f:
        f.write('{"torn line')
    evs = read_events(log)
    assert [e["event"] for e in evs] == ["signal", "exit"] and evs[0]["path"] == "x" and evs[1]["code"] == 75
    assert read_events(tmp_path / "none") == []
