"""Job arrays in squeue --json, captured from the real releases: every task is a job named "ARRAY_TASK".

Each capture holds (made by `sbatch --array=0-5%2 --hold` and `--array=7-8 --hold`, then `scontrol hold A_0`,
`scontrol update jobid=A_3 nodelist=n1 gres=gpu:g0:1` + `scontrol release A_3`, `scontrol hold B_7`,
`scontrol hold B_8`): task 0 split off and admin-held, task 3 split off and running on n1's GPU 0, tasks 1, 2,
4, 5 in the array's pending meta record ("1-2,4-5%2"), and both tasks of array B held. On 22.05 and 24.11 the
last task held (B_8) turns the meta record into that task's own record; on 25.11 and 26.05 the meta record
keeps it as its task string ("8"). The 22.05 / 24.11 captures also hold an earlier array cancelled as a whole:
its meta record, finished, lists no tasks, and a split task of it that completed.
"""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from slurm_gandiva.slurm import parse
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.slurm.pyslurm_backend import array_names

DATA = Path(__file__).parent / "data"
RELEASES = ("22.05", "24.11", "25.11", "26.05")


def load(release: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((DATA / f"squeue_{release}_array.json").read_text()))


def arrays(release: str) -> tuple[str, str]:
    """The ids of the two live arrays of a capture (the throttled one, the other)."""
    return ("4", "5") if release in ("22.05", "24.11") else ("1", "2")


@pytest.mark.parametrize("release", RELEASES)
def test_every_task_is_a_job_named_array_task(release: str) -> None:
    a, b = arrays(release)
    jobs = {j.job_id: j for j in parse.parse_squeue(load(release))}
    live = {jid for jid, j in jobs.items() if jid.startswith((f"{a}_", f"{b}_"))}
    assert live == {f"{a}_{t}" for t in range(6)} | {f"{b}_7", f"{b}_8"}
    running = jobs[f"{a}_3"]
    assert running.running and dict(running.gpus) == {"n1": (0,)} and running.nodes == ("n1",)
    assert jobs[f"{a}_0"].pending and jobs[f"{a}_0"].hold is HoldKind.ADMIN
    for t in (1, 2, 4, 5):  # still in the meta record: pending, held as it is
        j = jobs[f"{a}_{t}"]
        assert j.pending and j.hold is HoldKind.USER and j.comment == "gandiva" and j.gpus == {}
    assert jobs[f"{b}_7"].hold is HoldKind.ADMIN and jobs[f"{b}_8"].hold is HoldKind.ADMIN
    for jid in live:
        j = jobs[jid]
        assert j.array_id == jid.split("_")[0]
        assert j.array_max_tasks == (2 if j.array_id == a else 0)


@pytest.mark.parametrize("release", ("22.05", "24.11"))
def test_an_array_cancelled_as_a_whole_stands_for_no_task_but_its_split_ones(release: str) -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(load(release))}
    old = {jid for jid in jobs if jid.startswith("1_")}
    assert old == {"1_0", "1_3"}  # 1-2,4-5 were in the meta record: gone from the queue with it
    assert jobs["1_3"].state == "COMPLETED" and jobs["1_0"].state == "CANCELLED"
    assert "1" not in jobs


def test_plain_jobs_keep_their_own_id() -> None:
    raw = {"job_id": 7, "array_job_id": {"set": True, "number": 0}, "array_task_id": {"set": False, "number": 0},
           "job_state": ["PENDING"], "comment": "gandiva"}
    assert [j.job_id for j in parse.parse_squeue({"jobs": [raw]})] == ["7"]
    raw2205 = {"job_id": 8, "array_job_id": 0, "array_task_id": None, "job_state": "RUNNING"}
    assert [(j.job_id, j.array_id) for j in parse.parse_squeue({"jobs": [raw2205]})] == [("8", "")]


def test_meta_record_with_brackets_and_the_throttle_in_its_task_string() -> None:
    raw = {"job_id": 9, "array_job_id": 9, "array_task_id": None, "array_task_string": "[3-11%4]",
           "job_state": "PENDING", "state_reason": "JobHeldUser", "priority": 0}
    jobs = parse.parse_squeue({"jobs": [raw]})
    assert [j.job_id for j in jobs] == [f"9_{t}" for t in range(3, 12)]
    assert {j.array_max_tasks for j in jobs} == {4}
    # Each task is the job the meta record describes under its own id (copied without __init__: cheap).
    meta = parse.parse_job(raw)
    assert list(jobs) == [replace(meta, job_id=f"9_{t}", array_id="9", array_max_tasks=4) for t in range(3, 12)]
    with pytest.raises(FrozenInstanceError):
        jobs[0].job_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spec", "tasks", "limit"),
    [("0-11%4", tuple(range(12)), 4), ("[1-2,4-5%2]", (1, 2, 4, 5), 2), ("0-10:5", (0, 5, 10), 0),
     ("7", (7,), 0), ("3,1,1", (1, 3), 0)],
)
def test_array_spec(spec: str, tasks: tuple[int, ...], limit: int) -> None:
    assert parse.parse_array_spec(spec) == (tasks, limit)


@pytest.mark.parametrize("spec", ["", "a-b", "5-1", "1-4:0", "1-3%x", "1--3", "-1"])
def test_bad_array_spec(spec: str) -> None:
    with pytest.raises(ValueError):
        parse.parse_array_spec(spec)


def test_pyslurm_records_are_named_as_squeue_names_them() -> None:
    def rec(**kw: Any) -> SimpleNamespace:
        base = {"id": 4, "array_id": 4, "array_task_id": None, "array_tasks_waiting": None}
        return SimpleNamespace(**{**base, **kw})

    assert array_names(rec(array_id=None)) == ()
    assert array_names(rec(id=7, array_task_id=3)) == ("4_3",)
    assert array_names(rec(array_tasks_waiting="1-2,4-5")) == ("4_1", "4_2", "4_4", "4_5")
    assert array_names(rec(id=6)) is None  # pyslurm reads task 0 as no task: squeue must say

