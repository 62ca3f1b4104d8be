"""gandiva sbatch makes the job's state directory (0700, the user's) while the job is held, in a private
directory of the submission that nothing planted in the world-writable jobs root is in the way of; the job
script carries its identity."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from slurm_gandiva.model import Topology
from slurm_gandiva.topology.file import write_topology
from tests.unit.submit.test_submit_cli import FakeBackend, _submit, private_dir, submitted_spec


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
    (req,) = be.submitted
    private = private_dir(req, tmp_path / "jobs")
    for d in (private, private / "101"):
        assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
    assert f'export GANDIVA_STATE_DIR={private}/"$SLURM_JOB_ID"' in req.script
    assert "export GANDIVA_JOB_SUBMITTED=5.000000" in req.script  # the job's identity, for its checkpoints
    assert be.cancelled == []


def test_each_submission_gets_a_new_unguessable_directory(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    _submit(["--", "true"], be, cluster)
    _submit(["--", "true"], be, cluster)
    a, b = (private_dir(r, tmp_path / "jobs") for r in be.submitted)
    assert a != b and a.name.startswith("alice.") and len(a.name) >= len("alice.") + 8


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a directory as another user")
def test_a_planted_directory_is_not_in_the_way(cluster: dict[str, str], tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    nobody = pwd.getpwnam("nobody").pw_uid
    (jobs / "101").mkdir()
    (jobs / "101" / "checkpoint.pt").write_bytes(b"someone else's")
    (jobs / "spec").mkdir()
    os.chown(jobs / "101", nobody, -1)
    os.chown(jobs / "spec", nobody, -1)
    be = FakeBackend()
    assert _submit(["--gpus", "2:4", "--", "true"], be, cluster) == "101"
    assert be.cancelled == []
    spec = submitted_spec(be.submitted[0], jobs, "101")
    assert spec is not None and (spec.min_gpus, spec.max_gpus) == (2, 4)
    assert not any((jobs / "spec").iterdir())
    assert (private_dir(be.submitted[0], jobs) / "101").is_dir()
    assert [p.name for p in (jobs / "101").iterdir()] == ["checkpoint.pt"]  # the planted one, untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a link")
def test_roots_submission_never_writes_through_a_link(cluster: dict[str, str], tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (jobs / "spec").symlink_to(elsewhere)
    (jobs / "101").symlink_to(elsewhere)
    be = FakeBackend()
    assert _submit(["--", "true"], be, cluster) == "101"
    assert not any(elsewhere.iterdir())
