"""Reads of single jobs, coalesced: many threads polling their own jobs share one Slurm query at a time.

A round's actions run on one thread each, and each polls its job (every 50 ms) until Slurm shows the step
done. With the CLI backend every poll is a `squeue --json` process; sixteen threads polling at once start
hundreds of them a second, and on a small controller host they starve slurmctld and each other. Here a
thread that wants a job joins the batch that has not started yet; one of the waiting threads reads the
whole batch with one query (`read_jobs`), the others wait for it. A read always starts after the call that
asked for it, so every answer is as fresh as a read of its own would have been.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from slurm_gandiva.errors import UnknownJob
from slurm_gandiva.slurm.base import SlurmBackend, SlurmJob


@runtime_checkable
class ReadsJobs(Protocol):
    """A backend that reads several named jobs with one query."""

    def read_jobs(self, job_ids: Iterable[str]) -> Mapping[str, SlurmJob]:
        """The named jobs Slurm knows, by the ids asked for (unknown ids are left out)."""


class _Batch:
    __slots__ = ("done", "error", "ids", "jobs")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.jobs: Mapping[str, SlurmJob] = {}
        self.error: BaseException | None = None
        self.done = False


class CoalescedReads:
    """`job(id)` for many threads at once, one backend query per batch of waiting callers."""

    def __init__(self, backend: SlurmBackend) -> None:
        self.backend = backend
        self._cond = threading.Condition()
        self._open: _Batch | None = None  # the batch that callers join; not being read yet
        self._reading = False
        self.queries = 0  # backend queries made (for tests and benchmarks)

    def job(self, job_id: str) -> SlurmJob:
        """A fresh view of one job (UnknownJob, or the query's error, as `backend.job` raises)."""
        with self._cond:
            if self._open is None:
                self._open = _Batch()
            batch = self._open
            batch.ids.add(job_id)
            while not batch.done:
                if self._reading:
                    self._cond.wait()
                    continue
                # Nobody reads and ours is not done, so ours is the open batch: read it for everyone.
                self._reading = True
                self._open = None
                self._cond.release()
                try:
                    self._read(batch)
                finally:
                    self._cond.acquire()
                    batch.done = True
                    self._reading = False
                    self._cond.notify_all()
        if batch.error is not None:
            raise batch.error
        found = batch.jobs.get(job_id)
        if found is None:
            raise UnknownJob(
                f"job {job_id} not found: check the id with `squeue` (finished jobs vanish after MinJobAge)"
            )
        return found

    def _read(self, batch: _Batch) -> None:
        self.queries += 1
        try:
            if len(batch.ids) == 1 or not isinstance(self.backend, ReadsJobs):
                batch.jobs = self._one_by_one(batch.ids)
            else:
                jobs = dict(self.backend.read_jobs(batch.ids))
                missing = batch.ids - jobs.keys()
                if missing:  # a query naming an unknown job may answer for none: ask for those alone
                    jobs.update(self._one_by_one(missing))
                batch.jobs = jobs
        except Exception as exc:  # every waiter of the batch gets the query's error
            batch.error = exc

    def _one_by_one(self, ids: Iterable[str]) -> dict[str, SlurmJob]:
        out: dict[str, SlurmJob] = {}
        for jid in ids:
            try:
                out[jid] = self.backend.job(jid)
            except UnknownJob:
                continue
        return out
