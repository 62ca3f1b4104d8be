"""Slurm's own accounting on a devcluster (`up --accounting`, issue 30 item 1): a MariaDB and a slurmdbd of the
slurmctld's release; accounts physics (2 shares) and bio (1); Slurm's sacct, sshare and its enforcement.

The accounting cluster (`acct_cluster`, tests/integration/conftest.py) is shared with the tenants' tests.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import AccountingUnavailable, LimitRefusal
from slurm_gandiva.model import GpuLimit, GpuRef, Placement, Tenants
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend
from tests.helpers import OTHER_USER, TEST_USER, run_as, wait_for

pytestmark = pytest.mark.slurm


def _sbatch(cluster: DevCluster, user: str, *options: str) -> tuple[int, str, str]:
    out = run_as(user, ["sbatch", "--parsable", "-o", "/dev/null", f"--chdir={cluster.jobs_dir}", *options,
                        "--wrap", "true"], cluster.env)
    return out.returncode, out.stdout.strip(), out.stderr.strip()


def test_daemons_and_slurmdbd_conf(acct_cluster: DevCluster) -> None:
    status = acct_cluster.status()
    running = {d.name for d in status.daemons if d.running}
    assert running == {"slurmctld", "slurmd-n1", "slurmd-n2", "slurmdbd", "mariadb"}
    st = (acct_cluster.etc / "slurmdbd.conf").stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, 0)


def test_users_jobs_show_in_sacct_with_their_accounts(acct_cluster: DevCluster) -> None:
    jobs = {}
    for user in (TEST_USER, OTHER_USER):
        rc, jid, err = _sbatch(acct_cluster, user)
        assert rc == 0, err
        jobs[user] = jid.split(";")[0]

    def rows() -> dict[str, str] | None:
        out = acct_cluster._slurm(["sacct", "-n", "-P", "-X", "-a", "-j", ",".join(jobs.values()),
                                   "-o", "JobID,User,Account,State"])
        got = {ln.split("|")[0]: ln for ln in out.stdout.split()}
        return got if all(got.get(j, "").endswith("|COMPLETED") for j in jobs.values()) else None

    got = wait_for(rows, timeout=60, what="both jobs COMPLETED in sacct")
    assert got[jobs[TEST_USER]] == f"{jobs[TEST_USER]}|{TEST_USER}|physics|COMPLETED"
    assert got[jobs[OTHER_USER]] == f"{jobs[OTHER_USER]}|{OTHER_USER}|bio|COMPLETED"


def test_sshare_lists_both_accounts_with_their_raw_shares(acct_cluster: DevCluster) -> None:
    out = acct_cluster._slurm(["sshare", "-n", "-P", "-a", "-o", "Account,User,RawShares"])
    assert out.returncode == 0, out.stderr
    rows = {tuple(f.strip() for f in ln.split("|")) for ln in out.stdout.splitlines()}
    assert {("physics", "", "2"), ("bio", "", "1"), ("physics", TEST_USER, "1"), ("bio", OTHER_USER, "1")} <= rows


def test_slurm_refuses_an_unknown_account_and_a_user_without_one(acct_cluster: DevCluster) -> None:
    rc, _, err = _sbatch(acct_cluster, TEST_USER, "-A", "nosuch")
    assert rc != 0 and "invalid account" in err.lower(), err
    rc, _, err = _sbatch(acct_cluster, TEST_USER, "-A", "bio")  # an account, but not one of this user's
    assert rc != 0 and "invalid account" in err.lower(), err
    rc, _, err = _sbatch(acct_cluster, "nobody")
    assert rc != 0 and "invalid account" in err.lower(), err
    queued = acct_cluster._slurm(["squeue", "-h", "-o", "%u|%a"])
    assert queued.stdout.strip() == ""


def test_the_backend_reads_shares_and_gpu_limits_from_slurmdbd(acct_cluster: DevCluster) -> None:
    backend = make_backend(acct_cluster.env, kind="cli")
    acct_cluster.sacctmgr(["modify", "account", "bio", "set", "GrpTRES=gres/gpu=2"])
    acct_cluster.sacctmgr(["add", "qos", "tiny", "set", "GrpTRES=gres/gpu=1", "MaxTRESPerUser=gres/gpu=1"])
    try:
        t = backend.tenants()
        assert t.shares == pytest.approx({"physics": 0.5, "bio": 0.25})  # root's user root holds the last 1/4
        assert t.user_shares[("physics", TEST_USER)] == 1.0 and t.user_shares[("bio", OTHER_USER)] == 1.0
        assert {GpuLimit(2, account="bio"), GpuLimit(1, qos="tiny"), GpuLimit(1, qos="tiny", per_user=True)} \
            == set(t.limits)
    finally:
        acct_cluster.sacctmgr(["modify", "account", "bio", "set", "GrpTRES=gres/gpu=-1"])
        acct_cluster.sacctmgr(["delete", "qos", "tiny"])
    assert backend.tenants().limits == ()


def test_a_start_that_an_accounting_limit_holds_back_fails_at_once_and_is_held_again(
    acct_cluster: DevCluster
) -> None:
    """physics limited to 1 GPU while one of its jobs holds one: the protocol's start of another on a free GPU
    fails within seconds with Slurm's own reason (not after the 60-s start timeout), and the job is held again.
    """
    backend = make_backend(acct_cluster.env, kind="cli")
    ids: list[str] = []

    def sleeper(*options: str) -> str:
        out = run_as(TEST_USER, ["sbatch", "--parsable", "-o", "/dev/null", f"--chdir={acct_cluster.jobs_dir}",
                                 *options, "--wrap", "sleep 300"], acct_cluster.env)
        assert out.returncode == 0, out.stderr
        ids.append(out.stdout.strip().split(";")[0])
        return ids[-1]

    acct_cluster.sacctmgr(["modify", "account", "physics", "set", "GrpTRES=gres/gpu=1"])
    try:
        first = sleeper("--gres=gpu:1")
        wait_for(lambda: backend.job(first).running and backend.job(first).gpus, timeout=60,
                 what="physics's first job to run")
        (node,) = backend.job(first).gpus
        second = sleeper("--hold")
        backend.hold(second)  # admin-held, as the controller keeps every job it has not started
        other = "n2" if node == "n1" else "n1"
        proto = RequeueProtocol(backend, start_timeout=60.0)
        t0 = time.time()
        with pytest.raises(LimitRefusal, match=r"accounting holds it back \((Assoc|QOS)\w+"):
            proto.resume(second, Placement((GpuRef(other, 0),)))
        assert time.time() - t0 < 20
        after = backend.job(second)
        assert after.pending and after.hold is HoldKind.ADMIN and not after.gpus
    finally:
        for jid in ids:
            backend.cancel(jid)
        acct_cluster.sacctmgr(["modify", "account", "physics", "set", "GrpTRES=gres/gpu=-1"])
        # Gone from squeue before the next test lists the queue (a cancelled job shows while it completes).
        wait_for(lambda: not _queued(acct_cluster), timeout=60, what="the test's jobs to leave the queue")


def test_a_cluster_without_accounting_says_so_in_one_line(slurm: SlurmBackend) -> None:
    with pytest.raises(AccountingUnavailable) as err:
        slurm.tenants()
    assert len(str(err.value).splitlines()) == 1 and "slurmdbd" in str(err.value)



GANDIVA = str(Path(sys.executable).parent / "gandiva")


def _gandiva_sbatch(cluster: DevCluster, user: str, *options: str) -> tuple[int, str, str]:
    out = run_as(user, [GANDIVA, "sbatch", "--parsable", "-o", "/dev/null", *options, "--", "/bin/true"],
                 cluster.env)
    return out.returncode, out.stdout.strip(), out.stderr.strip()


def _queued(cluster: DevCluster) -> str:
    return cluster._slurm(["squeue", "-h", "-o", "%i|%u|%a"]).stdout.strip()


@pytest.mark.parametrize(
    ("user", "options", "says"),
    [
        (TEST_USER, ("-A", "nosuch"), f"account 'nosuch': user {TEST_USER} has associations only in physics"),
        (TEST_USER, ("--account=bio",), f"account 'bio': user {TEST_USER} has associations only in physics"),
        (TEST_USER, ("--qos", "nosuch"), f"QOS 'nosuch' is not allowed for user {TEST_USER} in account physics"),
        ("nobody", (), "user nobody has no association in Slurm's accounting"),
    ],
)
def test_gandiva_sbatch_refuses_an_account_or_qos_outside_the_users_associations(
    acct_cluster: DevCluster, user: str, options: tuple[str, ...], says: str
) -> None:
    before = _queued(acct_cluster)
    rc, out, err = _gandiva_sbatch(acct_cluster, user, *options)
    assert rc == 2 and out == "", (out, err)
    assert len(err.splitlines()) == 1 and says in err, err
    assert _queued(acct_cluster) == before  # nothing reached Slurm


def test_gandiva_sbatch_submits_under_the_users_own_account(acct_cluster: DevCluster) -> None:
    rc, jid, err = _gandiva_sbatch(acct_cluster, TEST_USER, "-A", "physics", "--qos=normal")
    try:
        assert rc == 0 and jid.isdigit(), err
        job = make_backend(acct_cluster.env, kind="cli").job(jid)
        assert (job.user, job.account, job.qos, job.pending) == (TEST_USER, "physics", "normal", True)
    finally:
        if jid.isdigit():
            acct_cluster._slurm(["scancel", jid])
            wait_for(lambda: jid not in _queued(acct_cluster) or None, timeout=30, what=f"job {jid} gone")


def test_the_backend_reads_slurms_decayed_gpu_usage_of_each_account(acct_cluster: DevCluster) -> None:
    """A 3-GPU physics job of ~25 s: sshare's decayed usage (GrpTRESRaw gres/gpu, whole GPU-minutes) of
    physics and of its user grows by about its GPU-time; bio's does not grow (decay only shrinks it)."""
    backend = make_backend(acct_cluster.env, kind="cli")
    before = backend.tenants()
    assert "physics" in before.usage and "bio" in before.usage, before  # multifactor, gres/gpu accounted
    out = run_as(TEST_USER, ["sbatch", "--parsable", "-o", "/dev/null", f"--chdir={acct_cluster.jobs_dir}",
                             "--gres=gpu:3", "--wrap", "sleep 25"], acct_cluster.env)
    assert out.returncode == 0, out.stderr

    def grown() -> Tenants | None:
        t = backend.tenants()
        return t if t.usage["physics"] >= before.usage["physics"] + 60 else None

    after = wait_for(grown, timeout=150, interval=2.0, what="physics' Slurm usage grows by a GPU-minute")
    gained = after.usage["physics"] - before.usage["physics"]
    assert 60 <= gained <= 3 * 60, gained  # 3 GPUs x ~25 s = 75 GPU-s, printed in whole minutes
    assert after.user_usage[("physics", TEST_USER)] - before.user_usage.get(("physics", TEST_USER), 0.0) == gained
    assert after.usage["bio"] <= before.usage["bio"]
