"""gandiva sbatch's -A/--account and --qos: parsed however sbatch spells them, checked against the user's
associations (submit/accounts.py) before anything reaches Slurm."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from slurm_gandiva.errors import AccountingUnavailable, BadRequest
from slurm_gandiva.model import Topology
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.submit.accounts import check_associations
from slurm_gandiva.submit.cli import submit
from slurm_gandiva.submit.request import parse_request
from slurm_gandiva.topology.file import write_topology
from tests.unit.submit.test_submit_cli import FakeBackend

ALICE = UserAssociations("alice", "physics", {"physics": frozenset({"normal", "fast"}),
                                              "bio": frozenset({"normal"})})


@pytest.mark.parametrize(
    ("argv", "account", "qos"),
    [
        (["-A", "bio", "--qos", "fast"], "bio", "fast"),
        (["-Abio", "-qfast"], "bio", "fast"),
        (["--account=bio", "--qos=fast"], "bio", "fast"),
        (["--account", "bio", "--qos", "fast"], "bio", "fast"),
        (["--accou=bio", "--qo", "fast"], "bio", "fast"),  # unambiguous prefixes (--acc: also --acctg-freq)
        (["-vAbio"], "bio", None),  # bundled after a flag
        (["-p", "gpu"], None, None),
    ],
)
def test_account_and_qos_are_parsed_in_every_spelling_and_passed_through(
    argv: list[str], account: str | None, qos: str | None
) -> None:
    req = parse_request([*argv, "--", "true"])
    assert (req.account, req.qos) == (account, qos)
    assert req.sbatch_options == tuple(argv)  # passed through as given


@pytest.mark.parametrize(
    ("account", "qos", "says"),
    [
        ("nosuch", None, "account 'nosuch': user alice has associations only in bio, physics (default physics)"),
        (None, "nosuch", "QOS 'nosuch' is not allowed for user alice in account physics: use --qos with one of "
                         "fast, normal"),
        ("bio", "fast", "QOS 'fast' is not allowed for user alice in account bio"),
    ],
)
def test_an_account_or_qos_outside_the_users_associations_is_refused_in_one_line(
    account: str | None, qos: str | None, says: str
) -> None:
    with pytest.raises(BadRequest) as err:
        check_associations(ALICE, account, qos)
    assert str(err.value).startswith(says) and len(str(err.value).splitlines()) == 1


def test_the_users_own_accounts_and_qos_pass_in_any_case() -> None:
    for account, qos in ((None, None), ("physics", "fast"), ("BIO", "Normal"), (None, "fast")):
        check_associations(ALICE, account, qos)
    check_associations(UserAssociations("bob", "x", {"x": frozenset()}), "x", "any")  # no QOS listed


def test_a_user_without_an_association_is_told_what_the_admin_must_do() -> None:
    with pytest.raises(BadRequest, match=r"user bob has no association.*sacctmgr add user bob account="):
        check_associations(UserAssociations("bob"), None, None)


class AccountingBackend(FakeBackend):
    def __init__(self, assocs: UserAssociations | Exception | None) -> None:
        super().__init__()
        self.assocs = assocs
        self.asked: list[str] = []

    def user_associations(self, user: str) -> UserAssociations | None:
        self.asked.append(user)
        if isinstance(self.assocs, Exception):
            raise self.assocs
        return self.assocs


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "etc").mkdir()
    (tmp_path / "jobs").mkdir()
    write_topology(Topology.uniform(2, 4), tmp_path / "topology.json")
    return {"SLURM_CONF": str(tmp_path / "etc" / "slurm.conf")}


def _submit(argv: list[str], be: AccountingBackend, env: dict[str, str], err: io.StringIO | None = None) -> str:
    return submit(parse_request([*argv, "--", "true"]), backend=be, env=env, user="alice",  # type: ignore[arg-type]
                  now=lambda: 5.0, stderr=err)


def test_a_refused_account_submits_nothing(cluster: dict[str, str], tmp_path: Path) -> None:
    be = AccountingBackend(ALICE)
    for argv, env in ((["-A", "nosuch"], cluster), ([], {**cluster, "SBATCH_ACCOUNT": "nosuch"}),
                      (["--qos=nosuch"], cluster), ([], {**cluster, "SBATCH_QOS": "nosuch"})):
        with pytest.raises(BadRequest) as err:
            _submit(argv, be, env)
        assert err.value.exit_code == 2
    assert be.submitted == [] and be.asked == ["alice"] * 4
    assert list((tmp_path / "jobs").iterdir()) == []  # no private directory either
    assert _submit(["-A", "bio"], be, cluster) == "101"
    assert "-A" in be.submitted[0].options and "bio" in be.submitted[0].options


def test_accounting_off_is_not_checked_and_slurmdbd_down_is_one_warning(cluster: dict[str, str]) -> None:
    assert _submit(["-A", "nosuch"], AccountingBackend(None), cluster) == "101"
    err = io.StringIO()
    down = AccountingBackend(AccountingUnavailable("cannot read the associations of user alice from slurmdbd"))
    assert _submit(["-A", "nosuch"], down, cluster, err) == "101"
    assert err.getvalue().count("\n") == 1 and "not checked, Slurm decides" in err.getvalue()
