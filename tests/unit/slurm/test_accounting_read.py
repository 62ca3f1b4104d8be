"""slurm/accounting.py: sacctmgr's parsable listings read as `Tenants` (the lines as 24.11 prints them)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_gandiva.errors import AccountingUnavailable
from slurm_gandiva.model import GpuLimit, JobSpec
from slurm_gandiva.slurm.accounting import (
    SSHARE_ARGV,
    UserAssociations,
    parse_usage,
    parse_user_associations,
    read_tenants,
    user_assoc_argv,
)
from slurm_gandiva.slurm.cli_backend import CliBackend, _classify
from slurm_gandiva.slurm.gres import tres_gpus

ASSOC = """root|||1|
root|root||1|
bio||root|1|gres/gpu=2
bio|bob||1|
physics||root|2|cpu=8,gres/gpu=4
physics|alice||3|
physics|carol||parent|gres/gpu=1
hep||physics|1|
hep|dave||1|
"""
QOS = """normal|||
small|gres/gpu=1|gres/gpu=1
wide|cpu=2|
"""


def test_shares_are_normalised_down_the_tree_as_sshare_prints_them() -> None:
    t = read_tenants(ASSOC, QOS)
    # root's children: user root (1), bio (1), physics (2): 1/4 and 2/4; physics' children: alice 3,
    # carol parent (1), hep 1: hep = 0.5 * 1/5.
    assert t.shares == pytest.approx({"bio": 0.25, "physics": 0.5, "hep": 0.1})
    assert t.user_shares[("physics", "alice")] == 3.0 and t.user_shares[("physics", "carol")] == 1.0


def test_gpu_limits_of_associations_and_qos() -> None:
    t = read_tenants(ASSOC, QOS)
    assert set(t.limits) == {
        GpuLimit(2, account="bio"), GpuLimit(4, account="physics"), GpuLimit(1, account="physics", user="carol"),
        GpuLimit(1, qos="small"), GpuLimit(1, qos="small", per_user=True),
    }
    job = JobSpec("1", "alice", 1, 1, 0.0, account="physics", qos="small")
    other = JobSpec("2", "bob", 1, 1, 0.0, account="bio", qos="small")
    per_user = GpuLimit(1, qos="small", per_user=True)
    assert per_user.scope(job) != per_user.scope(other)  # each user's jobs counted apart
    assert GpuLimit(1, qos="small").scope(job) == GpuLimit(1, qos="small").scope(other)
    assert GpuLimit(4, account="physics").scope(other) is None
    assert GpuLimit(1, account="physics", user="carol").scope(job) is None


def test_tres_gpus_reads_the_untyped_gpu_count_only() -> None:
    assert tres_gpus("cpu=8,gres/gpu=2") == 2
    assert tres_gpus("gres/gpu:a100=2") is None and tres_gpus("") is None and tres_gpus("gres/gpu=x") is None


@pytest.mark.parametrize(
    ("assoc", "says"),
    [("bio||root|lots|\n", "not a number"), ("bio||root|-1|\n", "negative"), ("bio|root\n", "fields"),
     ("", "no root association"), ("bio||root|1|\n", "no root association")],
)
def test_a_listing_that_cannot_be_read_is_one_error(assoc: str, says: str) -> None:
    with pytest.raises(AccountingUnavailable, match=says):
        read_tenants(assoc, "")


def test_a_share_of_zero_is_kept_as_zero() -> None:
    t = read_tenants("root|||1|\nidle||root|0|\nbusy||root|1|\n", "")
    assert t.shares == {"idle": 0.0, "busy": 1.0}


def test_a_users_associations_pool_the_qos_of_each_account() -> None:
    # 24.11's `sacctmgr -nP show user name=alice withassoc format=User,DefaultAccount,Account,QOS`: one row
    # per association (two in physics: one per partition), account and QOS names as Slurm stores them
    out = "alice|physics|bio|normal\nalice|physics|physics|fast,normal\nalice|physics|Physics|long\n"
    a = parse_user_associations("alice", out)
    assert a == UserAssociations("alice", "physics", {"bio": frozenset({"normal"}),
                                                       "physics": frozenset({"fast", "normal", "long"})})
    assert a.accounts == ("bio", "physics")


def test_a_user_without_an_association_has_no_account() -> None:
    assert parse_user_associations("nobody", "").accounts == ()
    with pytest.raises(AccountingUnavailable):
        parse_user_associations("alice", "alice|physics\n")


@pytest.mark.parametrize(
    ("stderr", "expect"),
    [("You are not running a supported accounting_storage plugin\nOnly 'accounting_storage/slurmdbd' is "
      "supported.", None),
     ("sacctmgr: error: Sending PersistInit msg: Connection refused", AccountingUnavailable)],
)
def test_the_backend_tells_accounting_off_from_slurmdbd_down(
    stderr: str, expect: type[Exception] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fail(argv: Sequence[str], what: str, **_: object) -> str:
        seen.append(list(argv))
        raise _classify(what, stderr, 1)

    b = CliBackend()
    monkeypatch.setattr(b, "_run", fail)
    if expect is None:
        assert b.user_associations("alice") is None
    else:
        with pytest.raises(expect, match=r"alice.*Connection refused") as err:
            b.user_associations("alice")
        assert len(str(err.value).splitlines()) == 1
    assert seen == [list(user_assoc_argv("alice"))]


# `sshare --noheader --parsable2 --all --format=Account,User,GrpTRESRaw` (SSHARE_ARGV) on the accounting
# devcluster after one 3-GPU physics job of 25 s, captured from each release (the tree indented by spaces).
def _sshare(tres: str) -> str:
    used, unused = tres.format(mem=416, gpu=1), tres.format(mem=0, gpu=0)
    return (f"root||{used}\n root|root|{unused}\n bio||{unused}\n  bio|gandiva-test2|{unused}\n"
            f" physics||{used}\n  physics|gandiva-test|{used}\n")


_TRES = "cpu=0,mem={mem},energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu={gpu}"
SSHARE_22_05 = _sshare(_TRES)
SSHARE_24_11 = _sshare(_TRES + ",gres/gpumem=0,gres/gpuutil=0")  # 24.11 also accounts gpumem and gpuutil


@pytest.mark.parametrize("out", [SSHARE_22_05, SSHARE_24_11], ids=["22.05", "24.11"])
def test_slurms_decayed_gpu_usage_is_read_from_sshares_grptresraw_in_gpu_seconds(out: str) -> None:
    assert SSHARE_ARGV[-1] == "--format=Account,User,GrpTRESRaw"
    usage, users = parse_usage(out)
    assert usage == {"bio": 0.0, "physics": 60.0}  # one GPU-minute; root (the cluster's total) left out
    assert users == {("root", "root"): 0.0, ("bio", "gandiva-test2"): 0.0, ("physics", "gandiva-test"): 60.0}
    t = read_tenants(ASSOC, QOS, out)
    assert (t.usage, t.user_usage) == (usage, users) and t.shares["physics"] == 0.5


@pytest.mark.parametrize(
    "out",
    [None, "", "root||cpu=0,mem=0\n physics||cpu=5,mem=9\n",  # gres/gpu not in AccountingStorageTRES
     "sshare: error: You are not running a supported priority plugin\n"],
)
def test_no_usage_from_sshare_is_no_usage_not_an_error(out: str | None) -> None:
    t = read_tenants(ASSOC, QOS, out)
    assert (t.usage, t.user_usage) == ({}, {}) and t.shares["physics"] == 0.5
