"""The controller's copy of Slurm's tenants (shares and GPU limits), read at most once a round, cached.

    cache = TenantsCache(backend, store, clock)
    view = replace(view, tenants=cache.current(fairness="shares"))

`backend.tenants()` (two sacctmgr listings) is read again every `accounting_refresh` seconds (config;
default `TENANTS_REFRESH_S`). When slurmdbd does not answer, the controller goes on with the last tenants
it read (none yet: equal shares, no limits): the round never fails for it. It says so once (a warning and
an `accounting` event) and once again when it reads them again. A cluster whose accounting never answered
and whose controller does not ask for shares (`fairness = none`: limits only) is taken as one without
accounting: asked every `ACCOUNTING_OFF_RETRY_S`, noted once at info, without events.

Each round's per-tenant table (`tenant_rows`: shares, entitled GPUs, held, waiting, decayed GPU-hours) is
written to `<state_dir>/tenants.json` for `gandiva sshare`, and set as the per-tenant Prometheus gauges.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm_gandiva.errors import GandivaError
from slurm_gandiva.model import ClusterView, JobState, Tenants
from slurm_gandiva.slurm.base import SlurmBackend

log = logging.getLogger(__name__)

TENANTS_REFRESH_S = 60.0  # how old the tenants may be (config accounting_refresh): sacctmgr's changes apply in this
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

    def current(self, fairness: str = "none", refresh: float | None = None) -> Tenants | None:
        """The tenants for this round: read again when due, else the cached ones. `refresh`: the config's
        `accounting_refresh` (None: the cache's own)."""
        if refresh is not None:
            self.refresh = refresh
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

    def expire(self) -> None:
        """Read the tenants again at the next round (Slurm applied a limit they do not have)."""
        self._next = float("-inf")

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


TENANTS_FILE = "tenants.json"  # in state_dir: the last round's per-tenant table, for `gandiva sshare`


@dataclass(frozen=True)
class TenantRow:
    """One tenant (account, user) in the last round: its shares, the GPUs the fair-share layer entitles it
    to now (None: no layer), the GPUs it holds, its waiting jobs and its decayed GPU-hours received."""

    account: str
    user: str
    share: float
    user_share: float
    entitled: int | None
    held: int
    waiting: int
    gpu_hours: float

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def tenant_rows(view: ClusterView, policy: object) -> list[TenantRow]:
    """The per-tenant table of `view` under `policy` (a `FairShare` gives the entitled GPUs and the decayed
    usage; another policy the GPU-hours its jobs' attained service adds up to)."""
    from slurm_gandiva.selector.fairshare import FairShare, tenant_of

    fair = policy if isinstance(policy, FairShare) else None
    caps = fair.caps(view) if fair is not None else {}
    held: Counter[tuple[str, str]] = Counter()
    waiting: Counter[tuple[str, str]] = Counter()
    served: defaultdict[tuple[str, str], float] = defaultdict(float)
    running, queued, suspended = JobState.RUNNING, JobState.QUEUED, JobState.SUSPENDED
    for j in view.jobs:  # one pass, every round at 10,000 jobs: the states compared, not their properties
        t = tenant_of(j)
        state = j.state
        held[t] += j.gpus if state is running else 0
        waiting[t] += 1 if state is queued or state is suspended else 0
        if fair is None:
            served[t] += j.attained_service
    usage: Mapping[tuple[str, str], float] = fair.state.usage if fair is not None else served
    shares = view.tenants.shares if view.tenants is not None else (fair.shares if fair is not None else {})
    user_shares = view.tenants.user_shares if view.tenants is not None else {}
    return [
        TenantRow(a, u, float(shares.get(a, 1.0)), float(user_shares.get((a, u), 1.0)),
                  caps.get((a, u), 0) if fair is not None else None, held[(a, u)], waiting[(a, u)],
                  usage.get((a, u), 0.0) / 3600.0)
        for a, u in sorted(set(held) | set(usage))
    ]


def write_tenants(path: Path, rows: list[TenantRow], at: float) -> None:
    """`rows` as `gandiva sshare` reads them (readable by every user, as `gandiva squeue`'s database is)."""
    from slurm_gandiva.requeue.contract import write_atomic

    write_atomic(path, json.dumps({"at": at, "tenants": [r.as_json() for r in rows]}), mode=0o644)


def read_tenants_file(path: Path) -> tuple[float, list[TenantRow]]:
    """The table `write_tenants` wrote: when, and its rows (OSError, ValueError when missing or bad)."""
    data = json.loads(path.read_text())
    return float(data["at"]), [TenantRow(**r) for r in data["tenants"]]


def format_tenants(rows: list[TenantRow]) -> str:
    head = ("ACCOUNT", "USER", "SHARE", "USER_SHARE", "ENTITLED", "HELD", "WAITING", "GPU_HOURS")
    table = [head] + [
        (r.account or "-", r.user, f"{r.share:g}", f"{r.user_share:g}",
         "-" if r.entitled is None else str(r.entitled), str(r.held), str(r.waiting), f"{r.gpu_hours:.2f}")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
