"""MemoStore answers every read as the store under it does, across writes, and reads only what changed."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from slurm_gandiva.model import GpuRef, JobSpec, JobState, Locality, Placement
from slurm_gandiva.store import SliceEnd, Store
from slurm_gandiva.store.memo import MemoStore

ACTIVE = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED)


class Counting:
    """A store wrapper that counts the reads reaching the database."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("jobs_by_id", "list_jobs", "slices", "rates_by_job", "open_slices"):
            def counted(*a: Any, **kw: Any) -> Any:
                self.reads.append(name)
                return attr(*a, **kw)
            return counted
        return attr


def reads(store: Any, ids: list[str]) -> tuple[Any, ...]:
    return (
        store.jobs_by_id(ids),
        store.list_jobs(states=ACTIVE),
        store.list_jobs(states=[JobState.RUNNING]),
        store.open_slices(ids),
        store.slices(job_ids=ids),
        store.rates_by_job(ids),
        store.get_job(ids[0]),
        store.current_slice(ids[1]),
        store.rates(ids[2]),
    )


@pytest.mark.parametrize("seed", range(2))
def test_reads_match_the_store_after_random_writes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    plain = Store(tmp_path / "s.db")
    memo = MemoStore(plain)
    ids = [str(k) for k in range(8)]
    t = 0.0
    for k in ids[:5]:
        memo.upsert_job(JobSpec(k, "u", 1, 2, 0.0), at=t)
    for _ in range(80):
        assert reads(memo, ids) == reads(plain, ids)
        t += 1.0
        jid = rng.choice(ids)
        op = rng.randrange(5)
        try:
            if op == 0:
                memo.upsert_job(JobSpec(jid, "u", 1, 2, rng.random()), at=t, state=rng.choice(list(JobState)))
            elif op == 1:
                memo.set_job_state(jid, rng.choice(list(JobState)), at=t)
            elif op == 2:
                memo.open_slice(jid, Placement((GpuRef("n1", rng.randrange(4)),)), t)
            elif op == 3:
                memo.close_slice(jid, t, SliceEnd.QUANTUM)
            else:
                memo.record_rate(jid, 1, Locality.NODE, rng.random() + 0.1, t)
        except Exception:  # unknown job, conflicting slice: the store refuses, the memo must still agree
            pass
        if rng.random() < 0.1:
            memo.retain(ids[:4])
    assert reads(memo, ids) == reads(plain, ids)


def test_a_steady_round_reads_nothing_from_the_database(tmp_path: Path) -> None:
    inner = Counting(Store(tmp_path / "s.db"))
    memo = MemoStore(inner)
    ids = [str(k) for k in range(50)]
    for k in ids:
        memo.upsert_job(JobSpec(k, "u", 1, 1, 0.0), at=0.0)
    memo.open_slice("3", Placement((GpuRef("n1", 0),)), 0.0)
    reads(memo, ids)
    inner.reads.clear()
    reads(memo, ids)
    assert inner.reads == []
    memo.close_slice("3", 5.0, SliceEnd.QUANTUM)
    memo.set_job_state("3", JobState.SUSPENDED, at=5.0)
    got = memo.slices(job_ids=ids)
    assert inner.reads == ["slices"]  # the one job written, read again alone
    assert [s.end for s in got] == [5.0]


def test_a_failed_write_forgets_the_job(tmp_path: Path) -> None:
    plain = Store(tmp_path / "s.db")
    memo = MemoStore(plain)
    memo.upsert_job(JobSpec("1", "u", 1, 1, 0.0), at=0.0)
    memo.open_slice("1", Placement((GpuRef("n1", 0),)), 0.0)
    assert memo.list_jobs(states=ACTIVE)
    with pytest.raises(Exception):
        memo.open_slice("1", Placement((GpuRef("n1", 1),)), 1.0)  # another open slice: refused
    assert reads(memo, ["1", "1", "1"]) == reads(plain, ["1", "1", "1"])


def test_writes_from_other_threads_while_a_round_reads(tmp_path: Path) -> None:
    """The introspection job records rates, the actor's threads write slices, while a round reads."""
    import threading

    memo = MemoStore(Store(tmp_path / "s.db"))
    ids = [str(k) for k in range(20)]
    for k in ids:
        memo.upsert_job(JobSpec(k, "u", 1, 1, 0.0), at=0.0)
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(60):
                memo.record_rate(ids[n % 20], 1, Locality.NODE, 1.0 + n, float(n))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=write)
    t.start()
    while not done.is_set():
        memo.rates_by_job(ids)
        memo.slices(job_ids=ids)
    t.join()
    assert not errors
    assert sum(len(r) for r in memo.rates_by_job(ids).values()) == 60
