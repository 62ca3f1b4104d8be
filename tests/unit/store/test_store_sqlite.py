"""The store suite on SQLite files, plus SQLite-specific behaviour (URL handling, WAL, kill -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import GpuRef, JobSpec, Placement
from slurm_gandiva.store import Store, default_url, normalize_url
from tests.unit.store import store_cases


class TestSqliteStore(store_cases.StoreCases):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'gandiva.db'}"


def test_bare_path_means_sqlite(tmp_path: Path) -> None:
    with Store(tmp_path / "db.sqlite") as s:
        assert s.url == f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert default_url(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'gandiva.db'}"


def test_wal_and_foreign_keys_are_on(tmp_path: Path) -> None:
    with Store(tmp_path / "db") as s, s.engine.connect() as conn:
        assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(sa.text("PRAGMA foreign_keys")).scalar() == 1


def test_plain_postgresql_url_uses_psycopg3() -> None:
    assert normalize_url("postgresql://u@h:5/db").drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/db", "unsupported database"),
        ("sqlite://", "needs a file"),
        ("sqlite:////no/such/dir/x.db", "does not exist"),
        ("://", "bad database URL"),
    ],
)
def test_bad_urls_are_one_line_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        Store(url)
    assert "\n" not in str(err.value)


def test_unreachable_postgres_is_a_config_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigError, match="cannot open database"):
        Store(f"postgresql://nobody@127.0.0.1:{port}/none")


_KILLER = """
import os, signal, sys
from slurm_gandiva.model import GpuRef, JobSpec, Placement
from slurm_gandiva.store import Store
s = Store(sys.argv[1])
for i in range(20):
    s.upsert_job(JobSpec(str(i), "alice", 1, 1, float(i)), at=float(i))
    s.open_slice(str(i), Placement((GpuRef("n1", i % 4),)), float(i))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_every_write_survives_kill_9(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db'}"
    proc = subprocess.run([sys.executable, "-c", _KILLER, url], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Store(url) as s:
        assert len(s.list_jobs()) == 20
        cur = s.current_slice("19")
        assert cur is not None and cur.placement == Placement((GpuRef("n1", 3),))
    assert os.path.exists(tmp_path / "db")


def test_two_stores_see_each_others_writes(tmp_path: Path) -> None:
    with Store(tmp_path / "db") as a, Store(tmp_path / "db") as b:
        a.upsert_job(JobSpec("1", "alice", 1, 1, 0.0), at=0.0)
        assert b.get_job("1") is not None


def test_readonly_never_creates_or_writes(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(ConfigError, match="no database at"):
        Store(missing, readonly=True)
    assert not missing.exists()
    with Store(tmp_path / "db") as w:
        w.upsert_job(JobSpec("1", "alice", 1, 1, 0.0), at=0.0)
        with Store(tmp_path / "db", readonly=True) as r:  # while the writer holds the WAL
            assert r.get_job("1") is not None
            with pytest.raises(sa.exc.OperationalError, match="readonly"):
                r.upsert_job(JobSpec("2", "bob", 1, 1, 0.0), at=0.0)
        w.upsert_job(JobSpec("3", "carol", 1, 1, 0.0), at=0.0)
    with Store(tmp_path / "db", migrate_schema=False) as r:  # no writer any more
        assert [j.job_id for j in r.list_jobs()] == ["1", "3"]


def test_readonly_refuses_an_old_schema(tmp_path: Path) -> None:
    from slurm_gandiva.store.migrations import migrate

    raw = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with raw.begin() as conn:
        migrate(conn, target=1)
    raw.dispose()
    with pytest.raises(ConfigError, match="schema version 1"):
        Store(tmp_path / "old.db", readonly=True)
