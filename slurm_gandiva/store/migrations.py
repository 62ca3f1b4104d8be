"""Ordered schema migrations. Each is frozen once released: never edit one, append a new one.

`MIGRATIONS[i]` takes the schema from version i to i + 1 and uses only SQLAlchemy Core on the given
connection, so it runs the same on SQLite and PostgreSQL. `migrate()` applies the pending ones in one
transaction, so an interrupted upgrade leaves the old schema (and its history) as it was.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from slurm_gandiva.errors import ConfigError


def _v1(conn: Connection) -> None:
    """Initial schema: jobs, slices, decisions, events."""
    md = sa.MetaData()
    sa.Table(
        "schema_version",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
    )
    sa.Table(
        "jobs",
        md,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("min_gpus", sa.Integer, nullable=False),
        sa.Column("max_gpus", sa.Integer, nullable=False),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("total_work", sa.Float, nullable=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("partition", sa.String(128), nullable=False),
        sa.Column("state_dir", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    sa.Table(
        "slices",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("nodes", sa.Text, nullable=False),
        sa.Column("gpus", sa.Text, nullable=False),
        sa.Column("start_time", sa.Float, nullable=False, index=True),
        sa.Column("end_time", sa.Float, nullable=True),
        sa.Column("end_reason", sa.String(16), nullable=True),
        sa.Index("ix_slices_job_end", "job_id", "end_time"),
    )
    sa.Table(
        "decisions",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("intent_at", sa.Float, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True, index=True),
        sa.Column("outcome_at", sa.Float, nullable=True),
        sa.Column("detail", sa.Text, nullable=False),
    )
    sa.Table(
        "events",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(64), nullable=False, index=True),
        sa.Column("job_id", sa.String(64), nullable=True, index=True),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False, index=True),
    )
    md.create_all(conn)


def _v2(conn: Connection) -> None:
    """Packing and introspection: shared flag on slices/decisions, protocol steps, measured rates."""
    for table in ("slices", "decisions"):
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN shared BOOLEAN NOT NULL DEFAULT FALSE"))
    md = sa.MetaData()
    sa.Table("jobs", md, sa.Column("id", sa.String(64), primary_key=True))
    sa.Table("decisions", md, sa.Column("id", sa.Integer, primary_key=True))
    sa.Table(
        "protocol_steps",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "decision_id",
            sa.Integer,
            sa.ForeignKey("decisions.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("step", sa.String(64), nullable=False),
        sa.Column("start_time", sa.Float, nullable=False),
        sa.Column("end_time", sa.Float, nullable=True),
        sa.Column("detail", sa.Text, nullable=False),
    )
    sa.Table(
        "rates",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("locality", sa.Integer, nullable=False),
        sa.Column("rate", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    md.create_all(conn, tables=[md.tables["protocol_steps"], md.tables["rates"]])


def _v3(conn: Connection) -> None:
    """Each job's own suspend signal (`gandiva sbatch --signal`; '' for the controller's configured one)."""
    conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN suspend_signal VARCHAR(16) NOT NULL DEFAULT ''"))


def _v4(conn: Connection) -> None:
    """Each job's Slurm account and QOS ('' for a job registered before, or run without one)."""
    for column in ("account", "qos"):
        conn.execute(sa.text(f"ALTER TABLE jobs ADD COLUMN {column} VARCHAR(64) NOT NULL DEFAULT ''"))


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v1, _v2, _v3, _v4)
LATEST = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    """The schema version of the database (0 when it is empty)."""
    if not sa.inspect(conn).has_table("schema_version"):
        return 0
    row = conn.execute(sa.text("SELECT version FROM schema_version WHERE id = 1")).first()
    return int(row[0]) if row else 0


def migrate(conn: Connection, target: int = LATEST) -> int:
    """Bring the schema up to `target` (inside the caller's transaction); returns the version before."""
    before = current_version(conn)
    if before > LATEST:
        raise ConfigError(
            f"database schema version {before} is newer than this gandiva understands ({LATEST}): upgrade gandiva"
        )
    for version in range(before, target):
        MIGRATIONS[version](conn)
        if version == 0:
            conn.execute(sa.text("INSERT INTO schema_version (id, version) VALUES (1, 1)"))
        else:
            conn.execute(sa.text("UPDATE schema_version SET version = :v WHERE id = 1"), {"v": version + 1})
    return before
