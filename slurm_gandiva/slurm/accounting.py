"""Slurm's accounting as the fair-share layer reads it: shares and GPU limits, from slurmdbd.

    tenants = read_tenants(assoc_out, qos_out)   # `sacctmgr -nP show assoc/qos format=...` output

Two parsable listings (the fields below print the same from 22.05 to 26.05):
- the associations (`ASSOC_FORMAT`): an account's row (no user) gives its RawShares (`Fairshare=`) and its
  `GrpTRES=gres/gpu=N`; a user's row gives the user's shares within the account and its own GrpTRES;
- the QOS (`QOS_FORMAT`): `GrpTRES=gres/gpu=N` (all jobs of the QOS) and `MaxTRESPerUser=gres/gpu=N`.

An account's share is its normalised share down Slurm's tree (RawShares over its siblings', users' rows
included, times its parent's), as `sshare` prints NormShares: accounts at different depths compare as
Slurm compares them. `Fairshare=parent` counts as the parent's share (a user's row: 1, one equal share).
A limit of an account covers the jobs run under that account (not those of its sub-accounts). Per-job
limits (MaxTRES) are not concurrency caps and are left to Slurm.

Slurm's own decayed usage comes from a third listing, `sshare` (`SSHARE_ARGV`, read by `read_tenants`'s
`sshare_out`): its GrpTRESRaw column is each association's usage per TRES in TRES-minutes, decayed by
PriorityDecayHalfLife as RawUsage is, printed in whole minutes (22.05 to 26.05 alike). Its `gres/gpu` item is
the decayed GPU-time (GPU-minutes, times 60 here: GPU-seconds, the fair-share layer's unit). RawUsage itself
is not GPU-time: it is TRES-billing-seconds, CPUs unless the site sets TRESBillingWeights. No `gres/gpu` item
(AccountingStorageTRES without gres/gpu), no multifactor priority (sshare refuses) or a listing that does
not parse: no usage (`Tenants.usage` empty), never an error.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_gandiva.errors import AccountingUnavailable
from slurm_gandiva.model import GpuLimit, Tenants
from slurm_gandiva.slurm.gres import tres_gpus

ASSOC_FORMAT = "Account,User,ParentName,Fairshare,GrpTRES"
QOS_FORMAT = "Name,GrpTRES,MaxTRESPerUser"
ASSOC_ARGV = ("sacctmgr", "--noheader", "--parsable2", "show", "associations", f"format={ASSOC_FORMAT}")
QOS_ARGV = ("sacctmgr", "--noheader", "--parsable2", "show", "qos", f"format={QOS_FORMAT}")
SSHARE_FORMAT = "Account,User,GrpTRESRaw"
SSHARE_ARGV = ("sshare", "--noheader", "--parsable2", "--all", f"--format={SSHARE_FORMAT}")


@dataclass(frozen=True)
class _Assoc:
    account: str
    user: str
    parent: str
    raw: float | None  # None: Fairshare=parent
    gpus: int | None


def _rows(out: str, width: int, what: str) -> list[list[str]]:
    rows = []
    for n, line in enumerate(out.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < width:
            raise AccountingUnavailable(f"{what} line {n} has {len(fields)} fields, not {width}: {line[:80]!r}")
        rows.append(fields[:width])
    return rows


def _share(text: str, what: str) -> float | None:
    if text.lower() == "parent":
        return None
    try:
        value = float(text)
    except ValueError:
        raise AccountingUnavailable(f"{what}: Fairshare {text!r} is not a number") from None
    if not value >= 0:
        raise AccountingUnavailable(f"{what}: Fairshare {text!r} is negative")
    return value


def parse_associations(out: str) -> list[_Assoc]:
    """`sacctmgr -nP show assoc format=ASSOC_FORMAT` rows."""
    found = []
    for account, user, parent, share, grp in _rows(out, 5, "sacctmgr show assoc"):
        what = f"association {account}/{user or '-'}"
        found.append(_Assoc(account, user, parent, _share(share or "1", what), tres_gpus(grp)))
    return found


def parse_usage(out: str) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """`sshare -nP -a -o SSHARE_FORMAT`: Slurm's decayed GPU-seconds per account (the account's rows, root
    left out as `shares` leaves it) and per (account, user). Empty when the listing names no gres/gpu
    usage; AccountingUnavailable when a line does not parse."""
    accounts: dict[str, float] = {}
    users: dict[tuple[str, str], float] = {}
    for account, user, raw in _rows(out, 3, "sshare"):
        minutes = tres_gpus(raw)
        if minutes is None:
            if raw:
                return {}, {}  # this cluster does not account gres/gpu (AccountingStorageTRES)
            continue
        if user:
            users[(account, user)] = minutes * 60.0
        elif account != "root":
            accounts[account] = minutes * 60.0
    return accounts, users


def read_tenants(assoc_out: str, qos_out: str, sshare_out: str | None = None) -> Tenants:
    """The `Tenants` of the two sacctmgr listings (see the module docstring) and of sshare's usage (None or
    a listing that does not parse: none). A listing without the root account, which every cluster's tree
    has, is not taken for "no shares, no limits" but as unavailable."""
    assocs = parse_associations(assoc_out)
    if not any(a.account == "root" and not a.user for a in assocs):
        raise AccountingUnavailable("sacctmgr listed no root association: slurmdbd is starting, stopping or "
                                    "does not know this cluster (`sacctmgr show associations`)")
    accounts = {a.account: a for a in assocs if not a.user}
    siblings: dict[str, float] = defaultdict(float)  # parent account -> the raw shares under it
    for a in assocs:
        parent = a.account if a.user else a.parent
        if parent or a.user:
            siblings[parent] += 1.0 if a.raw is None else a.raw

    def norm(account: str, depth: int = 0) -> float:
        a = accounts.get(account)
        if a is None or not a.parent or depth > 64:
            return 1.0  # root
        up = norm(a.parent, depth + 1)
        if a.raw is None:
            return up
        total = siblings.get(a.parent, 0.0)
        return up * a.raw / total if total > 0 else 0.0

    shares = {name: norm(name) for name, a in accounts.items() if a.parent}
    user_shares = {(a.account, a.user): 1.0 if a.raw is None else a.raw for a in assocs if a.user}
    limits = [GpuLimit(a.gpus, account=a.account, user=a.user) for a in assocs if a.gpus is not None]
    for name, grp, per_user in _rows(qos_out, 3, "sacctmgr show qos"):
        if (n := tres_gpus(grp)) is not None:
            limits.append(GpuLimit(n, qos=name))
        if (n := tres_gpus(per_user)) is not None:
            limits.append(GpuLimit(n, qos=name, per_user=True))
    usage: dict[str, float] = {}
    user_usage: dict[tuple[str, str], float] = {}
    if sshare_out is not None:
        with contextlib.suppress(AccountingUnavailable):
            usage, user_usage = parse_usage(sshare_out)
    return Tenants(shares=shares, user_shares=user_shares, limits=tuple(limits), usage=usage, user_usage=user_usage)


# One user's associations, as that user may read them (PrivateData=users,associations still shows one's own).
USER_ASSOC_FORMAT = "User,DefaultAccount,Account,QOS"
# sacctmgr's words when slurm.conf has no accounting (AccountingStorageType=accounting_storage/none).
ACCOUNTING_OFF = "not running a supported accounting_storage plugin"


def user_assoc_argv(user: str) -> tuple[str, ...]:
    """`sacctmgr` listing `user`'s default account and each of its associations with its QOS."""
    return ("sacctmgr", "--noheader", "--parsable2", "show", "user", f"name={user}", "withassoc",
            f"format={USER_ASSOC_FORMAT}")


@dataclass(frozen=True)
class UserAssociations:
    """A user's associations: `qos` maps each account (lower case, as Slurm stores it) to the QOS its
    associations allow (empty: none listed, not checked); no account at all: the user has no association."""

    user: str
    default_account: str = ""
    qos: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def accounts(self) -> tuple[str, ...]:
        return tuple(sorted(self.qos))


def parse_user_associations(user: str, out: str) -> UserAssociations:
    """`sacctmgr -nP show user name=U withassoc format=USER_ASSOC_FORMAT` (one row per association; the QOS
    of the rows of one account, one per partition, are pooled)."""
    default = ""
    qos: dict[str, set[str]] = {}
    for _user, dflt, account, names in _rows(out, 4, "sacctmgr show user withassoc"):
        default = default or dflt.lower()
        if account:
            qos.setdefault(account.lower(), set()).update(q.lower() for q in names.split(",") if q)
    return UserAssociations(user, default, {a: frozenset(q) for a, q in qos.items()})
