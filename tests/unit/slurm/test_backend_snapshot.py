"""CliBackend.snapshot(): squeue --json only for the jobs whose `squeue -O` fingerprint changed."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_gandiva.errors import UnknownJob
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.slurm.cli_backend import CliBackend


class FakeSlurm:
    """Answers the backend's commands from a dict of job records; logs every squeue call."""

    def __init__(self, release: tuple[int, int, int] = (24, 11, 5)) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.release = release
        self.vanish_after_listing: set[int] = set()

    def add(self, job_id: int, state: str = "PENDING", **extra: Any) -> None:
        self.jobs[job_id] = {"job_id": job_id, "job_state": state, "state_reason": "JobHeldAdmin", **extra}

    def run(self, argv: Sequence[str], what: str, **_kw: Any) -> str:
        if argv[0] == "sinfo":
            return json.dumps({"nodes": [], "errors": []})
        if list(argv[:5]) == ["scontrol", "show", "job", "-d", "-o"]:
            self.calls.append(" ".join(argv))
            r = self.jobs.get(int(argv[5]))
            if r is None:
                raise UnknownJob(f"scontrol show job {argv[5]}: Invalid job id specified")
            return (
                f"JobId={r['job_id']} JobName=x UserId=alice(1000) Priority=0 JobState={r['job_state']} "
                f"Reason={r['state_reason']} Restarts={r.get('restart_cnt', 0)} ExitCode=0:0 NodeList= "
                "MinCPUsNode=1\n"
            )
        assert argv[0] == "squeue", argv
        self.calls.append(" ".join(argv[1:]))
        if any(a.startswith("--Format=") for a in argv):
            out = "".join(
                f"{jid}|{r['job_state']}|{r['state_reason']}|{r.get('restart_cnt', 0)}|\n"
                for jid, r in self.jobs.items()
            )
            for jid in self.vanish_after_listing:
                self.jobs.pop(jid, None)
            return out
        wanted = next((a.removeprefix("--jobs=") for a in argv if a.startswith("--jobs=")), None)
        recs = list(self.jobs.values())
        if wanted is not None and self.release >= (23, 2, 0):
            ids = {int(x) for x in wanted.split(",")}
            recs = [r for r in recs if r["job_id"] in ids]
        return json.dumps({"jobs": recs, "errors": []})


def backend(fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> CliBackend:
    b = CliBackend(capabilities=SlurmCapabilities.for_release(fake.release))
    monkeypatch.setattr(b, "_run", fake.run)
    return b


def states(jobs: Sequence[Any]) -> Mapping[str, str]:
    return {j.job_id: j.state for j in jobs}


def json_calls(fake: FakeSlurm) -> list[str]:
    return [c for c in fake.calls if "--json" in c]


def test_only_changed_jobs_are_read_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    for jid in range(1, 21):
        fake.add(jid)
    b = backend(fake, monkeypatch)
    assert len(b.snapshot().jobs) == 20
    assert json_calls(fake) == ["--json --states=all"]  # the first snapshot reads everything
    fake.calls.clear()
    assert len(b.snapshot().jobs) == 20
    assert json_calls(fake) == []  # nothing changed: the listing alone
    fake.jobs[3]["job_state"] = "RUNNING"
    fake.add(21)
    del fake.jobs[7]
    snap = b.snapshot()
    assert json_calls(fake) == ["--json --states=all --jobs=3,21"]
    got = states(snap.jobs)
    assert got["3"] == "RUNNING" and "21" in got and "7" not in got and len(got) == 20
    assert [j.job_id for j in snap.jobs] == [str(k) for k in fake.jobs]  # squeue's order


def test_a_change_not_in_the_fingerprint_fields_is_not_reread(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    fake.add(1, name="a")
    b = backend(fake, monkeypatch)
    b.snapshot()
    fake.jobs[1]["name"] = "renamed"  # a name is no fingerprint field: the record parsed before stands
    assert b.snapshot().jobs[0].name == "a"
    fake.jobs[1]["restart_cnt"] = 1
    assert b.snapshot().jobs[0].name == "renamed"


def test_many_changes_read_everything_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    for jid in range(1, 9):
        fake.add(jid)
    b = backend(fake, monkeypatch)
    b.snapshot()
    fake.calls.clear()
    for jid in (1, 2, 3):
        fake.jobs[jid]["job_state"] = "RUNNING"
    assert states(b.snapshot().jobs)["3"] == "RUNNING"
    assert json_calls(fake) == ["--json --states=all"]


def test_a_job_gone_between_listing_and_json_gives_one_consistent_read(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    for jid in range(1, 9):
        fake.add(jid)
    b = backend(fake, monkeypatch)
    b.snapshot()
    fake.jobs[4]["job_state"] = "COMPLETED"
    fake.vanish_after_listing = {4}
    snap = b.snapshot()
    assert "4" not in states(snap.jobs) and len(snap.jobs) == 7
    assert json_calls(fake)[-1] == "--json --states=all"


def test_where_squeue_json_ignores_filters_every_change_reads_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm(release=(22, 5, 8))
    for jid in range(1, 21):
        fake.add(jid)
    b = backend(fake, monkeypatch)
    b.snapshot()
    fake.calls.clear()
    b.snapshot()
    assert json_calls(fake) == []
    fake.jobs[5]["job_state"] = "RUNNING"
    assert states(b.snapshot().jobs)["5"] == "RUNNING"
    assert json_calls(fake) == ["--json --states=all"]


def test_where_squeue_json_ignores_filters_a_few_changes_of_a_long_queue_are_read_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """22.05: one `scontrol show job` per changed job when the queue is long (squeue --json would print it all)."""
    fake = FakeSlurm(release=(22, 5, 8))
    for jid in range(1, 201):
        fake.add(jid)
    b = backend(fake, monkeypatch)
    b.snapshot()
    fake.calls.clear()
    fake.jobs[5]["job_state"] = "RUNNING"
    fake.jobs[9]["restart_cnt"] = 1
    snap = b.snapshot()
    assert states(snap.jobs)["5"] == "RUNNING" and len(snap.jobs) == 200
    assert json_calls(fake) == []
    assert sorted(c for c in fake.calls if c.startswith("scontrol")) == [
        "scontrol show job -d -o 5",
        "scontrol show job -d -o 9",
    ]


def test_an_unreadable_listing_line_falls_back_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    fake.add(1)
    b = backend(fake, monkeypatch)
    real = fake.run

    def garbled(argv: Sequence[str], what: str, **kw: Any) -> str:
        out = real(argv, what, **kw)
        return "garbage|x|\n" + out if any(a.startswith("--Format=") for a in argv) else out

    monkeypatch.setattr(b, "_run", garbled)
    assert states(b.snapshot().jobs) == {"1": "PENDING"}
    assert json_calls(fake) == ["--json --states=all"]


def test_an_arrays_task_lines_make_one_fingerprint_of_its_record(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    fake.add(16, array_job_id=16, array_task_string="0,2-3")
    b = backend(fake, monkeypatch)
    real = fake.run
    tasks = ["0", "2", "3"]

    def per_task(argv: Sequence[str], what: str, **kw: Any) -> str:
        if any(a.startswith("--Format=") for a in argv):
            assert "--array" in argv  # else squeue folds tasks with records of their own into one line
            real(argv, what, **kw)
            return "".join(f"16|16|{t}|PENDING|JobHeldAdmin|\n" for t in tasks)
        return real(argv, what, **kw)

    monkeypatch.setattr(b, "_run", per_task)
    assert sorted(states(b.snapshot().jobs)) == ["16_0", "16_2", "16_3"]
    fake.calls.clear()
    b.snapshot()
    assert json_calls(fake) == []
    tasks.remove("2")  # task 2 got a record of its own: the array's record changed
    fake.jobs[16]["array_task_string"] = "0,3"
    assert sorted(states(b.snapshot().jobs)) == ["16_0", "16_3"]
    assert json_calls(fake) == ["--json --states=all"]


def test_slurm_commands_run_with_the_whole_array_task_list() -> None:
    assert CliBackend({"SLURM_BITSTR_LEN": "64"}).env["SLURM_BITSTR_LEN"] == "0"


def test_a_cut_array_task_list_is_an_error_not_gone_tasks() -> None:
    from slurm_gandiva.slurm import parse

    rec = {"job_id": 1, "job_state": "PENDING", "array_job_id": 1, "array_task_string": "0-1,3-5,57-71..."}
    with pytest.raises(parse.ParseError, match="SLURM_BITSTR_LEN=0"):
        parse.parse_squeue({"jobs": [rec]})


def _fake_scancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/log\n{body}\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "log"


def test_an_array_tasks_signal_sent_despite_slurms_transition_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld signals the task and answers "can not be altered now" while other tasks of its array wait;
    scancel would retry (and signal again) for 95 s: its first "retrying" means sent."""
    retrying = 'echo "scancel: Job is in transitional state, retrying" >&2; sleep 60'
    log = _fake_scancel(tmp_path, monkeypatch, retrying)
    t = time.monotonic()
    CliBackend(capabilities=SlurmCapabilities.for_release((24, 11, 5))).signal("7_3", "USR2")
    assert time.monotonic() - t < 10
    assert log.read_text().split() == ["--verbose", "--signal=USR2", "--batch", "7_3"]


def test_an_array_tasks_signal_error_is_classified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    err = "scancel: error: Kill job error on job id 7_3: Invalid job id specified"
    _fake_scancel(tmp_path, monkeypatch, f'echo "{err}" >&2; exit 1')
    with pytest.raises(UnknownJob):
        CliBackend(capabilities=SlurmCapabilities.for_release((24, 11, 5))).signal("7_3", "USR2")
