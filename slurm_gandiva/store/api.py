"""The store's public API: record types and the `StoreApi` protocol the controller and reports use.

Everything crossing the store boundary is a frozen dataclass or an enum from here or from
slurm_gandiva.model / slurm_gandiva.plan; ORM objects never leave the store. Times are unix seconds
(floats, from the caller's injected wall clock). Every write method is its own short transaction, so a
controller killed at any point leaves the database consistent.

The implementation is `slurm_gandiva.store.Store(url)` (see sql.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from slurm_gandiva.model import JobSpec, JobState, Locality, Placement
from slurm_gandiva.plan import Action

__all__ = [
    "ControllerLockLike",
    "DecisionRecord",
    "EventRecord",
    "JobRecord",
    "NoSuchRecord",
    "Outcome",
    "RateRecord",
    "SliceEnd",
    "SliceRecord",
    "StepRecord",
    "StoreApi",
    "StoreConflict",
]


class SliceEnd(enum.Enum):
    """Why a slice (one uninterrupted run of a job on one placement) ended."""

    QUANTUM = "quantum"  # time slice over: suspended so another job gets the GPUs
    MIGRATE = "migrate"  # moved to other GPUs
    RESIZE = "resize"  # restarted on another GPU count
    PACK = "pack"  # moved onto / off a shared GPU
    DONE = "done"  # training finished
    FAILED = "failed"  # the job failed
    CANCELLED = "cancelled"  # the user or admin cancelled it
    REQUEUED = "requeued"  # Slurm requeued it on its own (node failure) or recovery found it gone


class Outcome(enum.Enum):
    """How a recorded decision (intent) ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # did not happen; the job is as before
    ROLLED_BACK = "rolled_back"  # half-done after a crash or error, undone by recovery
    ABANDONED = "abandoned"  # no longer relevant (job finished or cancelled meanwhile)


class NoSuchRecord(LookupError):
    """The job / decision / step named does not exist in the store (a programming error, not a user's)."""


class StoreConflict(ValueError):
    """A write contradicts what is stored (e.g. opening a slice on other GPUs while one is open)."""


@dataclass(frozen=True)
class JobRecord:
    """A managed job as stored: the user's request plus where it is in its life."""

    spec: JobSpec
    state: JobState
    partition: str
    state_dir: str
    created: float
    updated: float
    signal: str = ""  # the signal the job's wrapper catches ("": the controller's configured one)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def user(self) -> str:
        return self.spec.user


@dataclass(frozen=True)
class SliceRecord:
    """One uninterrupted run of a job on one placement. `end` is None while it runs.

    `seq` numbers a job's slices from 1 in start order (sacct's "Slice" column). `user`, `account` and `qos`
    are the job's (its registration row's), carried for the reports.
    """

    id: int
    job_id: str
    user: str
    seq: int
    placement: Placement
    start: float
    end: float | None = None
    end_reason: SliceEnd | None = None
    account: str = ""
    qos: str = ""

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.placement.nodes

    @property
    def is_open(self) -> bool:
        return self.end is None

    def elapsed(self, now: float) -> float:
        """Seconds this slice ran (up to `now` while it is still open)."""
        return max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass(frozen=True)
class DecisionRecord:
    """A decision recorded as intent before it is carried out; `outcome` is None until it settles."""

    id: int
    job_id: str
    action: Action
    placement: Placement | None
    reason: str
    intent_at: float
    outcome: Outcome | None = None
    outcome_at: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class StepRecord:
    """One protocol step (e.g. "signal", "wait_checkpoint", "release") of a decision."""

    id: int
    decision_id: int
    step: str
    start: float
    end: float | None = None
    detail: str = ""

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True)
class RateRecord:
    """A measured throughput of a job (work units / s) on `gpus` GPUs at `locality`."""

    id: int
    job_id: str
    gpus: int
    locality: Locality
    rate: float
    at: float


@dataclass(frozen=True)
class EventRecord:
    """Something worth keeping that is not a slice or decision (reconcile findings, errors, config reloads)."""

    id: int
    kind: str
    job_id: str | None
    detail: str
    at: float


class ControllerLockLike(Protocol):
    """A held one-controller-per-state lock."""

    def release(self) -> None: ...


class StoreApi(Protocol):
    """What `Store` offers. Query methods return tuples ordered by time (then id)."""

    @property
    def url(self) -> str:
        """The database URL (password masked)."""
        ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...

    def lock_controller(self, holder: str | None = None) -> ControllerLockLike:
        """Take the one-controller-per-state lock; ControllerRunning (naming the holder) when it is taken."""
        ...

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
        """Insert or update a job. None keeps the stored value (new jobs: QUEUED, "", "" and ""); so does an
        empty `spec.account` / `spec.qos` (a spec file names none: Slurm's record of the job is their source)."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def jobs_by_id(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        """`get_job` of many jobs at once: the stored ones of `job_ids`, by id (unknown ids are left out)."""
        ...

    def list_jobs(
        self, *, states: Iterable[JobState] | None = None, users: Iterable[str] | None = None
    ) -> tuple[JobRecord, ...]:
        """Jobs in submit order, optionally only those in `states` / of `users`."""
        ...

    def set_job_state(self, job_id: str, state: JobState, *, at: float) -> JobRecord:
        """Raises NoSuchRecord for an unknown job."""
        ...

    # -- slices -----------------------------------------------------------------------------------
    def open_slice(self, job_id: str, placement: Placement, start: float) -> SliceRecord:
        """Start a slice. Idempotent: an open slice on the same placement is returned as is; an open
        slice on another placement raises StoreConflict (close it first)."""
        ...

    def close_slice(self, job_id: str, end: float, reason: SliceEnd) -> SliceRecord | None:
        """End the job's open slice; None (and no change) when it has none, so it is safe to repeat."""
        ...

    def current_slice(self, job_id: str) -> SliceRecord | None: ...

    def open_slices(self, job_ids: Iterable[str]) -> dict[str, SliceRecord]:
        """`current_slice` of many jobs at once, by id (jobs without an open slice are left out)."""
        ...

    def slices(
        self,
        *,
        job_ids: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
        start: float | None = None,
        end: float | None = None,
        accounts: Iterable[str] | None = None,
    ) -> tuple[SliceRecord, ...]:
        """Slices that overlap [start, end] (open slices count as running to now), in start order; with
        `users` / `accounts`, only those of jobs of these users / in these accounts."""
        ...

    # -- decisions and protocol steps -------------------------------------------------------------
    def record_intent(self, job_id: str, action: Action, placement: Placement | None, reason: str, at: float) -> int:
        """Record a decision before acting on it; returns its id."""
        ...

    def record_step(
        self,
        decision_id: int,
        step: str | enum.Enum,
        start: float,
        end: float | None = None,
        detail: str = "",
    ) -> int:
        """Record a protocol step (an enum is stored by its value); returns its id."""
        ...

    def end_step(self, step_id: int, end: float, detail: str | None = None) -> StepRecord:
        """Mark a step recorded without an end as finished."""
        ...

    def steps(self, decision_id: int | None = None) -> tuple[StepRecord, ...]: ...

    def record_outcome(self, decision_id: int, outcome: Outcome, detail: str, at: float) -> DecisionRecord:
        """Settle a decision. Raises NoSuchRecord for an unknown id."""
        ...

    def get_decision(self, decision_id: int) -> DecisionRecord | None: ...

    def open_intents(self) -> tuple[DecisionRecord, ...]:
        """Decisions without an outcome (crash recovery), oldest first."""
        ...

    def decisions(
        self, *, job_ids: Iterable[str] | None = None, since: float | None = None
    ) -> tuple[DecisionRecord, ...]: ...

    # -- rates and events -------------------------------------------------------------------------
    def record_rate(self, job_id: str, gpus: int, locality: Locality, rate: float, at: float) -> int: ...

    def rates(self, job_id: str) -> tuple[RateRecord, ...]: ...

    def rates_by_job(self, job_ids: Iterable[str]) -> dict[str, tuple[RateRecord, ...]]:
        """`rates` of many jobs at once, by id (jobs without a recorded rate are left out)."""
        ...

    def record_event(self, kind: str, job_id: str | None, detail: str, at: float) -> int: ...

    def events(
        self,
        *,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        since: float | None = None,
    ) -> tuple[EventRecord, ...]: ...
