"""Slurm's own accounting for a devcluster (`gandiva devcluster up --accounting`): a MariaDB server and a
slurmdbd of the cluster's own, under its state directory, and `sacctmgr` helpers for accounts, users, QOS.

Layout added to the state directory:
  mysql/    MariaDB's datadir (mysql/data), socket and the generated database password (0700, root's)
  etc/slurmdbd.conf (0600: it holds that password; slurmdbd reads it beside SLURM_CONF)
  run/mariadb.pid, run/slurmdbd.pid;  log/mariadb.log, log/slurmdbd.log
MariaDB runs as root on 127.0.0.1 only; the slurmdbd of the release on PATH (the slurmctld's) reaches it
over TCP as a user of its own.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gandiva.errors import ConfigError

DBD_PORT_OFFSET = 19
DB_PORT_OFFSET = 20
DB_USER = "slurm"
DB_START_TIMEOUT_S = 60.0
# slurmdbd creates its tables on its first start: tens of seconds on a loaded 2-core machine.
DBD_START_TIMEOUT_S = 120.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Accounting:
    """The MariaDB and slurmdbd of the devcluster rooted at `state_dir`, on ports from `port_base`."""

    def __init__(self, state_dir: Path, port_base: int) -> None:
        self.state_dir = state_dir
        self.port_base = port_base

    @property
    def dbd_port(self) -> int:
        return self.port_base + DBD_PORT_OFFSET

    @property
    def db_port(self) -> int:
        return self.port_base + DB_PORT_OFFSET

    @property
    def mysql_dir(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def datadir(self) -> Path:
        return self.mysql_dir / "data"

    @property
    def socket(self) -> Path:
        return self.mysql_dir / "mysqld.sock"

    def context(self) -> dict[str, object]:
        """What slurm.conf.j2 and slurmdbd.conf.j2 need (creates the database password once)."""
        return {
            "accounting": True,
            "dbd_port": self.dbd_port,
            "db_port": self.db_port,
            "db_user": DB_USER,
            "db_pass": self._password(),
        }

    def _password(self) -> str:
        self.mysql_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.mysql_dir.chmod(0o700)
        path = self.mysql_dir / "password"
        if not path.exists():
            from slurm_gandiva.requeue.contract import write_atomic

            write_atomic(path, secrets.token_hex(16), mode=0o600)
        return path.read_text().strip()

    def mariadbd_argv(self) -> list[str]:
        """The server's command line; everything on it (no my.cnf is read), so `_is_ours` can tell it."""
        return [
            _which("mariadbd"), "--no-defaults", f"--datadir={self.datadir}", f"--socket={self.socket}",
            f"--port={self.db_port}", "--bind-address=127.0.0.1", "--skip-name-resolve", "--user=root",
            f"--pid-file={self.state_dir / 'run' / 'mariadb.pid'}",
            # A throw-away development database: small, and no flush to disk at every commit.
            "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=0", "--skip-innodb-doublewrite",
            # Slurm's recommended value: at the default 50 s, a lock wait on a loaded machine is fatal to slurmdbd.
            "--innodb-lock-wait-timeout=900",
        ]

    def initialise(self) -> None:
        """mariadb-install-db into an empty datadir (once)."""
        if (self.datadir / "mysql").is_dir():
            return
        # Three tries: with several clusters initialising at once (CI runs releases side by side) one
        # bootstrap was seen to abort at once; a fresh datadir a moment later succeeds.
        for attempt in range(3):
            self.datadir.mkdir(parents=True, exist_ok=True)
            out = subprocess.run(
                [_which("mariadb-install-db"), "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                 "--auth-root-authentication-method=socket", "--skip-test-db"],
                capture_output=True, text=True, timeout=120, check=False,
            )
            if out.returncode == 0:
                return
            shutil.rmtree(self.datadir, ignore_errors=True)
            time.sleep(1.0 + attempt)
        why = [ln for ln in (out.stderr + out.stdout).splitlines() if "ERROR" in ln] or ["no output"]
        raise ConfigError(f"mariadb-install-db failed ({'; '.join(why[-3:])}): see `mariadb-install-db --help`")

    def sql(self, statements: str) -> subprocess.CompletedProcess[str]:
        """Run SQL as MariaDB's root over the server's socket."""
        return subprocess.run(
            [_which("mariadb"), "--no-defaults", f"--socket={self.socket}", "-u", "root", "-e", statements],
            capture_output=True, text=True, timeout=30, check=False,
        )

    def grant_statements(self) -> str:
        """slurmdbd's database user (over TCP from 127.0.0.1) with the rights on its database."""
        pw = self._password()
        return (
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            f"GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1';"
        )


def _which(name: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None
    )
    if path is None:
        raise ConfigError(
            f"devcluster --accounting needs {name} (MariaDB and slurmdbd): run scripts/setup.sh"
        )
    return path


def sacctmgr_args(kind: str, name: str, **fields: str | int) -> list[str]:
    """`add KIND NAME k=v...` (sacctmgr's arguments); names and values checked: no spaces, no options."""
    for value in (name, *map(str, fields.values())):
        if not _NAME.match(value.replace("=", "").replace("/", "").replace(",", "")):
            raise ConfigError(f"sacctmgr: {value!r} is not a valid name or value (letters, digits, _ . -)")
    return ["add", kind, name, *(f"{k}={v}" for k, v in fields.items())]


def run_checked(run: Callable[[list[str]], subprocess.CompletedProcess[str]], argv: list[str]) -> str:
    """Run a sacctmgr command; ConfigError with its one-line reason when it fails."""
    out = run(argv)
    if out.returncode != 0:
        why = [ln.strip() for ln in (out.stderr.strip() or out.stdout.strip()).splitlines() if ln.strip()]
        raise ConfigError(f"{' '.join(argv[:5])} failed: {'; '.join(why[-3:]) or 'no output'}")
    return out.stdout
