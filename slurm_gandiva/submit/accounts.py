"""`gandiva sbatch`'s account and QOS check: -A/--account and --qos (or sbatch's $SBATCH_ACCOUNT and
$SBATCH_QOS) against the submitting user's associations, before anything reaches Slurm.

Where the cluster has no accounting nothing is checked (Slurm takes any account then). Where slurmdbd does
not answer, one warning line and Slurm decides (slurmctld holds the associations in its own cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from slurm_gandiva.errors import AccountingUnavailable, BadRequest
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import SlurmBackend
from slurm_gandiva.submit.request import SbatchRequest

ACCOUNT_ENV = "SBATCH_ACCOUNT"
QOS_ENV = "SBATCH_QOS"


def requested_tenant(req: SbatchRequest, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The account and QOS the job asks for (its options, else sbatch's environment variables)."""
    return req.account or env.get(ACCOUNT_ENV) or None, req.qos or env.get(QOS_ENV) or None


def check_associations(assocs: UserAssociations, account: str | None, qos: str | None) -> None:
    """Refuse (BadRequest, one line) a user without an association, an account the user has none in, or a
    QOS that account's associations do not allow. No account: the user's default (Slurm's choice)."""
    user = assocs.user
    if not assocs.accounts:
        raise BadRequest(
            f"user {user} has no association in Slurm's accounting, so Slurm refuses every job of theirs: ask "
            f"your admin to add one (sacctmgr add user {user} account=ACCOUNT)"
        )
    name = (account or assocs.default_account).lower()
    if name not in assocs.qos:
        raise BadRequest(
            f"account {account or name!r}: user {user} has associations only in {', '.join(assocs.accounts)} "
            f"(default {assocs.default_account or assocs.accounts[0]}): use -A with one of them, or ask your "
            f"admin to add one (sacctmgr add user {user} account={name})"
        )
    allowed = assocs.qos[name]
    if qos is not None and allowed and qos.lower() not in allowed:
        raise BadRequest(
            f"QOS {qos!r} is not allowed for user {user} in account {name}: use --qos with one of "
            f"{', '.join(sorted(allowed))}, or leave --qos out for the association's default"
        )


def check_account(req: SbatchRequest, backend: SlurmBackend, user: str, env: Mapping[str, str],
                  stderr: TextIO) -> None:
    """Read `user`'s associations (one sacctmgr call) and check the request's account and QOS against them."""
    try:
        assocs = backend.user_associations(user)
    except AccountingUnavailable as exc:
        print(f"gandiva: warning: account and QOS not checked, Slurm decides: {exc}", file=stderr)
        return
    if assocs is not None:
        check_associations(assocs, *requested_tenant(req, env))
