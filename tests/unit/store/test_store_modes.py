"""The controller's SQLite store holds every user's jobs: its files are not readable by other users."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm_gandiva.model import JobSpec
from slurm_gandiva.store import Store


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_new_store_is_private(tmp_path: Path) -> None:
    os.umask(0o022)
    db = tmp_path / "gandiva.db"
    with Store(db) as s:
        s.upsert_job(JobSpec("1", "alice", 1, 1, 0.0), at=0.0)
        lock = s.lock_controller("test")
        try:
            for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.lock")):
                assert f.exists() and mode(f) == 0o600, f
        finally:
            lock.release()


def test_a_world_readable_store_is_tightened_on_open(tmp_path: Path) -> None:
    db = tmp_path / "gandiva.db"
    Store(db).close()
    db.chmod(0o644)  # an older gandiva's, or an admin's chmod
    Store(db).close()
    assert mode(db) == 0o640  # others lose read; a group an admin granted keeps it
