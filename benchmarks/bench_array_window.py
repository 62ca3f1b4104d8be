"""One user's 90,000-task `--array=0-89999%1` beside another user's 2-GPU job, without Slurm (issue 29 item 4).

Times squeue's parse of the array's one pending meta record, then controller rounds (`Controller.tick`,
gandiva policy, SQLite store, the unit tests' fake backend and protocol, 1 node x 4 GPUs) in two states:
"fresh" (the array and the other job just submitted: rounds until the other job is registered and
running) and "steady" (every task the controller will track already registered, as after the ~180
rounds registration takes when every task is tracked). Prints one table row per state: parse, build_view,
decide and round (median over the timed rounds), tracked jobs, peak RSS.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python benchmarks/bench_array_window.py [--state fresh|steady] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import slurm_gandiva.controller.observer as observer_mod
from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import ClusterView, Topology
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.slurm.parse import parse_squeue
from slurm_gandiva.store import Store
from slurm_gandiva.store.models import JobRow
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

T0 = time.time() - 3600
TIMES: dict[str, list[float]] = {"build_view": [], "decide": []}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            TIMES[name].append(time.perf_counter() - t)

    return wrapper


class Timed:
    name = "gandiva"

    def __init__(self) -> None:
        self.inner = make_policy("gandiva")

    def decide(self, view: ClusterView, now: float) -> Plan:
        return timed("decide", self.inner.decide)(view, now)  # type: ignore[no-any-return]


def squeue_doc(n: int) -> dict[str, Any]:
    meta = {
        "job_id": 42, "array_job_id": {"set": True, "number": 42}, "array_task_id": {"set": False, "number": 0},
        "array_task_string": f"0-{n - 1}%1", "array_max_tasks": {"set": True, "number": 1}, "name": "sweep",
        "user_name": "a", "job_state": ["PENDING"], "state_reason": "JobHeldAdmin",
        "priority": {"set": True, "number": 0}, "comment": "gandiva", "partition": "gpu",
        "submit_time": {"set": True, "number": int(T0)}, "tres_per_node": "gres:gpu:1",
    }
    return {"jobs": [meta], "errors": []}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=90_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--state", choices=("fresh", "steady"), default="fresh")
    args = ap.parse_args()
    doc = squeue_doc(args.tasks)
    parses = []
    for _ in range(3):
        t = time.perf_counter()
        jobs = list(parse_squeue(doc))
        parses.append(time.perf_counter() - t)
    other = sjob("90001", user="b", submit=T0 + 30, tres="gres:gpu:2")
    backend = FakeBackend([*jobs, other])
    observer_mod.build_view = timed("build_view", observer_mod.build_view)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as d:
        store = Store(f"sqlite:///{Path(d) / 'g.db'}")
        if args.state == "steady":
            # What the controller tracks of the array, registered: every task where all are tracked.
            from slurm_gandiva.controller.reconcile import ManagedJobs

            tracked = ManagedJobs(("gpu",)).of(backend.snapshot())
            rows = [{"id": jid, "user": "a", "name": "sweep", "min_gpus": 1, "max_gpus": 1, "submit_time": T0,
                     "state": "queued", "total_work": None, "model": "", "partition": "gpu", "state_dir": "",
                     "created": T0, "updated": T0, "suspend_signal": ""} for jid in tracked if jid != "90001"]
            with store.engine.begin() as conn:
                conn.execute(sa.insert(JobRow), rows)
        cfg = parse_config(f"state_dir = {d}\ntick = 5\nquantum = 60\n")
        ctl = Controller(cfg, backend, store, policy=Timed(), protocol=FakeProtocol(backend),
                         topology=Topology.uniform(1, 4, gpus_per_switch=2, sockets=2),
                         progress_reader=lambda _p, _u: None)
        registered = running = None
        rounds: list[float] = []
        tracked_n = 0
        for r in range(1, args.rounds + 1):
            t = time.perf_counter()
            rep = ctl.tick()
            rounds.append(time.perf_counter() - t)
            assert not rep.error, rep.error
            tracked_n = len(rep.view.jobs) if rep.view is not None else 0
            if registered is None and store.get_job("90001") is not None:
                registered = r
            if running is None and backend.job("90001").running:
                running = r
        store.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    med = statistics.median
    print(f"{args.state:6}  parse {med(parses):6.3f} s  build_view {med(TIMES['build_view']):6.3f} s  "
          f"decide {med(TIMES['decide']):6.3f} s  round {med(rounds):6.3f} s (max {max(rounds):.3f})  "
          f"tracked {tracked_n:6d}  peak RSS {rss:6.0f} MB  other job registered in round {registered}, "
          f"running in round {running}")


if __name__ == "__main__":
    main()
