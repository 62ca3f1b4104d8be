"""The store suite against a real PostgreSQL server that this module starts (initdb + pg_ctl).

The server runs as the `postgres` system user (when we are root) in a temporary directory on a free
loopback port and is stopped at the end. If it cannot start, the tests fail; they never skip.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.unit.store import store_cases

pytestmark = pytest.mark.postgres


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run scripts/setup.sh")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """Admin URL of a throwaway PostgreSQL server."""
    bindir = _pg_bin()
    owner = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root but there is no `postgres` user: install the postgresql package")
        owner = "postgres"
    root = Path(tempfile.mkdtemp(prefix="gandiva-pg-"))
    data, sock_dir, log = root / "data", root / "sock", root / "pg.log"
    sock_dir.mkdir()
    if owner:
        shutil.chown(root, owner)
        shutil.chown(sock_dir, owner)
    port = _free_port()
    init = subprocess.run(
        _as_owner([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"], owner),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if init.returncode != 0:
        pytest.fail(f"initdb failed: {init.stderr.strip()}")
    opts = f"-p {port} -k {sock_dir} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = subprocess.run(
        _as_owner(
            [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w", "-t", "60", "start"], owner
        ),
        capture_output=True,
        text=True,
        timeout=90,
    )
    if start.returncode != 0:
        tail = log.read_text()[-2000:] if log.exists() else ""
        pytest.fail(f"PostgreSQL did not start: {start.stderr.strip()} {tail}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], owner),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


_counter = itertools.count()


class TestPostgresStore(store_cases.StoreCases):
    @pytest.fixture
    def store_url(self, postgres_url: str) -> Iterator[str]:
        """A fresh database per test, dropped afterwards."""
        name = f"gandiva_test_{os.getpid()}_{next(_counter)}"
        admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield postgres_url.rsplit("/", 1)[0] + "/" + name
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def test_server_is_really_postgresql(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        assert "PostgreSQL" in str(conn.execute(sa.text("SELECT version()")).scalar())
    engine.dispose()
