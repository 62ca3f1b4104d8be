"""`gandiva cancel` and `gandiva squeue` / `gandiva sacct` with job arrays: tasks are ARRAY_TASK, an ARRAY id
names the whole array, and users act only on their own."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.config import parse_config
from slurm_gandiva.controller import cli
from slurm_gandiva.errors import PermissionDenied, UnknownJob
from slurm_gandiva.model import GpuRef, JobSpec, Placement
from slurm_gandiva.slurm.base import SlurmJob
from slurm_gandiva.store import SliceEnd, Store
from tests.unit.controller.controller_fakes import FakeBackend, sjob


def task(jid: str, state: str = "PENDING", user: str = "alice") -> SlurmJob:
    return replace(sjob(jid, state, user=user), array_id=jid.split("_")[0], array_max_tasks=2)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    be = FakeBackend([task("7_0", "RUNNING", ), task("7_1"), task("7_2", "COMPLETED"), task("8_0", user="bob"),
                      task("9_0", "COMPLETED"), sjob("42")])
    monkeypatch.setattr("slurm_gandiva.slurm.make_backend", lambda env=None: be)
    monkeypatch.setattr(cli, "caller_name", lambda: "alice")
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    return be


def cancel(*ids: str) -> int:
    return cli.cmd_cancel(argparse.Namespace(job_ids=list(ids), config=None))


def test_one_task_or_the_whole_array_in_one_scancel(backend: FakeBackend, capsys: pytest.CaptureFixture[str]) -> None:
    assert cancel("7_1") == 0
    assert backend.calls == [("cancel", "7_1")]
    assert cancel("7") == 0
    assert backend.calls[-1] == ("cancel", "7") and len(backend.calls) == 2
    assert "cancelled job array 7 (1 of its 3 tasks" in capsys.readouterr().out  # 7_1 is cancelled already


def test_only_the_owner_cancels_and_unknown_or_ended_ones_say_so(backend: FakeBackend,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PermissionDenied, match="job 8 belongs to bob"):
        cancel("8")
    with pytest.raises(PermissionDenied, match="job 8_0 belongs to bob"):
        cancel("8_0")
    with pytest.raises(UnknownJob, match="no job 10"):
        cancel("10")
    assert cancel("9") == 0 and "job array 9 already ended" in capsys.readouterr().err
    assert cancel("7_2") == 0 and backend.calls == []


def test_squeue_lists_tasks_as_array_task(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\n")
    be = FakeBackend([task("7_0", "RUNNING"), task("7_1"), sjob("42")])
    with Store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        rows = cli.queue_rows(cfg, be, store)
    assert [r.job_id for r in rows] == ["7_0", "7_1", "42"]
    assert cli.format_rows(rows).splitlines()[1].split()[0] == "7_0"


def test_sacct_of_an_array_lists_its_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "gandiva.db"
    t0 = time.time() - 100
    with Store(db) as s:
        for jid in ("7_0", "7_1", "70", "17_0"):
            s.upsert_job(JobSpec(jid, "alice", 1, 1, t0), at=t0)
            s.open_slice(jid, Placement((GpuRef("n1", 0),)), t0 + 1)
            s.close_slice(jid, t0 + 2, SliceEnd.QUANTUM)
    assert main(["sacct", "--db", str(db), "-j", "7", "-P", "-n", "-o", "JobID"]) == 0
    assert capsys.readouterr().out.split() == ["7_0", "7_1"]
    assert main(["sacct", "--db", str(db), "-j", "7_1,70", "-P", "-n", "-o", "JobID"]) == 0
    assert capsys.readouterr().out.split() == ["7_1", "70"]


def test_a_lost_cancel_is_sent_again_and_one_that_never_takes_is_an_error(
    backend: FakeBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s

    backend.lose_cancels = 1  # the first scancel is lost: sent again 2 s on, and the task ends
    backend.cancel("7_0")
    assert cli.confirm_cancel(backend, "7_0", clock=lambda: t[0], sleep=sleep) is None
    assert backend.calls == [("cancel", "7_0"), ("cancel", "7_0")] and backend.job("7_0").state == "CANCELLED"
    backend.lose_cancels = 1000  # Slurm never cancels it: after the bound, its state, and a non-zero exit
    assert cli.confirm_cancel(backend, "7_1", timeout=10.0, clock=lambda: t[0], sleep=sleep) == "PENDING"
    assert backend.calls.count(("cancel", "7_1")) >= 4 and t[0] >= 10.0  # sent again every 2 s until the bound
