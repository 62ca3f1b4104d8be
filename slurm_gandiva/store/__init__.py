"""The controller's state and history: `Store(url)` over SQLite (default) or PostgreSQL.

Public types live in api.py (re-exported here: the record types, the errors and `StoreApi`); the
implementation in sql.py.
"""

from slurm_gandiva.store import api
from slurm_gandiva.store.api import *  # noqa: F403
from slurm_gandiva.store.sql import Store, check_database, default_url, normalize_url

__all__ = [*api.__all__, "Store", "check_database", "default_url", "normalize_url"]
