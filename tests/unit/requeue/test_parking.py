"""Park and unpark through the protocol (issue 31, item 2) against the in-memory Slurm: request, signal and the
job's own report; idempotence after a crash; escalation to the requeue path; root's request file written
only where no link leads elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gandiva.errors import JobFileError, ProtocolError
from slurm_gandiva.requeue.contract import read_park_request
from slurm_gandiva.requeue.operations import Op, Outcome, Phase, Step, phase
from slurm_gandiva.requeue.parking import parked_state, write_root_file
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import HoldKind
from tests.unit.requeue.requeue_fakes import FakeClock, FakeJob, FakeSlurm


def running(slurm: FakeSlurm, tmp_path: Path, job_id: str = "7", **kw: object) -> FakeJob:
    (tmp_path / job_id).mkdir(exist_ok=True)
    return slurm.add(FakeJob(job_id, gpus=(0,), shared=True, **kw))  # type: ignore[arg-type]


def test_park_then_unpark_in_place_without_a_slurm_state_change(
    proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path, clock: FakeClock
) -> None:
    running(slurm, tmp_path)
    res = proto.park("7")
    assert (res.op, res.outcome) == (Op.PARK, Outcome.PARKED)
    assert [s.step for s in res.steps] == [Step.WRITE_REQUEST, Step.SIGNAL, Step.WAIT_SWITCH, Step.FREEZE]
    # The park signal, then SIGSTOP to every process: parked, it computes nothing whatever it reports.
    assert slurm.called("signal") == [("signal", "7", "URG"), ("signal", "7", "STOP")]
    req = read_park_request(tmp_path / "7" / "park-request.json", owner=os.geteuid(), job_id="7")
    assert req is not None and req.action == "park"
    st = (tmp_path / "7" / "park-request.json").stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o644, os.geteuid())
    assert phase(slurm.job("7")) is Phase.RUNNING  # Slurm sees nothing: it still holds its shard
    # No Slurm call but the signal: no hold, requeue, update or release.
    assert {c[0] for c in slurm.calls} == {"signal"}
    assert parked_state(proto.files(slurm.job("7")) or pytest.fail(), "alice", "7") == "parked"
    clock.sleep(1.0)
    back = proto.unpark("7")
    assert (back.op, back.outcome) == (Op.UNPARK, Outcome.RUNNING)
    assert [s.step for s in back.steps][:2] == [Step.THAW, Step.WRITE_REQUEST]  # SIGCONT before the request
    assert [c[2] for c in slurm.called("signal")][2:] == ["CONT", "URG"]
    again = read_park_request(tmp_path / "7" / "park-request.json", owner=os.geteuid(), job_id="7")
    assert again is not None and again.action == "unpark" and again.seq > req.seq  # seq grows
    assert parked_state(proto.files(slurm.job("7")) or pytest.fail(), "alice", "7") == "running"


def test_a_park_the_job_already_handled_is_not_sent_again(
    proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path
) -> None:
    running(slurm, tmp_path)
    proto.park("7")
    n = len(slurm.calls)
    # A controller that died after the job parked, and parks it again on recovery.
    res = proto.park("7")
    assert res.outcome is Outcome.PARKED and slurm.calls[n:] == [("signal", "7", "STOP")]  # frozen again only
    assert all(s.skipped for s in res.steps if s.step is not Step.FREEZE)


def test_a_parked_job_is_thawed_before_the_requeue_path_stops_it(
    proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path
) -> None:
    running(slurm, tmp_path)
    proto.park("7")
    res = proto.suspend("7")
    assert res.outcome is Outcome.SUSPENDED, res.describe()
    assert [c[2] for c in slurm.called("signal")] == ["URG", "STOP", "CONT", "USR2"]


def test_a_job_that_ignores_the_park_request_is_suspended_through_the_requeue_path(
    proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path, clock: FakeClock
) -> None:
    running(slurm, tmp_path, on_park="ignore")
    t0 = clock()
    res = proto.park("7", timeout=3.0)
    assert res.outcome is Outcome.ESCALATED and "did not park" in res.detail
    assert 3.0 <= clock() - t0 <= 3.0 + 10.0 + 2.0  # the park timeout, then at most the suspend's own bound
    job = slurm.job("7")
    assert job.pending and job.hold is HoldKind.ADMIN  # suspended: its GPUs are free for the group
    assert [c[2] for c in slurm.called("signal")] == ["URG", "USR2"]


def test_a_job_that_ignores_everything_is_forced_off_its_gpus_within_bounded_time(
    proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path, clock: FakeClock
) -> None:
    running(slurm, tmp_path, on_park="ignore", on_signal="ignore")
    t0 = clock()
    res = proto.unpark("7", timeout=3.0)
    assert res.outcome is Outcome.ESCALATED and "did not unpark" in res.detail
    assert clock() - t0 <= 3.0 + 10.0 + 2.0
    assert slurm.called("requeue_hold")  # root's forced requeue-hold ended it
    assert slurm.job("7").pending


def test_only_a_running_job_parks(proto: RequeueProtocol, slurm: FakeSlurm, tmp_path: Path) -> None:
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=()))
    with pytest.raises(ProtocolError, match="not running"):
        proto.park("7")
    slurm.add(FakeJob("8", state="COMPLETED", gpus=()))
    assert proto.park("8").outcome is Outcome.FINISHED


def test_root_never_writes_through_a_link_in_the_jobs_tree(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    (root / "priv").mkdir(parents=True)
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (root / "priv" / "7").symlink_to(elsewhere)  # the user swapped its state directory for a link
    with pytest.raises(JobFileError, match="without following a link"):
        write_root_file(root, root / "priv" / "7", "park-request.json", "{}", "alice")
    assert list(elsewhere.iterdir()) == []
    (root / "priv" / "7").unlink()
    (root / "priv" / "7").mkdir()
    write_root_file(root, root / "priv" / "7", "park-request.json", json.dumps({"a": 1}), "alice")
    assert json.loads((root / "priv" / "7" / "park-request.json").read_text()) == {"a": 1}
    assert [p.name for p in (root / "priv" / "7").iterdir()] == ["park-request.json"]  # no temp file left
    with pytest.raises(JobFileError, match="not under the jobs root"):
        write_root_file(root, tmp_path / "etc", "x", "{}", "alice")
