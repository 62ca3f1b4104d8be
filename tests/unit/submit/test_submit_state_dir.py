"""gandiva sbatch makes the job's state directory (0700, the user's) while the job is held, and refuses
(cancelling the job) one planted in the world-writable jobs root; the job script carries its identity."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.spec import read_spec
from slurm_gandiva.topology.file import write_topology
from tests.unit.submit.test_submit_cli import FakeBackend, _submit


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "etc").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs").chmod(0o1777)
    write_topology(Topology.uniform(2, 4), tmp_path / "topology.json")
    return {"SLURM_CONF": str(tmp_path / "etc" / "slurm.conf")}


def test_the_state_directory_is_made_private_at_submission(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    assert _submit(["--", "true"], be, cluster) == "101"
    d = tmp_path / "jobs" / "101"
    assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
    (req,) = be.submitted
    assert "export GANDIVA_JOB_SUBMITTED=5.000000" in req.script  # the job's identity, for its checkpoints
    assert be.cancelled == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a directory as another user")
def test_a_planted_directory_cancels_the_job(cluster: dict[str, str], tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "101"
    d.mkdir()
    (d / "checkpoint.pt").write_bytes(b"someone else's")
    os.chown(d, pwd.getpwnam("nobody").pw_uid, -1)
    be = FakeBackend()
    with pytest.raises(BadRequest) as exc:
        _submit(["--", "true"], be, cluster)
    msg = str(exc.value)
    assert "belongs to nobody" in msg and "job 101 was cancelled" in msg and "\n" not in msg
    assert be.cancelled == ["101"]
    assert read_spec(tmp_path / "jobs", "101") is None  # nothing for the controller to register


def test_a_directory_others_can_write_cancels_the_job(cluster: dict[str, str], tmp_path: Path) -> None:
    d = tmp_path / "jobs" / "101"
    d.mkdir()
    d.chmod(0o777)
    be = FakeBackend()
    with pytest.raises(BadRequest, match=r"writable by others.*job 101 was cancelled"):
        _submit(["--", "true"], be, cluster)
    assert be.cancelled == ["101"]
