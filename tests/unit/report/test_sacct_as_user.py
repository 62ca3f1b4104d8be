"""A real non-root user runs `gandiva sacct` on the controller's SQLite store and sees only their jobs.

The store is the controller's alone (0600, issue 17); an admin may grant a group read access (here the
test user's group), which the controller keeps; anyone else gets one line."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.model import GpuRef, JobSpec, Placement
from slurm_gandiva.store import SliceEnd, Store
from tests.helpers import run_as

GANDIVA = str(Path(sys.executable).with_name("gandiva"))


@pytest.fixture
def shared_db(test_user: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gandiva-sacct-"))
    root.chmod(0o755)  # like /var/lib/gandiva: readable, writable by the controller only
    db = root / "gandiva.db"
    with Store(db) as s:
        for job_id, user in (("1", "alice"), ("2", test_user), ("3", "alice")):
            s.upsert_job(JobSpec(job_id, user, 1, 1, 0.0), at=0.0)
            s.open_slice(job_id, Placement((GpuRef("n1", int(job_id)),)), 10.0)
            s.close_slice(job_id, 20.0, SliceEnd.DONE)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600  # the controller's alone by default
    os.chown(db, 0, pwd.getpwnam(test_user).pw_gid)  # the admin grants a reports group read access
    db.chmod(0o640)
    try:
        yield db
    finally:
        shutil.rmtree(root)


def test_non_root_sees_only_own_jobs(shared_db: Path, test_user: str) -> None:
    assert os.geteuid() == 0, "this test needs root to switch to the test user"
    proc = run_as(test_user, [GANDIVA, "sacct", "--db", str(shared_db), "-P", "-n", "-o", "JobID,User"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"2|{test_user}\n"
    proc = run_as(test_user, [GANDIVA, "sacct", "--db", str(shared_db), "-u", "alice", "-P", "-n"])
    assert (proc.returncode, proc.stdout) == (0, "")
    with Store(shared_db) as writer:  # a running controller: the WAL files exist and change
        writer.upsert_job(JobSpec("4", test_user, 1, 1, 0.0), at=30.0)
        writer.open_slice("4", Placement((GpuRef("n2", 0),)), 30.0)
        proc = run_as(test_user, [GANDIVA, "sacct", "--db", str(shared_db), "-P", "-n", "-o", "JobID,Reason"])
        assert (proc.returncode, proc.stdout) == (0, "2|done\n4|running\n"), proc.stderr
    root = run_as("root", [GANDIVA, "sacct", "--db", str(shared_db), "-P", "-n", "-o", "JobID"])
    assert root.stdout == "1\n2\n3\n4\n"


def test_store_is_not_readable_by_others(shared_db: Path, test_user: str) -> None:
    assert os.geteuid() == 0, "this test needs root to switch users"
    other = "nobody"
    if pwd.getpwnam(other).pw_gid == pwd.getpwnam(test_user).pw_gid:
        pytest.skip("nobody shares the test user's group")
    with Store(shared_db) as writer:  # the controller reopens it: the granted group stays, others stay out
        writer.upsert_job(JobSpec("5", test_user, 1, 1, 0.0), at=40.0)
        for f in (shared_db, Path(f"{shared_db}-wal"), Path(f"{shared_db}-shm")):
            if f.exists():
                assert stat.S_IMODE(f.stat().st_mode) & 0o007 == 0, f
        assert grp.getgrgid(shared_db.stat().st_gid).gr_gid == pwd.getpwnam(test_user).pw_gid
    proc = run_as(other, [GANDIVA, "sacct", "--db", str(shared_db), "-P", "-n"])
    assert proc.returncode != 0 and proc.stdout == ""
    assert "readable by the controller only" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
