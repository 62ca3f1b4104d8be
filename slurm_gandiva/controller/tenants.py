"""The controller's copy of Slurm's tenants (shares and GPU limits), read at most once a round, cached.

    cache = TenantsCache(backend, store, clock)
    view = replace(view, tenants=cache.current(fairness="shares"))

`backend.tenants()` (two sacctmgr listings) is read again every `TENANTS_REFRESH_S`. When slurmdbd does not
answer, the controller goes on with the last tenants it read (none yet: equal shares, no limits): the
round never fails for it. It says so once (a warning and an `accounting` event) and once again when it
reads them again. A cluster whose accounting never answered and whose controller does not ask for shares
(`fairness = none`: limits only) is taken as one without accounting: asked every `ACCOUNTING_OFF_RETRY_S`,
noted once at info, without events.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from slurm_gandiva.errors import GandivaError
from slurm_gandiva.model import Tenants
from slurm_gandiva.slurm.base import SlurmBackend

log = logging.getLogger(__name__)

TENANTS_REFRESH_S = 60.0  # how old the tenants may be: sacctmgr changes reach the rounds within this
ACCOUNTING_OFF_RETRY_S = 600.0  # a cluster without accounting is asked again this rarely
ACCOUNTING_EVENT = "accounting"


class TenantsCache:
    """The last tenants Slurm's accounting gave (None: none yet), refreshed every `refresh` seconds."""

    def __init__(self, backend: SlurmBackend, store: Any, clock: Callable[[], float],
                 refresh: float = TENANTS_REFRESH_S, off_retry: float = ACCOUNTING_OFF_RETRY_S) -> None:
        self.backend = backend
        self.store = store
        self.clock = clock
        self.refresh = refresh
        self.off_retry = off_retry
        self.tenants: Tenants | None = None
        self.problem = ""  # why the last read failed ("" when it did not)
        self._next = float("-inf")  # when to read again

    def current(self, fairness: str = "none") -> Tenants | None:
        """The tenants for this round: read again when due, else the cached ones."""
        now = self.clock()
        if now < self._next:
            return self.tenants
        try:
            found = self.backend.tenants()
        except Exception as exc:  # a reader bug must not stop the round either
            why = str(exc) if isinstance(exc, GandivaError) else f"{type(exc).__name__}: {exc}"
            self._failed(why, fairness, now)
        else:
            if self.problem:
                self._note(logging.INFO, "Slurm's accounting answers again: tenants' shares and GPU limits are "
                           "current", now, event=True)
            self.tenants, self.problem = found, ""
            self._next = now + self.refresh
        return self.tenants

    def _failed(self, why: str, fairness: str, now: float) -> None:
        off = self.tenants is None and fairness == "none"
        self._next = now + (self.off_retry if off else self.refresh)
        if self.problem:
            self.problem = why
            return
        self.problem = why
        if off:
            log.info("no Slurm accounting (%s): no GPU limits of associations or QOS apply; asked again every "
                     "%.0f s", why, self.off_retry)
            return
        kept = ("the last tenants read" if self.tenants is not None
                else "equal shares and no GPU limits until it answers")
        self._note(logging.WARNING, f"Slurm's accounting does not answer ({why}): going on with {kept}", now,
                   event=True)

    def _note(self, level: int, msg: str, now: float, *, event: bool) -> None:
        log.log(level, "%s", msg)
        if event:
            with contextlib.suppress(Exception):
                self.store.record_event(ACCOUNTING_EVENT, None, msg, now)
