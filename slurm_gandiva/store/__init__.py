"""The controller's state and history: `Store(url)` over SQLite (default) or PostgreSQL.

Public types live in api.py; the implementation in sql.py.
"""

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
from slurm_gandiva.store.sql import Store, default_url, normalize_url

__all__ = [
    "DecisionRecord",
    "EventRecord",
    "JobRecord",
    "NoSuchRecord",
    "Outcome",
    "RateRecord",
    "SliceEnd",
    "SliceRecord",
    "StepRecord",
    "Store",
    "StoreApi",
    "StoreConflict",
    "default_url",
    "normalize_url",
]
