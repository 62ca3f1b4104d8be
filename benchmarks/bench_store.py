"""Store write/read costs on SQLite, beside a raw-sqlite3 baseline doing the same work.

What a controller tick costs in the store: per decision it records an intent, two protocol steps, the
outcome, closes one slice and opens another (6 short transactions, each committed on its own). The
baseline does the same rows with raw sqlite3 and SQLite's default rollback journal, one transaction per
write. Also: reading N slices back (sacct) vs a raw SELECT.

Usage: .venv/bin/python benchmarks/bench_store.py [--jobs 12] [--ticks 20] [--slices 5000]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gandiva.model import GpuRef, JobSpec, Placement
from slurm_gandiva.plan import Action
from slurm_gandiva.report.sacct import parse_format, render_table
from slurm_gandiva.store import Outcome, SliceEnd, Store


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def store_ticks(db: Path, jobs: int, ticks: int) -> float:
    with Store(db) as s:
        for j in range(jobs):
            s.upsert_job(JobSpec(str(j), "u", 1, 1, 0.0), at=0.0)
            s.open_slice(str(j), Placement((GpuRef("n1", j % 8),)), 0.0)

        def run() -> None:
            for t in range(1, ticks + 1):
                for j in range(jobs):
                    p = Placement((GpuRef("n1", (j + t) % 8),))
                    d = s.record_intent(str(j), Action.MIGRATE, p, "bench", float(t))
                    s.record_step(d, "signal", float(t), float(t))
                    s.record_step(d, "release", float(t), float(t))
                    s.record_outcome(d, Outcome.SUCCEEDED, "", float(t))
                    s.close_slice(str(j), float(t), SliceEnd.MIGRATE)
                    s.open_slice(str(j), p, float(t))

        return _timed(run)


def raw_ticks(db: Path, jobs: int, ticks: int) -> float:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(
        "CREATE TABLE d (id INTEGER PRIMARY KEY, job TEXT, action TEXT, gpus TEXT, reason TEXT, at REAL,"
        " outcome TEXT, oat REAL, detail TEXT);"
        "CREATE TABLE st (id INTEGER PRIMARY KEY, d INTEGER, step TEXT, s REAL, e REAL);"
        "CREATE TABLE sl (id INTEGER PRIMARY KEY, job TEXT, seq INTEGER, gpus TEXT, s REAL, e REAL, why TEXT);"
        "CREATE INDEX sl_job ON sl (job, e);"
    )
    for j in range(jobs):
        conn.execute("INSERT INTO sl (job, seq, gpus, s) VALUES (?, 1, ?, 0)", (str(j), f"n1:{j % 8}"))

    def one(sql: str, args: tuple[object, ...]) -> int:
        conn.execute("BEGIN")
        cur = conn.execute(sql, args)
        conn.execute("COMMIT")
        return int(cur.lastrowid or 0)

    def run() -> None:
        for t in range(1, ticks + 1):
            for j in range(jobs):
                g = f"n1:{(j + t) % 8}"
                d = one(
                    "INSERT INTO d (job, action, gpus, reason, at, detail) VALUES (?,?,?,?,?,'')",
                    (str(j), "migrate", g, "b", t),
                )
                one("INSERT INTO st (d, step, s, e) VALUES (?,?,?,?)", (d, "signal", t, t))
                one("INSERT INTO st (d, step, s, e) VALUES (?,?,?,?)", (d, "release", t, t))
                one("UPDATE d SET outcome='succeeded', oat=? WHERE id=?", (t, d))
                one("UPDATE sl SET e=?, why='migrate' WHERE job=? AND e IS NULL", (t, str(j)))
                one("INSERT INTO sl (job, seq, gpus, s) VALUES (?, ?, ?, ?)", (str(j), t + 1, g, t))

    try:
        return _timed(run)
    finally:
        conn.close()


def read_slices(db: Path, n: int) -> tuple[float, float, float]:
    with Store(db) as s:
        s.upsert_job(JobSpec("1", "u", 1, 1, 0.0), at=0.0)
        for i in range(n):
            s.open_slice("1", Placement((GpuRef("n1", i % 8),)), float(i))
            s.close_slice("1", float(i) + 0.5, SliceEnd.QUANTUM)
        got: list[object] = []
        t_store = _timed(lambda: got.extend(s.slices()))
        t_render = _timed(lambda: render_table(s.slices(), parse_format(None), float(n)))
    conn = sqlite3.connect(db)
    t_raw = _timed(lambda: conn.execute("SELECT * FROM slices JOIN jobs ON jobs.id = slices.job_id").fetchall())
    conn.close()
    assert len(got) == n
    return t_store, t_raw, t_render


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--slices", type=int, default=5000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        writes = a.jobs * a.ticks * 6
        ts = store_ticks(Path(d) / "store.db", a.jobs, a.ticks)
        tr = raw_ticks(Path(d) / "raw.db", a.jobs, a.ticks)
        rs, rr, rend = read_slices(Path(d) / "read.db", a.slices)
    rows = [
        (f"per write (ms), {writes} writes", 1e3 * ts / writes, 1e3 * tr / writes, "{:.3f}"),
        (f"per tick of {a.jobs} decisions (ms)", 1e3 * ts / a.ticks, 1e3 * tr / a.ticks, "{:.1f}"),
        (f"read {a.slices} slices (ms)", 1e3 * rs, 1e3 * rr, "{:.1f}"),
    ]
    print(f"{'measure':<44} {'Store (WAL)':>14} {'raw sqlite3':>14} {'ratio':>7}")
    print("-" * 82)
    for name, ours, base, fmt in rows:
        print(f"{name:<44} {fmt.format(ours):>14} {fmt.format(base):>14} {ours / base:>7.2f}")
    print(f"{f'sacct table of {a.slices} slices (ms, incl. read)':<44} {1e3 * rend:>14.1f} {'-':>14} {'-':>7}")


if __name__ == "__main__":
    main()
