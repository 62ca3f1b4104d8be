"""Parsing recorded squeue/sinfo --json (real 22.05 captures and a hand-made newer-version variant)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from slurm_gandiva.slurm import parse
from slurm_gandiva.slurm.base import HoldKind, SlurmJob

DATA = Path(__file__).parent / "data"


def load(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((DATA / name).read_text()))


def by_id(jobs: tuple[SlurmJob, ...]) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in jobs}


def test_real_2205_running_jobs_whole_gpus_shards_and_untyped() -> None:
    jobs = by_id(parse.parse_squeue(load("squeue_22.05_v0.0.38.json")))
    assert set(jobs) == {"1", "2", "3", "4", "5"}
    j1 = jobs["1"]
    assert (j1.state, j1.running, j1.nodes) == ("RUNNING", True, ("n1",))
    assert (dict(j1.gpus), dict(j1.shards)) == ({"n1": (1, 3)}, {})
    assert j1.tres_per_node == "gres:gpu:g1:1,gres:gpu:g3:1" and j1.exit_code is None
    assert j1.user == "root" and j1.partition == "gpu" and j1.work_dir.endswith("/jobs")
    assert jobs["2"].comment == "gandiva" and dict(jobs["2"].shards) == {"n2": (2,)} and jobs["2"].gpus == {}
    assert dict(jobs["3"].shards) == {"n2": (0, 2)}
    # untyped gpu:2 lists zero-count types too: gpu:g1:0(IDX:) must not count
    assert dict(jobs["4"].gpus) == {"n1": (0, 2)}
    j5 = jobs["5"]
    assert j5.pending and j5.reason == "Resources" and j5.hold is HoldKind.NONE
    assert j5.nodes == ("n1",)  # requested node list while pending


def test_real_2205_holds_requeue_and_exit_codes() -> None:
    jobs = by_id(parse.parse_squeue(load("squeue_22.05_held.json")))
    requeued = jobs["1"]
    assert requeued.pending and requeued.hold is HoldKind.USER and requeued.restart_count == 1
    assert requeued.gpus == {} and requeued.nodes == ("n1",)
    assert jobs["5"].hold is HoldKind.ADMIN and jobs["5"].reason == "JobHeldAdmin"
    assert jobs["6"].hold is HoldKind.USER
    assert jobs["2"].hold is HoldKind.NONE  # running jobs are never "held"
    assert (jobs["7"].state, jobs["7"].exit_code, jobs["7"].finished) == ("FAILED", 3, True)
    assert (jobs["8"].state, jobs["8"].exit_code) == ("COMPLETED", 0)
    assert (jobs["4"].state, jobs["4"].exit_code) == ("CANCELLED", 128 + 15)  # raw status 15 = SIGTERM


def test_newer_data_parser_variant() -> None:
    jobs = by_id(parse.parse_squeue(load("squeue_v0.0.41_handmade.json")))
    j = jobs["101"]
    assert j.state == "RUNNING" and j.nodes == ("n1", "n2")
    assert dict(j.gpus) == {"n1": (0, 2), "n2": (0, 2)}
    assert j.submit_time == 1700000000.0 and j.start_time == 1700000010.0 and j.restart_count == 2
    assert j.exit_code is None and j.comment == "gandiva"
    held = jobs["102"]
    assert held.state == "PENDING" and held.hold is HoldKind.USER and held.nodes == ("n2",)
    assert held.start_time == 0.0  # {"set": false}
    assert jobs["103"].hold is HoldKind.ADMIN
    assert dict(jobs["104"].shards) == {"n1": (1,)}  # no IDX: the type name gK gives the index
    assert jobs["105"].exit_code == 128 + 9
    assert jobs["106"].exit_code == 3


def test_sinfo_flat_2205_and_grouped_newer() -> None:
    old = parse.parse_sinfo(load("sinfo_22.05_v0.0.38.json"))
    assert [n.name for n in old] == ["n1", "n2"]
    assert old[0].state == "MIXED" and old[0].up and old[0].partitions == ("gpu",)
    assert old[0].cpus == 8 and old[0].sockets == 2 and "shard:g3:2" in old[0].gres
    assert old[0].memory == 8000  # RealMemory, MB
    new = parse.parse_sinfo(load("sinfo_v0.0.41_handmade.json"))
    assert [(n.name, n.state, n.up) for n in new] == [("n1", "MIXED", True), ("n2", "IDLE+DRAIN", False)]
    assert new[0].cpus == 8 and new[0].partitions == ("gpu",) and "gpu:g0:1(IDX:0)" in new[0].gres_used
    assert new[0].memory == 8000


def test_errors_in_json_are_not_an_empty_queue() -> None:
    # What 22.05's squeue --json prints (exit 0!) when slurmctld is down.
    doc = {"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                       "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}
    with pytest.raises(parse.SlurmQueryError, match="Failed while looking for jobs"):
        parse.parse_squeue(doc)
    with pytest.raises(parse.SlurmQueryError):
        parse.parse_sinfo({"errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []})
    with pytest.raises(parse.ParseError):
        parse.parse_squeue({"meta": {}})
    with pytest.raises(parse.ParseError):
        parse.load_json("not json", "squeue")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("n1", ("n1",)),
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("a[01-02]x,b7", ("a01x", "a02x", "b7")),
        ("", ()),
    ],
)
def test_hostlist(expr: str, expected: tuple[str, ...]) -> None:
    assert parse.expand_hostlist(expr) == expected


def test_numbers_and_states() -> None:
    assert parse.number({"set": True, "infinite": False, "number": 7}) == 7
    assert parse.number({"set": False, "number": 7}, -1) == -1
    assert parse.number({"set": True, "infinite": True, "number": 0}, -1) == -1
    assert parse.number(None, 3) == 3 and parse.number("12") == 12 and parse.number(True, 4) == 4
    assert parse.states("mixed") == ["MIXED"] and parse.states(["IDLE", "DRAIN"]) == ["IDLE", "DRAIN"]
    assert parse.states("idle+drain") == ["IDLE", "DRAIN"]
    job = parse.parse_job({"job_id": 9, "job_state": ["PENDING", "REQUEUE_HOLD"], "priority": 0})
    assert job.state == "PENDING" and job.hold is HoldKind.USER and job.reason == "None"
    # 24.11: a requeued job still being torn down (measured: seconds after requeuehold)
    tearing = parse.parse_job({"job_id": 9, "job_state": ["PENDING", "COMPLETING"], "state_reason": "JobHeldAdmin"})
    assert tearing.state == "COMPLETING" and not tearing.pending and tearing.hold is HoldKind.NONE
    # A parked job frozen with SIGSTOP runs on to Slurm: scontrol and 22.05 print the flag alone.
    for word in ("STOPPED", "SIGNALING", ["RUNNING", "STOPPED"]):
        assert parse.parse_job({"job_id": 9, "job_state": word}).running, word
