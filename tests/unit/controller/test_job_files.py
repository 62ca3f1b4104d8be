"""One job's bad files (progress.json a FIFO, binary bytes, a directory, a link) affect that job alone: the
round goes on for everyone, the reason is logged once, recorded and shown in `gandiva squeue`."""

from __future__ import annotations

import os
import time
from pathlib import Path

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.cli import format_rows, queue_rows
from slurm_gandiva.controller.reconcile import Reconciler
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import ClusterView, Placement, Topology
from slurm_gandiva.plan import Plan
from slurm_gandiva.requeue.contract import Progress
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


class StartAll:
    """Starts every waiting job on the next free GPU."""

    name = "start-all"
    quantum = None

    def decide(self, view: ClusterView, now: float) -> Plan:
        free = list(view.free_gpus())
        targets: dict[str, Placement | None] = {}
        for j in view.waiting:
            if free:
                targets[j.job_id] = Placement((free.pop(0),))
        return Plan.from_targets(view, targets)


def progress(samples: int) -> str:
    return Progress(step=1, epoch=0, samples=samples, total_samples=None, batch_time_avg=0.1, samples_per_s=10.0,
                    world_size=1, updated=time.time()).to_json()


def test_a_bad_progress_file_affects_only_its_job(tmp_path: Path) -> None:
    jobs = [sjob(str(i), submit=time.time() - 600) for i in range(1, 5)]
    backend = FakeBackend(jobs)
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\n")
    ctl = Controller(cfg, backend, store, policy=StartAll(), protocol=FakeProtocol(backend), topology=TOPO)
    root = cfg.job_root
    for i in range(1, 5):
        (root / str(i)).mkdir(parents=True)
    (root / "1" / "progress.json").write_text(progress(50))
    os.mkfifo(root / "2" / "progress.json")  # would block root's open() forever
    (root / "3" / "progress.json").write_bytes(b"\x00\xff\xfe binary")
    (root / "4" / "progress.json").symlink_to("/dev/zero")

    rep = ctl.tick()
    assert rep.error == ""
    assert sorted(r.decision.job_id for r in rep.results if r.ok) == ["1", "2", "3", "4"]  # everyone scheduled
    assert set(ctl.file_problems) == {"2", "3", "4"}
    assert "FIFO" in ctl.file_problems["2"] and "UTF-8" in ctl.file_problems["3"]
    assert "symbolic link" in ctl.file_problems["4"]

    rep = ctl.tick()
    assert rep.error == "" and rep.view is not None
    assert {j.job_id: j.progress for j in rep.view.jobs}["1"] >= 50  # the good job's report is used
    refused = store.events(kinds=["job-file-refused"])
    assert sorted(e.job_id or "" for e in refused) == ["2", "3", "4"]  # once each, not every round

    (root / "3" / "progress.json").write_text(progress(7))  # fixed by its owner
    assert not ctl.tick().error and set(ctl.file_problems) == {"2", "4"}

    rows = {r.job_id: r for r in queue_rows(cfg, backend, store)}
    assert "FIFO" in rows["2"].reason and rows["1"].reason == "" and rows["3"].progress == "7"
    table = format_rows(list(rows.values()))
    assert table.splitlines()[0].split()[-1] == "REASON" and "FIFO" in table


def test_a_refused_spec_file_is_noted_and_the_job_still_registered(tmp_path: Path) -> None:
    jobs_root = tmp_path / "jobs"
    (jobs_root / "spec").mkdir(parents=True)
    os.mkfifo(jobs_root / "spec" / "7.json")
    backend = FakeBackend([sjob("7", submit=time.time() - 600)])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    rec = Reconciler(backend, store, partitions=(), jobs_root=jobs_root, clock=time.time)
    found = rec.settle(backend.snapshot())
    kinds = [f.kind for f in found]
    assert "spec-refused" in kinds and "registered" in kinds  # as a plain sbatch job, past the grace
    assert [f.kind for f in rec.settle(backend.snapshot())] == []  # noted once
