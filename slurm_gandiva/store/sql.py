"""`Store`: the SQLAlchemy implementation of `StoreApi` (SQLite file by default, PostgreSQL by URL)."""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
import socket
import sqlite3
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from slurm_gandiva.errors import ConfigError, ControllerRunning
from slurm_gandiva.model import GpuRef, JobSpec, JobState, Locality, Placement
from slurm_gandiva.plan import Action
from slurm_gandiva.store.api import (
    DecisionRecord,
    EventRecord,
    JobRecord,
    NoSuchRecord,
    Outcome,
    RateRecord,
    SliceEnd,
    SliceRecord,
    StepRecord,
    StoreApi,
    StoreConflict,
)
from slurm_gandiva.store.migrations import LATEST, current_version, migrate
from slurm_gandiva.store.models import DecisionRow, EventRow, JobRow, RateRow, SliceRow, StepRow

DB_FILE = "gandiva.db"

R = TypeVar("R", JobRow, DecisionRow, StepRow)
T = TypeVar("T")


def default_url(state_dir: str | os.PathLike[str]) -> str:
    """The SQLite database URL inside a controller state directory."""
    return f"sqlite:///{Path(state_dir).resolve() / DB_FILE}"


def normalize_url(url: str | os.PathLike[str]) -> URL:
    """Parse a database URL; a bare path means a SQLite file, plain postgresql:// means psycopg 3."""
    text = os.fspath(url)
    if "://" not in text:
        text = f"sqlite:///{Path(text).resolve()}"
    try:
        parsed = make_url(text)
    except ArgumentError:
        raise ConfigError(
            f"bad database URL {text!r}: use sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(f"unsupported database {parsed.drivername!r}: use sqlite:///PATH or postgresql://...")
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise ConfigError("the SQLite store needs a file: use sqlite:///PATH")
        if not Path(db).parent.is_dir():
            raise ConfigError(f"directory of the database {db} does not exist: create it or fix the URL")
    return parsed


_WRITE = "gandiva_write"
DB_MODE = 0o600  # a new SQLite store; SQLite gives its -wal and -shm files the database's mode and owner
log = logging.getLogger(__name__)


def _private_sqlite(path: Path) -> None:
    """Keep the store's files from other users: create the database 0600 before SQLite does, and take the
    "other" bits off the database, its -wal/-shm and the lock file (a group an admin granted is kept, so
    that a reports group may run `gandiva sacct`). The controller's users' jobs are in there."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, DB_MODE))
    except FileExistsError:
        pass
    except OSError:
        return  # SQLite reports what is wrong with the path
    for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")):
        try:
            st = os.lstat(f)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o007 and st.st_uid == os.geteuid():
                os.chmod(f, stat.S_IMODE(st.st_mode) & ~0o007)
                log.warning("store: %s was readable by other users: now mode %04o", f,
                            stat.S_IMODE(st.st_mode) & ~0o007)
        except OSError:
            continue


def _sqlite_begin(conn: sa.Connection) -> None:
    # Write transactions take SQLite's write lock up front (BEGIN IMMEDIATE), so two writers wait for
    # each other (busy_timeout) instead of failing when a read turns into a write, and concurrent
    # schema upgrades run one after the other.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # no implicit BEGIN from pysqlite: _sqlite_begin emits it
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    # WAL is a property of the file: set once, by the first connection. SQLite does not wait on its busy
    # handler for that switch, so a connection opened while another one sets it up retries a while.
    deadline = time.monotonic() + 10.0
    while cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            cur.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL is durable against process kill (-9)
    cur.close()


def _sqlite_readonly_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _readonly_sqlite(path: str) -> Callable[[], sqlite3.Connection]:
    """Connections that never write: mode=ro while the controller keeps the WAL files; when they are gone
    (no writer) and we may not create them, the file is read as immutable."""
    uri = "file:" + urllib.parse.quote(path)

    def connect() -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(uri + "?mode=ro", uri=True, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            return sqlite3.connect(uri + "?immutable=1", uri=True, check_same_thread=False)

    return connect


def gpus_to_text(gpus: Iterable[GpuRef]) -> str:
    return ",".join(str(g) for g in gpus)


def gpus_from_text(text: str) -> tuple[GpuRef, ...]:
    out = []
    for item in filter(None, text.split(",")):
        node, _, index = item.rpartition(":")
        out.append(GpuRef(node, int(index)))
    return tuple(out)


def _job(row: Any) -> JobRecord:
    """A job record from an ORM row or a plain column row with the same names."""
    spec = JobSpec(
        job_id=row.id,
        user=row.user,
        min_gpus=row.min_gpus,
        max_gpus=row.max_gpus,
        submit_time=row.submit_time,
        total_work=row.total_work,
        name=row.name,
        model=row.model,
        account=row.account,
        qos=row.qos,
    )
    return JobRecord(
        spec, JobState(row.state), row.partition, row.state_dir, row.created, row.updated, row.suspend_signal or ""
    )


def _slice(row: Any, job: Any) -> SliceRecord:
    """A slice record from an ORM row or a plain column row with the same names, and its job's `user`,
    `account` and `qos` (a JobRow, or the same row when it joined them)."""
    return SliceRecord(
        id=row.id,
        job_id=row.job_id,
        user=job.user,
        account=job.account,
        qos=job.qos,
        seq=row.seq,
        placement=Placement(gpus_from_text(row.gpus), shared=row.shared),
        start=row.start_time,
        end=row.end_time,
        end_reason=SliceEnd(row.end_reason) if row.end_reason else None,
    )


def _decision(row: DecisionRow) -> DecisionRecord:
    placement = None if row.gpus is None else Placement(gpus_from_text(row.gpus), shared=row.shared)
    return DecisionRecord(
        id=row.id,
        job_id=row.job_id,
        action=Action(row.action),
        placement=placement,
        reason=row.reason,
        intent_at=row.intent_at,
        outcome=Outcome(row.outcome) if row.outcome else None,
        outcome_at=row.outcome_at,
        detail=row.detail,
    )


def _step(row: StepRow) -> StepRecord:
    return StepRecord(row.id, row.decision_id, row.step, row.start_time, row.end_time, row.detail)


def _as_tuple(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


# Ids per `IN (...)` list of the batched reads: under the 999 bound parameters of SQLite before 3.32.
IN_CHUNK = 900


def _chunks(ids: Iterable[str]) -> Iterator[tuple[str, ...]]:
    uniq = tuple(dict.fromkeys(ids))
    for i in range(0, len(uniq), IN_CHUNK):
        yield uniq[i : i + IN_CHUNK]


_JOB_COLUMNS = tuple(JobRow.__table__.columns)
_SLICE_COLUMNS = (
    SliceRow.id, SliceRow.job_id, SliceRow.seq, SliceRow.gpus, SliceRow.shared, SliceRow.start_time,
    SliceRow.end_time, SliceRow.end_reason, JobRow.user, JobRow.account, JobRow.qos,
)


def _must_get(s: Session, row_type: type[R], key: str | int, what: str) -> R:
    """The stored row `key`; NoSuchRecord ("no {what} {key} in the store") when there is none."""
    row = s.get(row_type, key)
    if row is None:
        raise NoSuchRecord(f"no {what} {key} in the store")
    return row


def _insert(s: Session, row: DecisionRow | StepRow | RateRow | EventRow) -> int:
    """Add a new row and return the id the database gave it."""
    s.add(row)
    s.flush()
    return row.id


def _job_owner(s: Session, job_id: str) -> Any:
    """The job's user, account and qos (a row with those names)."""
    return s.execute(sa.select(JobRow.user, JobRow.account, JobRow.qos).where(JobRow.id == job_id)).one()


CONTROLLER_LOCK_KEY = 7412002  # pg advisory lock of the running controller (7412001: schema upgrades)


class ControllerLock:
    """A held one-controller-per-state lock (see `Store.lock_controller`)."""

    def release(self) -> None:
        raise NotImplementedError


def _refusal(holder: str, what: str) -> ControllerRunning:
    return ControllerRunning(
        f"another controller ({holder or 'holder unknown'}) already runs on {what}: stop it first, "
        "or give this one another state_dir / database_url"
    )


class _FileLock(ControllerLock):
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: Path, who: str) -> _FileLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise _refusal(holder, str(path.with_suffix(""))) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who}\n".encode(), 0)
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the file drops the flock
            self._fd = None


class _AdvisoryLock(ControllerLock):
    def __init__(self, engine: Engine, conn: sa.Connection) -> None:
        self._engine: Engine | None = engine
        self._conn = conn

    @classmethod
    def take(cls, url: URL, shown: str, who: str) -> _AdvisoryLock:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        conn = engine.connect()
        try:
            conn.execute(sa.text("SELECT set_config('application_name', :n, false)"),
                         {"n": f"gandiva-controller {who}"[:63]})
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": CONTROLLER_LOCK_KEY}).scalar()
            conn.commit()
            if not got:
                holder = conn.execute(sa.text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :k "
                    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ), {"k": CONTROLLER_LOCK_KEY}).scalar()
                raise _refusal(str(holder or "").removeprefix("gandiva-controller "), shown)
        except BaseException:
            conn.close()
            engine.dispose()
            raise
        return cls(engine, conn)

    def release(self) -> None:
        if self._engine is not None:
            with contextlib.suppress(sa.exc.DBAPIError):
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": CONTROLLER_LOCK_KEY})
            self._conn.close()
            self._engine.dispose()
            self._engine = None


def check_database(url: str | os.PathLike[str], *, timeout: float = 10.0) -> str:
    """Whether a controller could open its store at `url`, creating or changing nothing: a SQLite file's
    directory must be writable (or creatable), a server must answer, and no schema may be newer than this
    gandiva's. Returns what was found (one line); ConfigError (one line, what to do) when it could not."""
    u = normalize_url(url)
    shown = u.render_as_string(hide_password=True)
    kwargs: dict[str, Any] = {}
    if u.get_backend_name() == "sqlite":
        path = Path(str(u.database))
        if not path.exists():
            parent = next((d for d in path.parents if d.exists()), Path("/"))
            if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"cannot create the database {path}: {parent} is not a writable directory; "
                                  "fix state_dir or database_url")
            return f"database {path} will be created"
        if not path.is_file():
            raise ConfigError(f"database {path} is not a file: fix state_dir or database_url")
        kwargs["creator"] = _readonly_sqlite(str(path))
        target: URL | str = "sqlite://"
    else:
        target = u
        kwargs["connect_args"] = {"connect_timeout": max(1, int(timeout))}
    try:
        engine = sa.create_engine(target, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigError(f"no driver for {u.drivername}: install psycopg[binary] ({exc})") from None
    try:
        with engine.connect() as conn:
            version = current_version(conn)
    except sa.exc.DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
        raise ConfigError(f"cannot open database {shown}: {reason}; check database_url and the server") from None
    finally:
        engine.dispose()
    if version > LATEST:
        raise ConfigError(
            f"database {shown} has schema version {version}, newer than this gandiva's {LATEST}: upgrade gandiva"
        )
    return f"database {shown} answers (schema version {version})"


class Store:
    """The controller's history and state. Safe to use from several processes (each its own Store).

    Every write method commits its own short transaction before returning.
    """

    def __init__(self, url: str | os.PathLike[str], *, readonly: bool = False, migrate_schema: bool = True) -> None:
        """Open (and create or upgrade) the database.

        `readonly` opens an existing database for reading only (reports, squeue): it never creates,
        upgrades or writes, and works for users who may only read the SQLite file.
        `migrate_schema=False` is an older spelling of `readonly=True`.
        """
        readonly = readonly or not migrate_schema
        self._url = normalize_url(url)
        self._readonly = readonly
        kwargs: dict[str, Any] = {}
        sqlite = self._url.get_backend_name() == "sqlite"
        if not sqlite:
            kwargs["pool_pre_ping"] = True
        elif readonly:
            if not Path(str(self._url.database)).is_file():
                raise ConfigError(f"no database at {self._url.database}: check the URL (the controller creates it)")
            if not os.access(str(self._url.database), os.R_OK):
                raise ConfigError(
                    f"database {self._url.database} is readable by the controller only (it holds every user's "
                    "jobs): run this as root, or ask your admin to grant a group read access"
                )
            kwargs["creator"] = _readonly_sqlite(str(self._url.database))
        else:
            _private_sqlite(Path(str(self._url.database)))
        try:
            self._engine: Engine = sa.create_engine(self._url if not (sqlite and readonly) else "sqlite://", **kwargs)
        except (NoSuchModuleError, ImportError) as exc:
            raise ConfigError(f"no driver for {self._url.drivername}: install psycopg[binary] ({exc})") from None
        if sqlite:
            sa.event.listen(self._engine, "connect", _sqlite_readonly_pragmas if readonly else _sqlite_pragmas)
            if not readonly:
                sa.event.listen(self._engine, "begin", _sqlite_begin)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            if readonly:
                with self._engine.connect() as conn:
                    version = current_version(conn)
                if version != LATEST:
                    raise ConfigError(
                        f"database {self.url} has schema version {version}, this gandiva reads {LATEST}: "
                        "start the controller once to upgrade it (or use the matching gandiva)"
                    )
            else:
                with self._engine.connect() as conn, conn.execution_options(**{_WRITE: True}).begin():
                    if not sqlite:
                        # one upgrader at a time when several processes open the database at once
                        conn.execute(sa.text("SELECT pg_advisory_xact_lock(7412001)"))
                    migrate(conn)
        except sa.exc.DBAPIError as exc:
            self._engine.dispose()
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise ConfigError(f"cannot open database {self.url}: {reason}; check the database URL") from None
        except ConfigError:
            self._engine.dispose()
            raise

    @property
    def url(self) -> str:
        return self._url.render_as_string(hide_password=True)

    @property
    def engine(self) -> Engine:
        return self._engine

    def schema_version(self) -> int:
        with self._engine.connect() as conn:
            return current_version(conn)

    def close(self) -> None:
        self._engine.dispose()

    def lock_controller(self, holder: str | None = None) -> ControllerLock:
        """Take the one-controller-per-state lock, held until `release()` (or the process ends).

        SQLite: flock() on `<database>.lock`, which names the holder. PostgreSQL: a session advisory lock
        on a connection of its own (works between hosts sharing the server); the holder is named by its
        connection's application_name. ControllerRunning (one line, naming the holder) when it is taken.
        """
        who = holder or f"pid {os.getpid()} on host {socket.gethostname()}"
        if self._url.get_backend_name() == "sqlite":
            return _FileLock.take(Path(f"{self._url.database}.lock"), who)
        return _AdvisoryLock.take(self._url, self.url, who)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with Session(bind=conn, expire_on_commit=False) as session, session.begin():
                yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    def _lookup(self, row_type: type[R], key: str | int, record: Callable[[R], T]) -> T | None:
        """`record(row)` of the stored row `key`, or None when there is none."""
        with self._read() as s:
            row = s.get(row_type, key)
            return None if row is None else record(row)

    # -- jobs -------------------------------------------------------------------------------------
    def upsert_job(
        self,
        spec: JobSpec,
        *,
        at: float,
        state: JobState | None = None,
        partition: str | None = None,
        state_dir: str | None = None,
        signal: str | None = None,
    ) -> JobRecord:
        with self._write() as s:
            row = s.get(JobRow, spec.job_id)
            if row is None:
                row = JobRow(
                    id=spec.job_id,
                    state=(state or JobState.QUEUED).value,
                    partition=partition or "",
                    state_dir=state_dir or "",
                    created=at,
                    suspend_signal=signal or "",
                    account=spec.account,
                    qos=spec.qos,
                )
                s.add(row)
            else:
                if state is not None:
                    row.state = state.value
                if partition is not None:
                    row.partition = partition
                if state_dir is not None:
                    row.state_dir = state_dir
                if signal is not None:
                    row.suspend_signal = signal
                if spec.account:
                    row.account = spec.account
                if spec.qos:
                    row.qos = spec.qos
            row.user = spec.user
            row.name = spec.name
            row.min_gpus = spec.min_gpus
            row.max_gpus = spec.max_gpus
            row.submit_time = spec.submit_time
            row.total_work = spec.total_work
            row.model = spec.model
            row.updated = at
            s.flush()
            return _job(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._lookup(JobRow, job_id, _job)

    def jobs_by_id(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        out: dict[str, JobRecord] = {}
        with self._engine.connect() as conn:
            for ids in _chunks(job_ids):
                for row in conn.execute(sa.select(*_JOB_COLUMNS).where(JobRow.id.in_(ids))):
                    out[row.id] = _job(row)
        return out

    def list_jobs(
        self, *, states: Iterable[JobState] | None = None, users: Iterable[str] | None = None
    ) -> tuple[JobRecord, ...]:
        q = sa.select(JobRow).order_by(JobRow.submit_time, JobRow.id)
        if states is not None:
            q = q.where(JobRow.state.in_([st.value for st in states]))
        if users is not None:
            q = q.where(JobRow.user.in_(tuple(users)))
        with self._read() as s:
            return tuple(_job(r) for r in s.scalars(q))

    def set_job_state(self, job_id: str, state: JobState, *, at: float) -> JobRecord:
        with self._write() as s:
            row = _must_get(s, JobRow, job_id, "job")
            row.state = state.value
            row.updated = at
            s.flush()
            return _job(row)

    # -- slices -----------------------------------------------------------------------------------
    @staticmethod
    def _open_row(s: Session, job_id: str) -> SliceRow | None:
        q = (
            sa.select(SliceRow)
            .where(SliceRow.job_id == job_id, SliceRow.end_time.is_(None))
            .order_by(SliceRow.id.desc())
        )
        return s.scalars(q).first()

    def open_slice(self, job_id: str, placement: Placement, start: float) -> SliceRecord:
        with self._write() as s:
            job = _must_get(s, JobRow, job_id, "job")
            open_row = self._open_row(s, job_id)
            if open_row is not None:
                existing = _slice(open_row, job)
                if existing.placement == placement:
                    return existing
                raise StoreConflict(f"job {job_id} already has an open slice on {existing.placement}; close it first")
            count = s.scalar(sa.select(sa.func.count()).select_from(SliceRow).where(SliceRow.job_id == job_id))
            row = SliceRow(
                job_id=job_id,
                seq=int(count or 0) + 1,
                nodes=",".join(placement.nodes),
                gpus=gpus_to_text(placement.gpus),
                shared=placement.shared,
                start_time=start,
            )
            s.add(row)
            s.flush()
            return _slice(row, job)

    def close_slice(self, job_id: str, end: float, reason: SliceEnd) -> SliceRecord | None:
        with self._write() as s:
            row = self._open_row(s, job_id)
            if row is None:
                return None
            row.end_time = max(end, row.start_time)
            row.end_reason = reason.value
            s.flush()
            return _slice(row, _job_owner(s, job_id))

    def current_slice(self, job_id: str) -> SliceRecord | None:
        return self.open_slices([job_id]).get(job_id)

    def open_slices(self, job_ids: Iterable[str]) -> dict[str, SliceRecord]:
        out: dict[str, SliceRecord] = {}
        q = (
            sa.select(*_SLICE_COLUMNS)
            .join(JobRow, JobRow.id == SliceRow.job_id)
            .where(SliceRow.end_time.is_(None))
            .order_by(SliceRow.id)  # the newest open slice wins, as in current_slice
        )
        with self._engine.connect() as conn:
            for ids in _chunks(job_ids):
                for row in conn.execute(q.where(SliceRow.job_id.in_(ids))):
                    out[row.job_id] = _slice(row, row)
        return out

    def slices(
        self,
        *,
        job_ids: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
        start: float | None = None,
        end: float | None = None,
        accounts: Iterable[str] | None = None,
    ) -> tuple[SliceRecord, ...]:
        # plain column rows, not ORM objects: several times faster for long histories (sacct)
        q = sa.select(*_SLICE_COLUMNS).join(JobRow, JobRow.id == SliceRow.job_id).order_by(
            SliceRow.start_time, SliceRow.id
        )
        names = _as_tuple(users)
        if names is not None:
            q = q.where(JobRow.user.in_(names))
        in_accounts = _as_tuple(accounts)
        if in_accounts is not None:
            q = q.where(JobRow.account.in_(in_accounts))
        if start is not None:
            q = q.where(sa.or_(SliceRow.end_time.is_(None), SliceRow.end_time >= start))
        if end is not None:
            q = q.where(SliceRow.start_time <= end)
        with self._engine.connect() as conn:
            if job_ids is None:
                return tuple(_slice(row, row) for row in conn.execute(q).all())
            rows = [row for ids in _chunks(job_ids) for row in conn.execute(q.where(SliceRow.job_id.in_(ids)))]
        rows.sort(key=lambda r: (r.start_time, r.id))  # the chunks' rows in one start order
        return tuple(_slice(row, row) for row in rows)

    # -- decisions and protocol steps -------------------------------------------------------------
    def record_intent(self, job_id: str, action: Action, placement: Placement | None, reason: str, at: float) -> int:
        with self._write() as s:
            _must_get(s, JobRow, job_id, "job")
            row = DecisionRow(
                job_id=job_id,
                action=action.value,
                gpus=None if placement is None else gpus_to_text(placement.gpus),
                shared=bool(placement and placement.shared),
                reason=reason,
                intent_at=at,
                detail="",
            )
            return _insert(s, row)

    def record_step(
        self,
        decision_id: int,
        step: str | enum.Enum,
        start: float,
        end: float | None = None,
        detail: str = "",
    ) -> int:
        name = str(step.value) if isinstance(step, enum.Enum) else step
        with self._write() as s:
            _must_get(s, DecisionRow, decision_id, "decision")
            row = StepRow(decision_id=decision_id, step=name, start_time=start, end_time=end, detail=detail)
            return _insert(s, row)

    def end_step(self, step_id: int, end: float, detail: str | None = None) -> StepRecord:
        with self._write() as s:
            row = _must_get(s, StepRow, step_id, "protocol step")
            row.end_time = end
            if detail is not None:
                row.detail = detail
            s.flush()
            return _step(row)

    def steps(self, decision_id: int | None = None) -> tuple[StepRecord, ...]:
        q = sa.select(StepRow).order_by(StepRow.start_time, StepRow.id)
        if decision_id is not None:
            q = q.where(StepRow.decision_id == decision_id)
        with self._read() as s:
            return tuple(_step(r) for r in s.scalars(q))

    def record_outcome(self, decision_id: int, outcome: Outcome, detail: str, at: float) -> DecisionRecord:
        with self._write() as s:
            row = _must_get(s, DecisionRow, decision_id, "decision")
            row.outcome = outcome.value
            row.outcome_at = at
            row.detail = detail
            s.flush()
            return _decision(row)

    def get_decision(self, decision_id: int) -> DecisionRecord | None:
        return self._lookup(DecisionRow, decision_id, _decision)

    def open_intents(self) -> tuple[DecisionRecord, ...]:
        q = sa.select(DecisionRow).where(DecisionRow.outcome.is_(None)).order_by(DecisionRow.id)
        with self._read() as s:
            return tuple(_decision(r) for r in s.scalars(q))

    def decisions(
        self, *, job_ids: Iterable[str] | None = None, since: float | None = None
    ) -> tuple[DecisionRecord, ...]:
        q = sa.select(DecisionRow).order_by(DecisionRow.intent_at, DecisionRow.id)
        ids = _as_tuple(job_ids)
        if ids is not None:
            q = q.where(DecisionRow.job_id.in_(ids))
        if since is not None:
            q = q.where(DecisionRow.intent_at >= since)
        with self._read() as s:
            return tuple(_decision(r) for r in s.scalars(q))

    # -- rates and events -------------------------------------------------------------------------
    def record_rate(self, job_id: str, gpus: int, locality: Locality, rate: float, at: float) -> int:
        with self._write() as s:
            _must_get(s, JobRow, job_id, "job")
            return _insert(s, RateRow(job_id=job_id, gpus=gpus, locality=int(locality), rate=rate, at=at))

    def rates(self, job_id: str) -> tuple[RateRecord, ...]:
        return self.rates_by_job([job_id]).get(job_id, ())

    def rates_by_job(self, job_ids: Iterable[str]) -> dict[str, tuple[RateRecord, ...]]:
        out: dict[str, list[RateRecord]] = {}
        cols = (RateRow.id, RateRow.job_id, RateRow.gpus, RateRow.locality, RateRow.rate, RateRow.at)
        q = sa.select(*cols).order_by(RateRow.at, RateRow.id)
        with self._engine.connect() as conn:
            for ids in _chunks(job_ids):
                for r in conn.execute(q.where(RateRow.job_id.in_(ids))):
                    out.setdefault(r.job_id, []).append(
                        RateRecord(r.id, r.job_id, r.gpus, Locality(r.locality), r.rate, r.at)
                    )
        return {jid: tuple(rs) for jid, rs in out.items()}

    def record_event(self, kind: str, job_id: str | None, detail: str, at: float) -> int:
        with self._write() as s:
            return _insert(s, EventRow(kind=kind, job_id=job_id, detail=detail, at=at))

    def events(
        self,
        *,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        since: float | None = None,
    ) -> tuple[EventRecord, ...]:
        q = sa.select(EventRow).order_by(EventRow.at, EventRow.id)
        if job_id is not None:
            q = q.where(EventRow.job_id == job_id)
        names = _as_tuple(kinds)
        if names is not None:
            q = q.where(EventRow.kind.in_(names))
        if since is not None:
            q = q.where(EventRow.at >= since)
        with self._read() as s:
            return tuple(EventRecord(r.id, r.kind, r.job_id, r.detail, r.at) for r in s.scalars(q))


if TYPE_CHECKING:

    def _conforms(store: Store) -> StoreApi:  # mypy checks that Store implements the protocol
        return store
