"""`gandiva sacct` and `gandiva report` end to end through the CLI dispatcher on a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.model import GpuRef, JobSpec, JobState, Placement
from slurm_gandiva.report.cli import visible_users
from slurm_gandiva.store import SliceEnd, Store

T0 = 1_800_000_000.0


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "gandiva.db"
    with Store(path) as s:
        s.upsert_job(JobSpec("11", "alice", 2, 2, T0), at=T0, state=JobState.DONE)
        s.upsert_job(JobSpec("12", "bob", 1, 1, T0 + 1), at=T0)
        s.open_slice("11", Placement((GpuRef("n1", 0), GpuRef("n1", 1))), T0 + 2)
        s.close_slice("11", T0 + 62, SliceEnd.QUANTUM)
        s.open_slice("12", Placement((GpuRef("n1", 0),)), T0 + 63)
        s.open_slice("11", Placement((GpuRef("n2", 0), GpuRef("n2", 1))), T0 + 64)
        s.close_slice("11", T0 + 124, SliceEnd.DONE)
    return str(path)


def test_sacct_table(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sacct", "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["JobID", "User", "Slice"]
    assert [line.split()[0] for line in lines[2:]] == ["11", "12", "11"]  # root sees everyone


def test_sacct_filters_and_parsable2(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sacct", "--db", db, "-j", "11", "--format=JobID,Slice,GPUs,Reason", "--parsable2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "JobID|Slice|GPUs|Reason",
        "11|1|n1:0+1|quantum",
        "11|2|n2:0+1|done",
    ]
    assert main(["sacct", "--db", db, "-u", "bob", "-P", "-n", "-o", "JobID"]) == 0
    assert capsys.readouterr().out == "12\n"


def test_sacct_time_window_and_json(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import datetime

    start = datetime.fromtimestamp(T0 + 63).strftime("%Y-%m-%dT%H:%M:%S")
    assert main(["sacct", "--db", db, "-S", start, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["job_id"], s["slice"]) for s in doc["slices"]] == [("12", 1), ("11", 2)]


def test_sacct_shows_and_filters_accounts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "gandiva.db")
    with Store(path) as s:
        s.upsert_job(JobSpec("21", "alice", 1, 1, T0, account="physics", qos="normal"), at=T0)
        s.upsert_job(JobSpec("22", "bob", 1, 1, T0 + 1, account="bio"), at=T0)
        s.open_slice("21", Placement((GpuRef("n1", 0),)), T0 + 2)
        s.open_slice("22", Placement((GpuRef("n1", 1),)), T0 + 3)
    assert main(["sacct", "--db", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["JobID", "User", "Account", "QOS", "Slice"]
    assert [line.split()[:4] for line in lines[2:]] == [["21", "alice", "physics", "normal"], ["22", "bob", "bio", "1"]]
    assert main(["sacct", "--db", path, "-A", "bio", "-P", "-o", "JobID,Account"]) == 0
    assert capsys.readouterr().out.splitlines() == ["JobID|Account", "22|bio"]
    assert main(["sacct", "--db", path, "--accounts", "physics,bio", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = [(x["job_id"], x["account"], x["qos"]) for x in doc["slices"]]
    assert got == [("21", "physics", "normal"), ("22", "bio", "")]


def test_sacct_without_accounts_keeps_the_old_default(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sacct", "--db", db]) == 0
    assert "Account" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--format=JobID,Nope"], "unknown field 'Nope'"),
        (["-S", "tomorrow-ish"], "bad time"),
        (["-S", "2030-01-02", "-E", "2030-01-01"], "before"),
    ],
)
def test_sacct_bad_input_is_one_line(db: str, argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sacct", "--db", db, *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and err.startswith("gandiva: error:")


def test_missing_database_is_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.db"
    assert main(["sacct", "--db", str(missing)]) == 2
    assert "no database" in capsys.readouterr().err
    assert not missing.exists()


def test_sacct_reads_db_from_controller_config(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "gandiva.conf"
    conf.write_text(f"state_dir = {tmp_path}\ndatabase_url = sqlite:///{db}\n")
    assert main(["sacct", "--config", str(conf), "-P", "-n", "-o", "JobID"]) == 0
    assert capsys.readouterr().out == "11\n12\n11\n"


def test_report_gantt_and_jct(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "g.png"
    assert main(["report", "--db", db, "--gantt", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "finished 1/2" in out and "mean JCT 124.0 s" in out
    assert main(["report", "--db", db, "--gantt", str(tmp_path / "g.jpg")]) == 2


def test_visible_users() -> None:
    assert visible_users(None, 0, "root") is None
    assert visible_users(["bob"], 0, "root") == ["bob"]
    assert visible_users(None, 1000, "alice") == ["alice"]
    assert visible_users(["bob", "alice"], 1000, "alice") == ["alice"]
    assert visible_users(["bob"], 1000, "alice") == []


def test_non_root_sees_only_own_slices(
    db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import slurm_gandiva.report.cli as rcli

    monkeypatch.setattr(rcli, "_caller", lambda: (1000, "bob"))
    assert main(["sacct", "--db", db, "-P", "-n", "-o", "JobID,User"]) == 0
    assert capsys.readouterr().out == "12|bob\n"
    assert main(["sacct", "--db", db, "-u", "alice", "-P", "-n", "-o", "JobID"]) == 0
    assert capsys.readouterr().out == ""
