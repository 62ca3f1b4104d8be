"""reconcile: registration, admin holds, finished/cancelled/requeued jobs, and crash recovery."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.controller.reconcile import MAX_REGISTRATIONS, Reconciler, fair_shares
from slurm_gandiva.model import JobSpec, JobState
from slurm_gandiva.plan import Action
from slurm_gandiva.requeue.spec import SubmitSpec, write_spec
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store import Outcome, SliceEnd, Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, pl, sjob


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'g.db'}")
    yield s
    s.close()


def rec(store: Store, jid: str, state: JobState = JobState.QUEUED, state_dir: str = "") -> None:
    store.upsert_job(JobSpec(jid, "alice", 1, 1, 1.0), at=1.0, state=state, state_dir=state_dir)


def test_registers_new_jobs_from_spec_or_fallback_and_admin_holds(store: Store, tmp_path: Path) -> None:
    import getpass

    me = getpass.getuser()
    write_spec(tmp_path, SubmitSpec("5", me, 1, 4, total_samples=1000))
    now = time.time()
    backend = FakeBackend(
        [
            sjob("5", hold=HoldKind.USER, user=me, submit=now),
            sjob("6", hold=HoldKind.USER, user=me, submit=now - 60, tres="gres:gpu:2"),  # plain sbatch
            sjob("7", hold=HoldKind.USER, user=me, submit=now),  # spec not written yet: wait
            sjob("8", hold=HoldKind.NONE, comment="", user=me),  # not ours
        ]
    )
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time)
    found = r.settle(backend.snapshot())
    assert sorted(backend.calls) == [("hold", "5"), ("hold", "6"), ("hold", "7")]
    j5, j6 = store.get_job("5"), store.get_job("6")
    assert (j5.spec.min_gpus, j5.spec.max_gpus, j5.spec.total_work) == (1, 4, 1000.0)
    assert (j6.spec.min_gpus, j6.spec.max_gpus) == (2, 2)
    assert store.get_job("7") is None and store.get_job("8") is None
    assert {f.kind for f in found} >= {"registered", "admin-hold"}


def test_finished_cancelled_vanished_and_requeued(store: Store, tmp_path: Path) -> None:
    for jid in ("1", "2", "3", "4"):
        rec(store, jid, JobState.RUNNING, state_dir=str(tmp_path / jid))
        store.open_slice(jid, pl("n1", int(jid) - 1), 10.0)
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "status.json").write_text('{"outcome": "done"}')
    backend = FakeBackend(
        [
            replace(sjob("1", "COMPLETED", hold=HoldKind.NONE), end_time=50.0),
            sjob("2", "CANCELLED", hold=HoldKind.NONE),
            # 3 is gone from squeue, its wrapper said done; 4 is pending again: Slurm requeued it
            sjob("4", hold=HoldKind.NONE, restarts=1),
        ]
    )
    Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=lambda: 100.0).settle(backend.snapshot())
    reasons = {s.job_id: s.end_reason for s in store.slices()}
    assert reasons == {"1": SliceEnd.DONE, "2": SliceEnd.CANCELLED, "3": SliceEnd.DONE, "4": SliceEnd.REQUEUED}
    assert store.slices(job_ids=["1"])[0].end == 50.0
    assert [store.get_job(j).state for j in "1234"] == [
        JobState.DONE,
        JobState.CANCELLED,
        JobState.DONE,
        JobState.SUSPENDED,
    ]
    assert ("hold", "4") in backend.calls  # a requeued job must not start on Slurm's own


def test_running_job_without_slice_is_adopted(store: Store, tmp_path: Path) -> None:
    rec(store, "1", JobState.QUEUED)
    backend = FakeBackend([sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n2": (1, 2)}, start=40.0)])
    Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=lambda: 100.0).settle(backend.snapshot())
    cur = store.current_slice("1")
    assert cur is not None and cur.placement == pl("n2", 1, 2) and cur.start == 40.0
    assert store.get_job("1").state is JobState.RUNNING


def test_recover_finishes_a_half_done_suspend(store: Store, tmp_path: Path) -> None:
    rec(store, "1", JobState.RUNNING)
    store.open_slice("1", pl("n1", 0), 10.0)
    did = store.record_intent("1", Action.SUSPEND, None, "quantum", 20.0)
    # crashed after the signal: the wrapper requeue-held itself (a user hold)
    backend = FakeBackend([sjob("1", hold=HoldKind.USER, restarts=1)])
    proto = FakeProtocol(backend)
    r = Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=lambda: 30.0)
    r.recover(backend.snapshot(), proto)
    assert proto.calls == [("suspend", "1", None)]
    assert store.get_decision(did).outcome is Outcome.SUCCEEDED
    assert store.slices(job_ids=["1"])[0].end_reason is SliceEnd.QUANTUM
    assert store.open_intents() == ()


def test_recover_finishes_a_resume_or_rolls_back_when_gpus_are_taken(store: Store, tmp_path: Path) -> None:
    rec(store, "1")
    rec(store, "2")
    d1 = store.record_intent("1", Action.START, pl("n1", 0), "", 20.0)
    d2 = store.record_intent("2", Action.START, pl("n2", 0), "", 20.0)
    backend = FakeBackend(
        [
            sjob("1"),  # crashed before release: finish it
            sjob("2", hold=HoldKind.NONE),  # released, but its GPU went to another job meanwhile
            sjob("9", "RUNNING", hold=HoldKind.NONE, gpus={"n2": (0,)}, comment=""),
        ]
    )
    proto = FakeProtocol(backend)
    Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=lambda: 30.0).recover(backend.snapshot(), proto)
    assert store.get_decision(d1).outcome is Outcome.SUCCEEDED
    assert store.current_slice("1").placement == pl("n1", 0)
    assert store.get_decision(d2).outcome is Outcome.ROLLED_BACK
    assert ("hold", "2") in backend.calls and store.current_slice("2") is None
    assert [c[:2] for c in proto.calls] == [("resume", "1")]


def test_recover_abandons_decisions_of_vanished_jobs(store: Store, tmp_path: Path) -> None:
    rec(store, "1")
    did = store.record_intent("1", Action.START, pl("n1", 0), "", 20.0)
    backend = FakeBackend([])
    Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=lambda: 30.0).recover(
        backend.snapshot(), FakeProtocol(backend)
    )
    assert store.get_decision(did).outcome is Outcome.ABANDONED


def test_recover_waits_for_a_job_signalled_before_the_crash(store: Store, tmp_path: Path) -> None:
    from slurm_gandiva.requeue.operations import Step

    rec(store, "1", JobState.RUNNING)
    store.open_slice("1", pl("n1", 0), 10.0)
    did = store.record_intent("1", Action.SUSPEND, None, "quantum", 20.0)
    store.record_step(did, Step.SIGNAL, 21.0, 21.1, "SIGUSR2 to the batch shell")
    backend = FakeBackend([sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)})])
    polls: list[str] = []

    def job(jid: str):  # type: ignore[no-untyped-def]  # the wrapper requeue-holds itself on the third look
        polls.append(jid)
        if len(polls) == 3:
            backend.set(sjob("1", hold=HoldKind.USER, restarts=1))
        return backend.jobs_by_id[jid]

    backend.job = job  # type: ignore[assignment,method-assign]
    proto = FakeProtocol(backend)
    seen_phase: list[str] = []
    proto.on_call = lambda op, jid: seen_phase.append(backend.jobs_by_id[jid].state)
    r = Reconciler(backend, store, partitions=(), jobs_root=tmp_path, clock=time.time, sleep=lambda _s: None)
    found = r.recover(backend.snapshot(), proto)
    assert seen_phase == ["PENDING"], "the protocol ran (and would re-signal) before the job stopped"
    assert "awaited-signal" in {f.kind for f in found}
    assert store.get_decision(did).outcome is Outcome.SUCCEEDED


def test_signal_seen_in_the_wrappers_events_file(store: Store, tmp_path: Path) -> None:
    import json

    rec(store, "1", JobState.RUNNING, state_dir=str(tmp_path / "1"))
    (tmp_path / "1").mkdir()
    did = store.record_intent("1", Action.MIGRATE, pl("n2", 0), "", 20.0)
    r = Reconciler(FakeBackend([]), store, partitions=(), jobs_root=tmp_path, clock=time.time)
    d = store.get_decision(did)
    assert not r._signalled(d)  # type: ignore[arg-type]
    (tmp_path / "1" / "events.jsonl").write_text(json.dumps({"event": "signal", "time": 10.0}) + "\n")
    assert not r._signalled(d)  # type: ignore[arg-type]  # an older signal (an earlier suspend) does not count
    with open(tmp_path / "1" / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "signal", "time": 25.0}) + "\n")
    assert r._signalled(d)  # type: ignore[arg-type]


def test_an_arrays_waiting_tasks_are_admin_held_with_one_call(store: Store, tmp_path: Path) -> None:
    tasks = [replace(sjob(f"40_{t}", hold=HoldKind.USER, submit=time.time()), array_id="40") for t in range(50)]
    tasks.append(replace(sjob("40_50", hold=HoldKind.ADMIN, submit=time.time()), array_id="40"))
    backend = FakeBackend([*tasks, sjob("9", hold=HoldKind.USER, submit=time.time())])
    found = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time).settle(
        backend.snapshot()
    )
    assert sorted(backend.calls) == [("hold", "40"), ("hold", "9")]
    assert [f.detail for f in found if f.kind == "admin-hold" and f.job_id == "40"] == [
        "50 waiting task(s) of array 40 had no admin hold"
    ]


def test_tasks_an_array_hold_missed_are_held_one_by_one(store: Store, tmp_path: Path) -> None:
    tasks = [replace(sjob(f"40_{t}", hold=HoldKind.USER, submit=time.time()), array_id="40") for t in range(3)]
    backend = FakeBackend(tasks)
    backend.hold = lambda job_id: backend.calls.append(("hold", job_id))  # type: ignore[method-assign]
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time)
    r.settle(backend.snapshot())
    assert backend.calls == [("hold", "40")]
    backend.calls.clear()
    r.settle(backend.snapshot())  # still waiting unheld: this Slurm did not hold them with the array
    assert sorted(backend.calls) == [("hold", "40_0"), ("hold", "40_1"), ("hold", "40_2")]


def test_registrations_per_round_are_bounded_and_the_rest_follow(store: Store, tmp_path: Path) -> None:
    backend = FakeBackend([sjob(str(k), hold=HoldKind.ADMIN, submit=time.time() - 60) for k in range(1, 26)])
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time, max_registrations=10)
    counts = []
    for _ in range(4):
        r.settle(backend.snapshot())
        counts.append(len(store.list_jobs()))
    assert counts == [10, 20, 25, 25]


def test_fair_shares_split_a_budget_between_users_whatever_their_volume() -> None:
    assert fair_shares({"a": 10_000, "b": 1}, 500) == {"a": 499, "b": 1}
    assert fair_shares({"a": 10_000, "b": 300, "c": 50}, 500) == {"a": 225, "b": 225, "c": 50}
    assert fair_shares({"a": 3, "b": 2}, 500) == {"a": 3, "b": 2}
    assert fair_shares({}, 500) == {}
    # A budget too small to split turns round: every user is reached.
    assert [fair_shares({"a": 9, "b": 9, "c": 9}, 1, turn) for turn in range(3)] == [
        {"a": 1, "b": 0, "c": 0}, {"a": 0, "b": 1, "c": 0}, {"a": 0, "b": 0, "c": 1}
    ]


def test_another_users_new_job_is_registered_in_the_first_round_behind_a_huge_array(
    store: Store, tmp_path: Path
) -> None:
    """10,000 waiting tasks of user A, submitted first; user B's one job, submitted after: B's job is
    registered in the first round, A's tasks take the rest of the budget."""
    t0 = time.time() - 600
    tasks = [replace(sjob(f"7_{t}", user="a", submit=t0), array_id="7") for t in range(10_000)]
    backend = FakeBackend([*tasks, sjob("8", user="b", submit=t0 + 30)])
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time)
    r.settle(backend.snapshot())
    users = Counter(rec.user for rec in store.list_jobs())
    assert store.get_job("8") is not None and users == {"a": MAX_REGISTRATIONS - 1, "b": 1}
