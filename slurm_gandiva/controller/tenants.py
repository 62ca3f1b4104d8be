"""The controller's copy of Slurm's tenants (shares and GPU limits), read at most once a round, cached.

    cache = TenantsCache(backend, store, clock)
    view = replace(view, tenants=cache.current(fairness="shares"))

`backend.tenants()` (two sacctmgr listings) is read again every `accounting_refresh` seconds (config;
default `TENANTS_REFRESH_S`). When slurmdbd does not answer, the controller goes on with the last tenants
it read (none yet: equal shares, no limits): the round never fails for it. It says so once (a warning and
an `accounting` event) and once again when it reads them again. A cluster whose accounting never answered
and whose controller does not ask for shares (`fairness = none`: limits only) is taken as one without
accounting: asked every `ACCOUNTING_OFF_RETRY_S`, noted once at info, without events.

Each round's per-tenant table (`tenant_rows`: shares, entitled GPUs, held, waiting, decayed GPU-hours, and
Slurm's own decayed GPU-hours as sshare shows them, to compare) is written to `<state_dir>/tenants.json` for
`gandiva sshare`, and set as the per-tenant Prometheus gauges.

The decayed usage the fair-share layer (and `slurm`'s multifactor priority) carries between rounds
(`TenantUsage`) is ours alone: Slurm's usage read beside it (`Tenants.usage`) counts every job of an
association, managed or not, and is shown, not used. So ours is written each round to
`<state_dir>/tenant_usage.json` (`save_usage`) and read back before a new policy's first round
(`restore_usage`: at start and after a reload), decayed over the time between by wall clock; without it a
tenant that used the cluster before a restart would start level with the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_gandiva.errors import GandivaError
from slurm_gandiva.model import ClusterView, JobState, Tenants
from slurm_gandiva.slurm.base import SlurmBackend

if TYPE_CHECKING:
    from slurm_gandiva.selector.fairshare import TenantUsage

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
    to now (None: no layer), the GPUs it holds, its waiting jobs, its decayed GPU-hours received, and
    Slurm's own decayed GPU-hours of the association (sshare; None: not read)."""

    account: str
    user: str
    share: float
    user_share: float
    entitled: int | None
    held: int
    waiting: int
    gpu_hours: float
    slurm_gpu_hours: float | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def tenant_rows(view: ClusterView, policy: object) -> list[TenantRow]:
    """The per-tenant table of `view` under `policy` (a `FairShare` gives the entitled GPUs and the decayed
    usage; another policy the GPU-hours its jobs' attained service adds up to)."""
    from slurm_gandiva.selector.fairshare import FairShare, tenant_of

    fair = policy if isinstance(policy, FairShare) else None
    caps: Mapping[tuple[str, str], int] = {}
    if fair is not None:  # the caps the round decided with, else worked out for this view
        caps = fair.entitled[1] if fair.entitled is not None and fair.entitled[0] == view.now else fair.caps(view)
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
                  usage.get((a, u), 0.0) / 3600.0, _slurm_hours(view.tenants, a, u))
        for a, u in sorted(set(held) | set(usage))
    ]


def _slurm_hours(tenants: Tenants | None, account: str, user: str) -> float | None:
    """Slurm's decayed GPU-hours of (account, user), of the account for a tenant without a user; None when
    Slurm's usage was not read. An association sshare does not list has used nothing."""
    if tenants is None or not (tenants.usage or tenants.user_usage):
        return None
    seconds = tenants.user_usage.get((account, user), 0.0) if user else tenants.usage.get(account, 0.0)
    return seconds / 3600.0


def write_tenants(path: Path, rows: list[TenantRow], at: float) -> None:
    """`rows` as `gandiva sshare` reads them (readable by every user, as `gandiva squeue`'s database is)."""
    from slurm_gandiva.requeue.contract import write_atomic

    write_atomic(path, json.dumps({"at": at, "tenants": [r.as_json() for r in rows]}), mode=0o644)


def read_tenants_file(path: Path) -> tuple[float, list[TenantRow]]:
    """The table `write_tenants` wrote: when, and its rows (OSError, ValueError when missing or bad)."""
    data = json.loads(path.read_text())
    return float(data["at"]), [TenantRow(**r) for r in data["tenants"]]


def format_tenants(rows: list[TenantRow]) -> str:
    head = ("ACCOUNT", "USER", "SHARE", "USER_SHARE", "ENTITLED", "HELD", "WAITING", "GPU_HOURS",
            "SLURM_GPU_HOURS")
    table = [head] + [
        (r.account or "-", r.user, f"{r.share:g}", f"{r.user_share:g}",
         "-" if r.entitled is None else str(r.entitled), str(r.held), str(r.waiting), f"{r.gpu_hours:.2f}",
         "-" if r.slurm_gpu_hours is None else f"{r.slurm_gpu_hours:.2f}")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)


USAGE_FILE = "tenant_usage.json"  # in state_dir: the decayed usage carried between rounds, for the next controller
_USAGE_VERSION = 1


def usage_states(policy: object) -> dict[str, TenantUsage]:
    """The decayed usage `policy` carries between rounds, by role: the fair-share layer's (`fairshare`) and
    its (inner) policy's own (`policy`: `slurm`'s multifactor priority)."""
    from slurm_gandiva.selector.fairshare import FairShare, TenantUsage

    out: dict[str, TenantUsage] = {}
    inner = policy
    if isinstance(policy, FairShare):
        out["fairshare"] = policy.state
        inner = policy.inner
    own = getattr(inner, "usage", None)
    if isinstance(own, TenantUsage):
        out["policy"] = own
    return out


def save_usage(path: Path, policy: object) -> None:
    """`policy`'s decayed usage (`usage_states`) written for the next controller; a write that fails is
    logged (debug, as the tenant table's) and the round goes on."""
    from slurm_gandiva.requeue.contract import write_atomic

    states = {role: s for role, s in usage_states(policy).items() if s.at is not None}
    if not states:
        return
    data = {
        "version": _USAGE_VERSION,
        "usages": {
            role: {"at": s.at, "usage": [[a, u, v] for (a, u), v in sorted(s.usage.items())], "seen": s.seen}
            for role, s in states.items()
        },
    }
    try:
        write_atomic(path, json.dumps(data))
    except OSError as exc:
        log.debug("cannot write the tenants' decayed usage: %s", exc)


def restore_usage(path: Path, policy: object, now: float) -> None:
    """Before `policy`'s first round (its usage never updated): its decayed usage as `save_usage` last wrote
    it, decayed from then at its first round. No file: from zero, nothing said; a file that cannot be read
    or is not one `save_usage` wrote: one warning, from zero. Either way the round goes on."""
    fresh = {role: s for role, s in usage_states(policy).items() if s.at is None}
    if not fresh:
        return
    loaded: dict[str, TenantUsage] = {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("version") != _USAGE_VERSION:
            raise ValueError(f"not a version {_USAGE_VERSION} usage file")
        loaded = {role: _parse_usage(data["usages"][role]) for role in fresh if role in data["usages"]}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("cannot read the tenants' decayed usage from %s (%s): starting from zero", path, exc)
        loaded = {}
    for role, s in fresh.items():
        got = loaded.get(role)
        s.usage, s.seen, s.at = (got.usage, got.seen, got.at) if got is not None else ({}, {}, now)


def _parse_usage(raw: Any) -> TenantUsage:
    from slurm_gandiva.selector.fairshare import TenantUsage

    def seconds(x: Any) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise ValueError(f"{x!r} is not a number of seconds")
        return float(x)

    usage = {(str(a), str(u)): seconds(v) for a, u, v in raw["usage"]}
    seen = {str(j): seconds(v) for j, v in raw["seen"].items()}
    return TenantUsage(usage, seen, seconds(raw["at"]))
