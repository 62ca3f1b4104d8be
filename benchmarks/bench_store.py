"""Store write/read costs on SQLite, beside a raw-sqlite3 baseline doing the same work.

What a controller tick costs in the store: per decision it records an intent, two protocol steps, the
outcome, closes one slice and opens another (6 short transactions, each committed on its own). The
baseline does the same rows with raw sqlite3 and SQLite's default rollback journal, one transaction per
write. Also: reading N slices back (sacct) vs a raw SELECT.

A second table: a steady controller round's store reads (nothing to do) for 100 / 1,000 / 10,000 managed
jobs (a quarter running on an open slice, the rest suspended after one slice; two measured rates each),
one query per job and kind of record as the controller did before issue 18 (`get_job` in reconcile and in
observe, `current_slice`, `rates`) against the batched reads (`jobs_by_id`, `open_slices`, `rates_by_job`).
A third: the whole store side of the round, the reconciler's `settle` plus `Controller.observe` on a fake
Slurm snapshot (no Slurm; progress files not read), with this checkout's code and, given
`--baseline-src DIR` (a checkout of an earlier commit, e.g. `git worktree add DIR COMMIT`), with that code
in a subprocess on an identical store.

Usage: .venv/bin/python benchmarks/bench_store.py [--jobs 12] [--ticks 20] [--slices 5000]
           [--managed 100,1000,10000] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from slurm_gandiva.model import GpuRef, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action
from slurm_gandiva.report.sacct import parse_format, render_table
from slurm_gandiva.slurm.base import HoldKind, SlurmJob, SlurmNode, Snapshot
from slurm_gandiva.store import Outcome, SliceEnd, Store
from slurm_gandiva.store.models import JobRow, RateRow, SliceRow


def _timed(fn: Callable[[], object]) -> float:
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


GPUS_PER_NODE = 8
ACTIVE = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED)


def _placement(i: int) -> Placement:
    """Running job i's GPU (every 4th job runs, one GPU each)."""
    k = i // 4
    return Placement((GpuRef(f"n{k // GPUS_PER_NODE}", k % GPUS_PER_NODE),))


def managed_store(db: Path, n: int, now: float) -> Store:
    """A store as the controller would have it with `n` registered jobs, written in bulk (one transaction
    per table; the controller's own writes would take minutes): every 4th job RUNNING on an open slice,
    the others SUSPENDED after one closed slice; two measured rates per job."""
    store = Store(db)
    jobs, slices, rates = [], [], []
    for i in range(n):
        jid, running = str(1000 + i), i % 4 == 0
        jobs.append({
            "id": jid, "user": f"u{i % 20}", "name": f"job{jid}", "min_gpus": 1, "max_gpus": 1,
            "submit_time": now - 3600 + i * 0.01, "state": (JobState.RUNNING if running else JobState.SUSPENDED).value,
            "total_work": 1e9, "model": "", "partition": "gpu", "state_dir": "", "created": now - 3600,
            "updated": now - 60, "suspend_signal": "",
        })
        p = _placement(i) if running else Placement((GpuRef("n0", 0),))
        slices.append({
            "job_id": jid, "seq": 1, "nodes": ",".join(p.nodes), "gpus": ",".join(str(g) for g in p.gpus),
            "shared": False, "start_time": now - 600, "end_time": None if running else now - 300,
            "end_reason": None if running else SliceEnd.QUANTUM.value,
        })
        for k in range(2):
            rates.append({"job_id": jid, "gpus": 1, "locality": 0, "rate": 100.0 + k, "at": now - 500 + 30 * k})
    with store.engine.begin() as conn:
        conn.execute(sa.insert(JobRow), jobs)
        conn.execute(sa.insert(SliceRow), slices)
        conn.execute(sa.insert(RateRow), rates)
    return store


def managed_snapshot(n: int, now: float) -> Snapshot:
    """Slurm's view of the same jobs: running ones on their slice's GPU, the others admin-held."""
    jobs = []
    for i in range(n):
        jid, running = str(1000 + i), i % 4 == 0
        p = _placement(i)
        jobs.append(SlurmJob(
            job_id=jid, name=f"job{jid}", user=f"u{i % 20}", state="RUNNING" if running else "PENDING",
            reason="None" if running else "JobHeldAdmin", hold=HoldKind.NONE if running else HoldKind.ADMIN,
            nodes=p.nodes if running else (), gpus={p.nodes[0]: (p.gpus[0].index,)} if running else {},
            restart_count=0 if running else 1, comment="gandiva", partition="gpu",
            submit_time=now - 3600 + i * 0.01, start_time=now - 600 if running else 0.0,
            tres_per_node="gres:gpu:1",
        ))
    gres = ",".join(f"gpu:g{k}:1" for k in range(GPUS_PER_NODE))
    nodes = tuple(SlurmNode(f"n{k}", "MIXED", ("gpu",), gres, "") for k in range(_nodes(n)))
    return Snapshot(tuple(jobs), nodes, now)


def _nodes(n: int) -> int:
    return max(1, -(-((n + 3) // 4) // GPUS_PER_NODE))


def per_job_reads(store: Store, ids: list[str]) -> None:
    """The reads of a steady round before issue 18: four queries per job, two of them batched."""
    for jid in ids:
        store.get_job(jid)
        store.current_slice(jid)
    store.list_jobs(states=ACTIVE)
    found = [jid for jid in ids if store.get_job(jid) is not None]
    for jid in found:
        store.rates(jid)
    store.slices(job_ids=found)


def batched_reads(store: Store, ids: list[str]) -> None:
    """The same reads, one query per kind of record."""
    store.open_slices(store.jobs_by_id(ids))
    store.list_jobs(states=ACTIVE)
    found = list(store.jobs_by_id(ids))
    store.rates_by_job(found)
    store.slices(job_ids=found)


def _best(fn: Callable[[], None], repeats: int) -> float:
    return min(_timed(fn) for _ in range(repeats))


def _repeats(n: int) -> int:
    return 5 if n <= 1000 else 2


def store_reads(n: int) -> tuple[float, float]:
    now = time.time()
    with tempfile.TemporaryDirectory() as d:
        store = managed_store(Path(d) / "reads.db", n, now)
        ids = [str(1000 + i) for i in range(n)]
        try:
            before = _best(lambda: per_job_reads(store, ids), 1 if n > 1000 else _repeats(n))
            after = _best(lambda: batched_reads(store, ids), _repeats(n))
        finally:
            store.close()
    return before, after


class _Slurm:
    """Just enough of a Slurm backend for a steady round: a fixed snapshot; nothing to hold."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def snapshot(self) -> Snapshot:
        return self.snap

    def capabilities(self) -> Any:
        from slurm_gandiva.slurm.capabilities import SlurmCapabilities

        return SlurmCapabilities.for_release((24, 11, 0))

    def hold(self, job_id: str) -> None:
        raise AssertionError(f"a steady round holds nothing (job {job_id})")


class _NoPolicy:
    name = "none"


def round_store_side(n: int) -> float:
    """Seconds of the best steady round's settle + observe with `n` managed jobs (this process's code)."""
    from slurm_gandiva.config import ControllerConfig
    from slurm_gandiva.controller.service import Controller

    now = time.time()
    with tempfile.TemporaryDirectory() as d:
        store = managed_store(Path(d) / "round.db", n, now)
        snap = managed_snapshot(n, now)
        ctl = Controller(
            ControllerConfig(state_dir=Path(d), partitions=("gpu",)), _Slurm(snap), store,  # type: ignore[arg-type]
            clock=lambda: now, policy=_NoPolicy(), protocol=object(),  # type: ignore[arg-type]
            topology=Topology.uniform(_nodes(n), GPUS_PER_NODE), progress_reader=lambda _p, _u: None,
        )

        def one() -> None:
            found = ctl.reconciler.settle(snap)
            assert not found, found[:3]
            view = ctl.observe(snap).view
            assert len(view.jobs) == n and len(view.running) == (n + 3) // 4

        try:
            return _best(one, _repeats(n))
        finally:
            store.close()


def _baseline(src: Path, sizes: list[int]) -> dict[int, float]:
    """`round_store_side` with the code checked out at `src`, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    out = subprocess.run(
        [sys.executable, __file__, "--round-only", "--managed", ",".join(map(str, sizes))],
        env=env, check=True, capture_output=True, text=True, cwd=src,
    ).stdout
    return {int(k): v for k, v in json.loads(out.splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--slices", type=int, default=5000)
    ap.add_argument("--managed", default="100,1000,10000", help="managed-job counts of the round tables")
    ap.add_argument("--baseline-src", type=Path, help="a checkout whose round to time beside this one's")
    ap.add_argument("--round-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(x) for x in a.managed.split(",") if x]
    if a.round_only:  # the baseline's subprocess: its round times as one JSON line
        print(json.dumps({n: round_store_side(n) for n in sizes}))
        return
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

    print()
    print(f"{'steady round, store reads (ms)':<44} {'per job':>14} {'batched':>14} {'ratio':>7}")
    print("-" * 82)
    for n in sizes:
        before, after = store_reads(n)
        print(f"{f'{n:,} managed jobs':<44} {1e3 * before:>14.1f} {1e3 * after:>14.1f} {after / before:>7.3f}")
    base = _baseline(a.baseline_src, sizes) if a.baseline_src is not None else {}
    print()
    if base:
        rev = subprocess.run(["git", "-C", str(a.baseline_src), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        print(f"baseline: the code of {rev or a.baseline_src}")
    print(f"{'steady round, settle + observe (ms)':<44} {'baseline':>14} {'this code':>14} {'ratio':>7}")
    print("-" * 82)
    for n in sizes:
        ours = round_store_side(n)
        b = base.get(n)
        bt, ratio = (f"{1e3 * b:.1f}", f"{ours / b:.3f}") if b else ("-", "-")
        print(f"{f'{n:,} managed jobs':<44} {bt:>14} {1e3 * ours:>14.1f} {ratio:>7}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
