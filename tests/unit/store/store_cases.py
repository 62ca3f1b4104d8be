"""Store behaviour shared by the SQLite (unit) and PostgreSQL (integration) suites.

Subclasses provide a `store_url` fixture giving a fresh, empty database URL per test.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from slurm_gandiva.errors import ConfigError, ControllerRunning
from slurm_gandiva.model import GpuRef, JobSpec, JobState, Locality, Placement
from slurm_gandiva.plan import Action
from slurm_gandiva.store import NoSuchRecord, Outcome, SliceEnd, Store, StoreConflict
from slurm_gandiva.store.migrations import LATEST, migrate
from slurm_gandiva.store.models import Base
from slurm_gandiva.store.sql import normalize_url

P2 = Placement((GpuRef("n1", 2), GpuRef("n1", 0)))
P1 = Placement((GpuRef("n2", 3),))
SHARED = Placement((GpuRef("n1", 1),), shared=True)


def spec(job_id: str, user: str = "alice", submit: float = 100.0, lo: int = 1, hi: int = 2) -> JobSpec:
    return JobSpec(job_id, user, lo, hi, submit, total_work=500.0, name=f"job{job_id}", model="resnet")


class Step(enum.Enum):
    SIGNAL = "signal"


class StoreCases:
    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        s = Store(store_url)
        yield s
        s.close()

    def test_fresh_database_is_at_latest_schema(self, store: Store) -> None:
        assert store.schema_version() == LATEST

    def test_migrations_build_exactly_the_orm_schema(self, store: Store) -> None:
        insp = sa.inspect(store.engine)
        for table in Base.metadata.sorted_tables:
            got = {c["name"]: c["nullable"] for c in insp.get_columns(table.name)}
            want = {c.name: c.nullable for c in table.columns}
            assert got == want, table.name

    def test_job_roundtrip_and_update(self, store: Store) -> None:
        rec = store.upsert_job(spec("7"), at=101.0, partition="gpu", state_dir="/s/7")
        assert rec.spec == spec("7")
        assert (rec.state, rec.partition, rec.state_dir, rec.created) == (JobState.QUEUED, "gpu", "/s/7", 101.0)
        again = store.upsert_job(spec("7", lo=2, hi=4), at=105.0, state=JobState.RUNNING)
        assert again.spec.max_gpus == 4
        assert (again.state, again.partition, again.created, again.updated) == (
            JobState.RUNNING,
            "gpu",
            101.0,
            105.0,
        )
        assert store.get_job("7") == again
        assert store.get_job("nope") is None

    def test_list_jobs_filters_and_order(self, store: Store) -> None:
        store.upsert_job(spec("2", "bob", submit=20.0), at=1.0)
        store.upsert_job(spec("1", "alice", submit=10.0), at=1.0)
        store.upsert_job(spec("3", "alice", submit=30.0), at=1.0, state=JobState.DONE)
        assert [j.job_id for j in store.list_jobs()] == ["1", "2", "3"]
        assert [j.job_id for j in store.list_jobs(users=["alice"])] == ["1", "3"]
        assert [j.job_id for j in store.list_jobs(states=[JobState.QUEUED])] == ["1", "2"]
        assert store.list_jobs(states=[JobState.FAILED]) == ()

    def test_set_job_state(self, store: Store) -> None:
        store.upsert_job(spec("1"), at=1.0)
        rec = store.set_job_state("1", JobState.SUSPENDED, at=9.0)
        assert (rec.state, rec.updated) == (JobState.SUSPENDED, 9.0)
        assert store.get_job("1") == rec
        with pytest.raises(NoSuchRecord):
            store.set_job_state("missing", JobState.DONE, at=9.0)

    def test_slice_lifecycle(self, store: Store) -> None:
        store.upsert_job(spec("1"), at=1.0)
        s1 = store.open_slice("1", P2, 10.0)
        assert (s1.seq, s1.placement, s1.start, s1.end, s1.user, s1.nodes) == (1, P2, 10.0, None, "alice", ("n1",))
        assert store.open_slice("1", P2, 11.0) == s1  # idempotent on the same GPUs
        with pytest.raises(StoreConflict):
            store.open_slice("1", P1, 11.0)
        assert store.current_slice("1") == s1
        closed = store.close_slice("1", 70.0, SliceEnd.QUANTUM)
        assert closed is not None
        assert (closed.end, closed.end_reason, closed.elapsed(999.0)) == (70.0, SliceEnd.QUANTUM, 60.0)
        assert store.close_slice("1", 80.0, SliceEnd.DONE) is None  # nothing open: no change
        assert store.current_slice("1") is None
        s2 = store.open_slice("1", SHARED, 90.0)
        assert (s2.seq, s2.placement.shared) == (2, True)
        assert [s.seq for s in store.slices(job_ids=["1"])] == [1, 2]
        assert store.slices(job_ids=["1"])[0].end_reason is SliceEnd.QUANTUM

    def test_slice_for_unknown_job(self, store: Store) -> None:
        with pytest.raises(NoSuchRecord):
            store.open_slice("ghost", P1, 1.0)
        assert store.close_slice("ghost", 1.0, SliceEnd.DONE) is None

    def test_slices_filters_by_user_and_overlap(self, store: Store) -> None:
        store.upsert_job(spec("1", "alice"), at=0.0)
        store.upsert_job(spec("2", "bob"), at=0.0)
        store.open_slice("1", P2, 10.0)
        store.close_slice("1", 20.0, SliceEnd.MIGRATE)
        store.open_slice("1", P1, 30.0)  # still open
        store.open_slice("2", P2, 25.0)
        store.close_slice("2", 28.0, SliceEnd.DONE)
        assert [(s.job_id, s.start) for s in store.slices()] == [("1", 10.0), ("2", 25.0), ("1", 30.0)]
        assert [s.job_id for s in store.slices(users=["bob"])] == ["2"]
        assert [s.start for s in store.slices(start=21.0)] == [25.0, 30.0]  # open slice overlaps any later window
        assert [s.start for s in store.slices(end=26.0)] == [10.0, 25.0]
        assert [s.start for s in store.slices(start=1000.0)] == [30.0]
        assert store.slices(start=21.0, end=24.0) == ()
        assert store.slices(job_ids=[]) == ()

    def test_decisions_steps_and_outcomes(self, store: Store) -> None:
        store.upsert_job(spec("1"), at=0.0)
        d1 = store.record_intent("1", Action.START, P2, "fifo", 5.0)
        d2 = store.record_intent("1", Action.SUSPEND, None, "quantum", 65.0)
        assert [d.id for d in store.open_intents()] == [d1, d2]
        st = store.record_step(d1, Step.SIGNAL, 5.5)
        store.record_step(d1, "release", 6.0, 6.25, "ok")
        done = store.end_step(st, 5.75, "sent")
        assert (done.step, done.duration, done.detail) == ("signal", 0.25, "sent")
        assert [(s.step, s.end) for s in store.steps(d1)] == [("signal", 5.75), ("release", 6.25)]
        assert store.steps(d2) == ()
        rec = store.record_outcome(d1, Outcome.SUCCEEDED, "running on n1", 7.0)
        assert (rec.outcome, rec.outcome_at, rec.placement, rec.action) == (Outcome.SUCCEEDED, 7.0, P2, Action.START)
        assert [d.id for d in store.open_intents()] == [d2]
        susp = store.get_decision(d2)
        assert susp is not None and susp.placement is None and susp.reason == "quantum"
        assert [d.id for d in store.decisions(since=10.0)] == [d2]
        assert [d.id for d in store.decisions(job_ids=["1"])] == [d1, d2]
        with pytest.raises(NoSuchRecord):
            store.record_outcome(999, Outcome.FAILED, "", 1.0)
        with pytest.raises(NoSuchRecord):
            store.record_step(999, "x", 1.0)
        with pytest.raises(NoSuchRecord):
            store.record_intent("ghost", Action.START, P1, "", 1.0)

    def test_shared_placement_in_decision(self, store: Store) -> None:
        store.upsert_job(spec("1"), at=0.0)
        d = store.record_intent("1", Action.PACK, SHARED, "pack trial", 1.0)
        got = store.get_decision(d)
        assert got is not None and got.placement == SHARED

    def test_rates_and_events(self, store: Store) -> None:
        store.upsert_job(spec("1"), at=0.0)
        store.record_rate("1", 2, Locality.SOCKET, 41.5, 20.0)
        store.record_rate("1", 1, Locality.SWITCH, 22.0, 10.0)
        assert [(r.gpus, r.locality, r.rate) for r in store.rates("1")] == [
            (1, Locality.SWITCH, 22.0),
            (2, Locality.SOCKET, 41.5),
        ]
        store.record_event("reconcile", "1", "found finished", 3.0)
        store.record_event("config", None, "reloaded", 4.0)
        assert [e.kind for e in store.events()] == ["reconcile", "config"]
        assert [e.detail for e in store.events(job_id="1")] == ["found finished"]
        assert [e.job_id for e in store.events(kinds=["config"])] == [None]
        assert [e.kind for e in store.events(since=3.5)] == ["config"]

    def test_batched_reads_match_the_per_job_ones(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr("slurm_gandiva.store.sql.IN_CHUNK", 2)  # several IN lists per read
        for jid in ("1", "2", "3", "4", "5"):
            store.upsert_job(spec(jid, user=f"u{jid}"), at=1.0, partition="gpu", state_dir=f"/s/{jid}")
        store.set_job_state("2", JobState.RUNNING, at=2.0)
        store.open_slice("1", P2, 10.0)
        store.close_slice("1", 20.0, SliceEnd.QUANTUM)
        store.open_slice("1", P1, 30.0)
        store.open_slice("3", SHARED, 5.0)
        store.open_slice("4", P1, 6.0)
        store.close_slice("4", 7.0, SliceEnd.DONE)
        store.record_rate("1", 2, Locality.SOCKET, 41.5, 20.0)
        store.record_rate("1", 1, Locality.SWITCH, 22.0, 10.0)
        store.record_rate("3", 1, Locality.NODE, 5.0, 10.0)
        ids = ["1", "2", "3", "4", "5", "nope", "1"]
        assert store.jobs_by_id(ids) == {j: r for j in ids if (r := store.get_job(j)) is not None}
        assert store.open_slices(ids) == {j: s for j in ids if (s := store.current_slice(j)) is not None}
        assert set(store.open_slices(ids)) == {"1", "3"}
        assert store.rates_by_job(ids) == {j: store.rates(j) for j in ids if store.rates(j)}
        assert store.slices(job_ids=["4", "3", "nope", "1"]) == store.slices()  # merged in start order
        assert store.jobs_by_id([]) == store.open_slices([]) == store.rates_by_job([]) == {}  # type: ignore[comparison-overlap]

    def test_data_survives_reopen(self, store_url: str) -> None:
        with Store(store_url) as a:
            a.upsert_job(spec("1"), at=0.0)
            a.open_slice("1", P2, 1.0)
        with Store(store_url) as b:
            cur = b.current_slice("1")
            assert cur is not None and cur.placement == P2

    def test_upgrade_from_v1_keeps_history(self, store_url: str) -> None:
        raw = sa.create_engine(normalize_url(store_url))
        with raw.begin() as conn:
            migrate(conn, target=1)
            conn.execute(
                sa.text(
                    'INSERT INTO jobs (id, "user", name, min_gpus, max_gpus, submit_time, state, total_work,'
                    " model, partition, state_dir, created, updated) VALUES ('41', 'carol', 'old', 1, 1, 5.0,"
                    " 'done', NULL, '', 'gpu', '/s/41', 5.0, 9.0)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO slices (job_id, seq, nodes, gpus, start_time, end_time, end_reason)"
                    " VALUES ('41', 1, 'n2', 'n2:1', 6.0, 9.0, 'done')"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO decisions (job_id, action, gpus, reason, intent_at, outcome, outcome_at, detail)"
                    " VALUES ('41', 'start', 'n2:1', 'fifo', 5.5, NULL, NULL, '')"
                )
            )
        with raw.connect() as conn:
            assert conn.execute(sa.text("SELECT version FROM schema_version")).scalar() == 1
        raw.dispose()
        with Store(store_url) as s:
            assert s.schema_version() == LATEST
            job = s.get_job("41")
            assert job is not None and (job.user, job.state) == ("carol", JobState.DONE)
            (old,) = s.slices(job_ids=["41"])
            assert (old.placement, old.end_reason, old.end) == (Placement((GpuRef("n2", 1),)), SliceEnd.DONE, 9.0)
            assert not old.placement.shared
            (intent,) = s.open_intents()
            assert intent.action is Action.START
            # the tables v2 added work on the upgraded database
            s.record_step(intent.id, "signal", 6.0)
            s.record_rate("41", 1, Locality.SWITCH, 3.0, 7.0)
            assert len(s.steps(intent.id)) == 1 and len(s.rates("41")) == 1

    def test_v3_database_keeps_its_rows_and_gains_account_and_qos(self, store_url: str) -> None:
        raw = sa.create_engine(normalize_url(store_url))
        with raw.begin() as conn:
            migrate(conn, target=3)
            conn.execute(
                sa.text(
                    'INSERT INTO jobs (id, "user", name, min_gpus, max_gpus, submit_time, state, total_work,'
                    " model, partition, state_dir, created, updated, suspend_signal) VALUES ('42', 'carol',"
                    " 'old', 1, 1, 5.0, 'running', NULL, '', 'gpu', '/s/42', 5.0, 9.0, 'USR1')"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO slices (job_id, seq, nodes, gpus, shared, start_time, end_time, end_reason)"
                    " VALUES ('42', 1, 'n2', 'n2:1', TRUE, 6.0, NULL, NULL)"
                )
            )
        raw.dispose()
        with Store(store_url) as s:
            assert s.schema_version() == LATEST
            job = s.get_job("42")
            assert job is not None and (job.user, job.signal, job.state_dir) == ("carol", "USR1", "/s/42")
            assert (job.spec.account, job.spec.qos) == ("", "")  # gained, empty
            (old,) = s.slices(job_ids=["42"])
            assert (old.placement, old.account, old.qos) == (Placement((GpuRef("n2", 1),), shared=True), "", "")
            # the columns v4 added work on the upgraded database
            s.upsert_job(JobSpec("42", "carol", 1, 1, 5.0, account="physics", qos="normal"), at=10.0)
            (now,) = s.slices(job_ids=["42"])
            assert (now.account, now.qos) == ("physics", "normal")

    def test_account_and_qos_are_the_jobs(self, store: Store) -> None:
        store.upsert_job(JobSpec("1", "alice", 1, 1, 10.0, account="physics", qos="high"), at=1.0)
        store.upsert_job(spec("2", "bob", submit=20.0), at=1.0)  # no account: accounting off
        first = store.open_slice("1", P1, 2.0)
        store.open_slice("2", P2, 3.0)
        assert (first.account, first.qos) == ("physics", "high")
        # a spec without them (its file names none) keeps what Slurm's record gave
        store.upsert_job(JobSpec("1", "alice", 1, 2, 10.0), at=4.0, state=JobState.RUNNING)
        job = store.get_job("1")
        assert job is not None and (job.spec.account, job.spec.qos, job.spec.max_gpus) == ("physics", "high", 2)
        closed = store.close_slice("1", 5.0, SliceEnd.QUANTUM)
        assert closed is not None and (closed.account, closed.qos) == ("physics", "high")
        assert [(x.job_id, x.account) for x in store.slices()] == [("1", "physics"), ("2", "")]
        assert [x.job_id for x in store.slices(accounts=["physics"])] == ["1"]
        assert store.slices(accounts=["bio"]) == ()
        assert store.open_slices(["2"])["2"].account == ""

    def test_one_controller_per_state(self, store: Store, store_url: str) -> None:
        first = store.lock_controller("pid 101 on host alpha")
        with Store(store_url) as other:
            with pytest.raises(ControllerRunning) as ei:
                other.lock_controller("pid 202 on host beta")
            msg = str(ei.value)
            assert "pid 101 on host alpha" in msg and "\n" not in msg and "stop it first" in msg
            first.release()
            second = other.lock_controller("pid 202 on host beta")  # free again once released
            with pytest.raises(ControllerRunning, match="pid 202 on host beta"):
                store.lock_controller()
            second.release()
        store.lock_controller().release()

    def test_newer_schema_is_refused(self, store: Store, store_url: str) -> None:
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": LATEST + 1})
        with pytest.raises(ConfigError, match="upgrade gandiva"):
            Store(store_url)

    def test_readonly_store_reads_what_the_writer_wrote(self, store: Store, store_url: str) -> None:
        store.upsert_job(spec("5"), at=1.0)
        store.open_slice("5", P1, 2.0)
        with Store(store_url, readonly=True) as reader:
            assert reader.schema_version() == LATEST
            cur = reader.current_slice("5")
            assert cur is not None and cur.placement == P1

    def test_concurrent_opens_migrate_once(self, store_url: str) -> None:
        import threading

        errors: list[BaseException] = []

        def open_close() -> None:
            try:
                Store(store_url).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_close) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with Store(store_url) as s:
            assert s.schema_version() == LATEST
