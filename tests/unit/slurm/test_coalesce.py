"""CoalescedReads: many threads' single-job reads share queries, and no answer is older than its call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest

from slurm_gandiva.errors import SlurmUnreachable, UnknownJob
from slurm_gandiva.slurm.base import HoldKind, SlurmJob
from slurm_gandiva.slurm.coalesce import CoalescedReads


def job(jid: str, state: str = "RUNNING") -> SlurmJob:
    return SlurmJob(jid, "j", "alice", state, "None", HoldKind.NONE, ("n1",))


class SlowSlurm:
    """Answers reads after `delay` s with the state each job had when the read started; counts queries."""

    def __init__(self, ids: Iterable[str], delay: float = 0.05, batch: bool = True) -> None:
        self.state = dict.fromkeys(ids, "RUNNING")
        self.delay = delay
        self.queries: list[set[str]] = []
        self.lock = threading.Lock()
        self.down = False
        if not batch:
            self.read_jobs = None  # type: ignore[assignment]

    def _snap(self, ids: set[str]) -> dict[str, SlurmJob]:
        with self.lock:
            if self.down:
                raise SlurmUnreachable("slurmctld is down")
            self.queries.append(set(ids))
            snap = {j: job(j, self.state[j]) for j in ids if j in self.state}
        time.sleep(self.delay)
        return snap

    def read_jobs(self, job_ids: Iterable[str]) -> dict[str, SlurmJob]:
        return self._snap(set(job_ids))

    def job(self, job_id: str) -> SlurmJob:
        found = self._snap({job_id})
        if job_id not in found:
            raise UnknownJob(f"job {job_id} not found")
        return found[job_id]


def test_concurrent_reads_share_queries() -> None:
    ids = [str(i) for i in range(16)]
    slurm = SlowSlurm(ids)
    reads = CoalescedReads(slurm)  # type: ignore[arg-type]
    got: dict[str, SlurmJob] = {}
    barrier = threading.Barrier(len(ids))

    def poll(jid: str) -> None:
        barrier.wait()
        for _ in range(5):
            got[jid] = reads.job(jid)

    threads = [threading.Thread(target=poll, args=(j,)) for j in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {j: g.job_id for j, g in got.items()} == {j: j for j in ids}
    # 80 reads; each query answers every caller waiting for it: far fewer queries, several ids in most.
    assert len(slurm.queries) < 40
    assert max(len(q) for q in slurm.queries) > 4


def test_an_answer_is_never_older_than_its_call() -> None:
    slurm = SlowSlurm(["1", "2"], delay=0.2)
    reads = CoalescedReads(slurm)  # type: ignore[arg-type]
    first = threading.Thread(target=reads.job, args=("1",))
    first.start()
    time.sleep(0.05)  # the read for job 1 is under way; job 2 changes now, then is asked for
    slurm.state["2"] = "PENDING"
    assert reads.job("2").state == "PENDING"  # not the view of the read that began before the call
    first.join()
    assert len(slurm.queries) == 2


def test_unknown_job_in_a_batch_does_not_hide_the_others() -> None:
    class Strict(SlowSlurm):
        def read_jobs(self, job_ids: Iterable[str]) -> dict[str, SlurmJob]:
            ids = set(job_ids)
            if ids - self.state.keys():  # like squeue --jobs naming an unknown job: nothing at all
                self._snap(set())
                return {}
            return self._snap(ids)

    slurm = Strict(["1", "2"], delay=0.1)
    reads = CoalescedReads(slurm)  # type: ignore[arg-type]
    out: dict[str, object] = {}

    def ask(jid: str) -> None:
        try:
            out[jid] = reads.job(jid).state
        except UnknownJob as exc:
            out[jid] = exc

    slow = threading.Thread(target=ask, args=("1",))
    slow.start()
    time.sleep(0.02)
    ts = [threading.Thread(target=ask, args=(j,)) for j in ("2", "9")]
    for t in ts:
        t.start()
    for t in [slow, *ts]:
        t.join()
    assert out["1"] == "RUNNING" and out["2"] == "RUNNING"
    assert isinstance(out["9"], UnknownJob)


def test_a_failed_query_reaches_every_waiter_and_the_next_read_tries_again() -> None:
    slurm = SlowSlurm(["1"], batch=False)
    reads = CoalescedReads(slurm)  # type: ignore[arg-type]
    slurm.down = True
    with pytest.raises(SlurmUnreachable):
        reads.job("1")
    slurm.down = False
    assert reads.job("1").state == "RUNNING"
