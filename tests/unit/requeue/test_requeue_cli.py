"""`gandiva suspend|resume|migrate|resize` over an in-memory Slurm: parsing, GPU choice, output, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import slurm_gandiva.slurm
from slurm_gandiva.cli import main
from slurm_gandiva.slurm.base import HoldKind
from tests.unit.requeue.requeue_fakes import FakeClock, FakeJob, FakeSlurm


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    fake = FakeSlurm(FakeClock(), jobs_root=tmp_path, auto_tick=0.2)
    monkeypatch.setattr(slurm_gandiva.slurm, "make_backend", lambda env=None: fake, raising=False)
    return fake


def test_suspend_prints_each_step_with_its_duration(
    slurm: FakeSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm.add(FakeJob("41", react_after=0.1))
    assert main(["suspend", "41", "--jobs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for step in ("signal", "wait-requeue", "wait-checkpoint", "admin-hold"):
        assert step in out
    assert "job 41: suspend -> suspended" in out and " s " in out
    assert slurm.job("41").hold is HoldKind.ADMIN


def test_resume_json_output_and_exact_gpus(slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.add(FakeJob("42", state="PENDING", hold=HoldKind.ADMIN, gpus=(), restart_count=1, req_gres=""))
    assert main(["resume", "42", "--node", "n2", "--gpus", "3,1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["outcome"] == "running" and data["placement"] == "n2:1+3"
    assert [s["step"] for s in data["steps"]][-1] == "verify"
    assert dict(slurm.job("42").gpus) == {"n2": (1, 3)}


def test_resize_picks_free_gpus_on_the_current_node(slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.add(FakeJob("43", node="n1", gpus=(2, 3), react_after=0.1))
    slurm.add(FakeJob("44", node="n1", gpus=(0,)))  # someone else holds GPU 0
    assert main(["resize", "43", "--gpus", "1"]) == 0
    assert "resize -> running on n1:2" in capsys.readouterr().out  # keeps one of its own GPUs
    assert dict(slurm.job("43").gpus) == {"n1": (2,)}
    assert main(["resize", "43", "--gpus", "3"]) == 0
    assert dict(slurm.job("43").gpus) == {"n1": (1, 2, 3)}
    assert main(["resize", "43", "--gpus", "4"]) == 2  # only 3 free: a one-line BadRequest
    assert "free GPUs" in capsys.readouterr().err


def test_permission_denied_says_to_run_as_root(slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.root = False
    slurm.add(FakeJob("45", state="PENDING", hold=HoldKind.ADMIN, gpus=()))
    assert main(["migrate", "45", "--node", "n1", "--gpus", "0"]) == 4
    err = capsys.readouterr().err
    assert "must run as root or the SlurmUser" in err and err.count("\n") == 1


def test_bad_gpu_list_is_a_usage_error(slurm: FakeSlurm) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["resume", "1", "--node", "n1", "--gpus", "0,0"])
    assert exc.value.code == 2


def test_non_root_caller_refused_by_job_submit_lua_gets_the_hint(
    slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm.lua_refuses = True
    slurm.add(FakeJob("46", state="PENDING", hold=HoldKind.USER, gpus=(), req_gres=""))
    monkeypatch.setattr("os.geteuid", lambda: 1001)
    assert main(["resume", "46", "--node", "n1", "--gpus", "0"]) == 2
    err = capsys.readouterr().err
    assert "Unspecified error" in err and "must run as root or the SlurmUser" in err


@pytest.mark.parametrize("state", ["FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL"])
@pytest.mark.parametrize("verb", [["suspend"], ["resume", "--node", "n1", "--gpus", "0"],
                                  ["migrate", "--node", "n1", "--gpus", "0"]])
def test_a_verb_on_a_job_that_ended_in_failure_exits_non_zero(
    slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], state: str, verb: list[str]
) -> None:
    slurm.add(FakeJob("46", state=state, gpus=()))
    assert main([verb[0], "46", *verb[1:]]) == 6
    err = capsys.readouterr().err
    assert f"job 46 ended {state}: nothing to {verb[0]}" in err and err.count("\n") == 1


def test_a_verb_on_a_completed_job_exits_zero(slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.add(FakeJob("47", state="COMPLETED", gpus=()))
    assert main(["suspend", "47"]) == 0
    assert "finished" in capsys.readouterr().out
