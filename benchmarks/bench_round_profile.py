"""One ordinary controller round at 10,000 managed jobs, without Slurm: timed and profiled with cProfile.

The round is `Controller.tick()` with the production policy (gandiva, quantum 60 s, tick 5 s) on a
SQLite store and a fake backend that answers as bench_controller_scale's devcluster does in a steady
round: 2 nodes x 4 GPUs, the jobs as three job arrays (100, 900 and the rest, as that bench submits
them), 8 tasks running on an open slice, `--suspended` more suspended after one slice, every other task
waiting never run (admin-held). The clock stands still 20 s into the running slices, so no quantum
ends and the round has no action (the plan must be empty). The backend is a real `CliBackend` whose
commands are answered from memory (its `squeue -O` fingerprint listing and `sinfo --json`), so its
snapshot's own work (parsing the listing, building the jobs) is in the round; what the real commands
cost (their processes, slurmctld) is not.

Prints the median and max of `--rounds` rounds (after one warm-up round that fills the controller's and
the backend's memories), wall and this process's CPU time (on a loaded machine the CPU time is the
steadier figure), then, with `--profile N`, cProfile's top N functions by cumulative and by own
time over the same rounds.

With `--fairness shares` the controller runs the fair-share layer (issue 30) and each array is split into
`--tenants` arrays, one per account t1..tN (equal shares, as `sacctmgr` lists them), as
bench_controller_scale.py --fairness shares submits them, each account running its share of the 8 GPUs
(so the ordinary round still acts on nothing).

Run: .venv/bin/python benchmarks/bench_round_profile.py [--jobs 10000] [--rounds 10] [--profile 30]
         [--fairness shares [--tenants 4]]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from slurm_gandiva.config import ControllerConfig
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import JobState, Topology
from slurm_gandiva.requeue.contract import Progress
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.slurm.cli_backend import _FINGERPRINT, CliBackend
from slurm_gandiva.store import SliceEnd, Store
from slurm_gandiva.store.models import JobRow, RateRow, SliceRow

NODES, GPUS = 2, 4
ARRAYS = (100, 900)  # then the rest, as bench_controller_scale submits 100, 1,000, 10,000
FIRST_ID = 1000


def tasks_of(n: int, tenants: int = 0) -> list[tuple[str, int, int]]:
    """(array id, task, record id) of `n` tasks; a task that never ran shares its array's record. With
    `tenants`, each array is that many (the first takes what the division leaves), one per account."""
    sizes = [s for s in ARRAYS if s < n]
    sizes = [*sizes, n - sum(sizes)] if n > sum(sizes) else [n]
    if tenants:
        sizes = [p for s in sizes for i in range(tenants) if (p := s // tenants + (s % tenants if i == 0 else 0))]
    out: list[tuple[str, int, int]] = []
    base = FIRST_ID
    for size in sizes:
        out.extend((str(base), t, base) for t in range(size))
        base += 1
    return out


def account_of(array: str, tenants: int) -> str:
    """The account of an array of `tasks_of(n, tenants)` ("" without tenants)."""
    return f"t{(int(array) - FIRST_ID) % tenants + 1}" if tenants else ""


def sacctmgr_listing(tenants: int) -> str:
    """`sacctmgr -nP show assoc format=ASSOC_FORMAT` of accounts t1 .. tN, 1 share each, root in each."""
    rows = ["root|||1|", "root|root|root|1|"]
    for i in range(tenants):
        rows += [f"t{i + 1}||root|1|", f"t{i + 1}|root|t{i + 1}|1|"]
    return "\n".join(rows) + "\n"


class FakeSlurm:
    """The devcluster's answers to CliBackend's commands: job records and their fingerprint lines."""

    def __init__(self, n: int, suspended: int, now: float, tenants: int = 0) -> None:
        self.tenants = tenants
        self.records: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.running: dict[str, tuple[str, int]] = {}  # job id -> its node and GPU
        self.suspended: set[str] = set()
        next_id = FIRST_ID + 100
        per = NODES * GPUS // max(1, tenants)  # running tasks per account: each at its share, no rebalancing
        held: dict[str, int] = {}
        for array, task, rid in tasks_of(n, tenants):
            jid = f"{array}_{task}"
            acct = account_of(array, tenants)
            if len(self.running) < NODES * GPUS and held.get(acct, 0) < per:
                held[acct] = held.get(acct, 0) + 1
                k = len(self.running)
                node, gpu = f"n{k // GPUS + 1}", k % GPUS
                self.running[jid] = (node, gpu)
                rid, next_id = next_id, next_id + 1
                self._task(rid, array, task, "RUNNING", "None", now, node=node, gpu=gpu)
            elif len(self.suspended) < suspended:
                self.suspended.add(jid)
                rid, next_id = next_id, next_id + 1
                self._task(rid, array, task, "PENDING", "JobHeldAdmin", now, restarts=1)
            else:
                self._line(rid, array, task, "PENDING", "JobHeldAdmin", now, 0, "", "")
        for array in {a for a, _t, _r in tasks_of(n, tenants)}:  # the array's own record: its never-run tasks
            waiting = [t for a, t, r in tasks_of(n, tenants) if a == array and f"{a}_{t}" not in self.running
                       and f"{a}_{t}" not in self.suspended]
            if waiting:
                self.records.append(self._record(int(array), array, None, "PENDING", "JobHeldAdmin", now,
                                                 task_string=_ranges(waiting)))

    def _record(self, rid: int, array: str, task: int | None, state: str, reason: str, now: float, *,
                restarts: int = 0, node: str = "", gpu: int = -1, task_string: str = "") -> dict[str, Any]:
        rec: dict[str, Any] = {
            "job_id": rid, "array_job_id": {"set": True, "number": int(array)},
            "array_task_id": {"set": task is not None, "number": task if task is not None else 0},
            "array_task_string": task_string, "name": "scale_job", "user_name": "root",
            "job_state": [state], "state_reason": reason, "hold": reason == "JobHeldAdmin",
            "priority": {"set": True, "number": 0 if reason == "JobHeldAdmin" else 1},
            "comment": "gandiva", "partition": "gpu", "restart_cnt": restarts,
            "submit_time": {"set": True, "number": int(now - 3600)},
            "start_time": {"set": True, "number": int(now - 20) if state == "RUNNING" else 0},
            "tres_per_node": "gres/gpu:1", "nodes": node, "account": account_of(array, self.tenants),
        }
        if node:
            rec["gres_detail"] = [f"gpu:g{gpu}:1(IDX:{gpu})"]
        return rec

    def _task(self, rid: int, array: str, task: int, state: str, reason: str, now: float, *,
              restarts: int = 0, node: str = "", gpu: int = -1) -> None:
        self.records.append(self._record(rid, array, task, state, reason, now, restarts=restarts, node=node,
                                         gpu=gpu))
        self._line(rid, array, task, state, reason, now, restarts, node, "" if gpu < 0 else f"gres/gpu:g{gpu}:1")

    def _line(self, rid: int, array: str, task: int, state: str, reason: str, now: float, restarts: int,
              node: str, tres: str) -> None:
        values = {
            "JobID": str(rid), "ArrayJobID": array, "ArrayTaskID": str(task), "State": state, "Reason": reason,
            "UserName": "root", "Partition": "gpu", "SubmitTime": "2026-11-25T14:08:00",
            "StartTime": "2026-11-25T15:07:40" if node else "N/A", "EndTime": "N/A", "RestartCnt": str(restarts),
            "NodeList": node, "ReqNodes": "", "tres-per-node": tres or "gres/gpu:1", "exit_code": "0:0",
        }
        self.lines.append("|".join(values[f] for f in _FINGERPRINT) + "|")

    def run(self, argv: Sequence[str], what: str, **_kw: Any) -> str:
        if argv[0] == "sacctmgr":
            return sacctmgr_listing(self.tenants) if "associations" in argv else "normal||\n"
        if argv[0] == "sinfo":
            gres = ",".join(f"gpu:g{g}:1" for g in range(GPUS))
            nodes = [{"hostname": f"n{k}", "name": f"n{k}", "state": ["MIXED"], "partitions": ["gpu"],
                      "gres": gres, "gres_used": gres, "cpus": 8, "sockets": 2} for k in range(1, NODES + 1)]
            return json.dumps({"nodes": nodes, "errors": []})
        if any(a.startswith("--Format=") for a in argv):
            return "\n".join(self.lines) + "\n"
        return json.dumps({"jobs": self.records, "errors": []})


def _ranges(xs: list[int]) -> str:
    out, start, prev = [], xs[0], xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def fill_store(store: Store, fake: FakeSlurm, n: int, now: float) -> None:
    """The store as the controller keeps it: every task registered, slices and rates of those that ran."""
    jobs, slices, rates = [], [], []
    for array, task, _rid in tasks_of(n, fake.tenants):
        jid = f"{array}_{task}"
        state = JobState.RUNNING if jid in fake.running else (
            JobState.SUSPENDED if jid in fake.suspended else JobState.QUEUED)
        jobs.append({
            "id": jid, "user": "root", "name": "scale_job", "min_gpus": 1, "max_gpus": 1,
            "submit_time": float(int(now - 3600)), "state": state.value, "total_work": None, "model": "",
            "partition": "gpu", "state_dir": "", "created": now - 3600, "updated": now - 60, "suspend_signal": "",
            "account": account_of(array, fake.tenants),
        })
        if jid in fake.running:
            node, gpu = fake.running[jid]
            slices.append({"job_id": jid, "seq": 1, "nodes": node, "gpus": f"{node}:{gpu}", "shared": False,
                           "start_time": now - 20, "end_time": None, "end_reason": None})
        elif jid in fake.suspended:
            slices.append({"job_id": jid, "seq": 1, "nodes": "n1", "gpus": "n1:0", "shared": False,
                           "start_time": now - 200, "end_time": now - 140, "end_reason": SliceEnd.QUANTUM.value})
            rates.append({"job_id": jid, "gpus": 1, "locality": 0, "rate": 10.0, "at": now - 150})
    with store.engine.begin() as conn:
        conn.execute(sa.insert(JobRow), jobs)
        if slices:
            conn.execute(sa.insert(SliceRow), slices)
        if rates:
            conn.execute(sa.insert(RateRow), rates)


class NoProtocol:
    """An ordinary round acts on nothing."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an ordinary round called the protocol's {name}")


def make_controller(n: int, suspended: int, d: Path, now: float, fairness: str = "none",
                    tenants: int = 0) -> tuple[Controller, Store]:
    fake = FakeSlurm(n, suspended, now, tenants if fairness == "shares" else 0)
    backend = CliBackend(capabilities=SlurmCapabilities.for_release((24, 11, 5)), clock=lambda: now)
    backend._run = fake.run  # type: ignore[method-assign]
    store = Store(d / "gandiva.db")
    fill_store(store, fake, n, now)
    running = set(fake.running)

    def progress(path: Path, _user: str) -> Progress | None:
        jid = path.parent.name
        if jid not in running:
            return None
        return Progress(step=10, epoch=0, samples=100, total_samples=None, batch_time_avg=0.1, samples_per_s=10.0,
                        world_size=1, updated=now - 1, started=now - 19)

    cfg = ControllerConfig(state_dir=d, partitions=("gpu",), tick=5.0, quantum=60.0, fairness=fairness)
    ctl = Controller(cfg, backend, store, clock=lambda: now, topology=Topology.uniform(NODES, GPUS, shards=0),
                     progress_reader=progress, protocol=NoProtocol())
    return ctl, store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--suspended", type=int, default=24, help="tasks suspended after one slice")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions")
    ap.add_argument("--fairness", choices=("none", "shares"), default="none")
    ap.add_argument("--tenants", type=int, default=4, choices=(1, 2, 4, 8),
                    help="accounts with --fairness shares (default 4; they split the 8 GPUs evenly)")
    a = ap.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        ctl, store = make_controller(a.jobs, a.suspended, Path(tmp), now, a.fairness, a.tenants)
        try:
            first = ctl.tick()
            assert first.error == "" and len(first.view.jobs if first.view else ()) == a.jobs, first.error
            times, cpu = [], []
            prof = cProfile.Profile() if a.profile else None
            for _ in range(a.rounds):
                t, c = time.perf_counter(), time.process_time()
                if prof is not None:
                    prof.enable()
                rep = ctl.tick()
                if prof is not None:
                    prof.disable()
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                getattr(ctl, "collect_garbage", lambda: None)()  # as the tick job does after the round
                assert not rep.plan and not rep.findings and not rep.error, (rep.plan, rep.findings, rep.error)
        finally:
            store.close()
    view = ctl.last_report.view if ctl.last_report is not None else None
    print(f"{a.jobs} managed jobs ({len(view.running) if view is not None else 0} running), "
          f"{a.rounds} ordinary rounds{' under cProfile' if prof else ''}"
          f"{f', fairness shares over {a.tenants} accounts' if a.fairness == 'shares' else ''}: "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s; "
          f"CPU time median {statistics.median(cpu):.3f} s, max {max(cpu):.3f} s (other processes' load aside)")
    if prof is not None:
        stats = pstats.Stats(prof)
        stats.sort_stats("cumulative").print_stats(a.profile)
        stats.sort_stats("tottime").print_stats(a.profile)




if __name__ == "__main__":
    main()
