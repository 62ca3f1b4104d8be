"""Fixtures for tests against the real cluster: a per-test job directory and job clean-up."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import SlurmError
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import OTHER_USER, TEST_USER, ensure_user, tails


@pytest.fixture(scope="module")
def users() -> tuple[str, str]:
    """(A, B): the two ordinary users of the two-user tests (B the attacker where there is one)."""
    try:
        return ensure_user(TEST_USER), ensure_user(OTHER_USER)
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def job_dir(slurm_cluster: DevCluster) -> Path:
    """A fresh world-writable directory under the cluster's jobs/ dir (jobs run as other users write here)."""
    d = slurm_cluster.jobs_dir / f"test-{uuid.uuid4().hex[:10]}"
    d.mkdir()
    d.chmod(0o777)
    return d


@pytest.fixture
def cleanup_jobs(slurm: SlurmBackend) -> Iterator[list[str]]:
    """Append job ids to this list; they are cancelled after the test, pass or fail."""
    ids: list[str] = []
    yield ids
    for jid in ids:
        with contextlib.suppress(SlurmError):
            slurm.cancel(jid)


@pytest.fixture(scope="session")
def acct_cluster(test_user: str) -> Iterator[DevCluster]:
    """A running devcluster with accounting (2 nodes, 3 GPUs each; ports from GANDIVA_TEST_PORT_BASE + 800),
    accounts physics (2 shares) and bio (1), TEST_USER in physics and OTHER_USER in bio; shared by the
    accounting and tenants' tests, stopped at the end of the session."""
    ensure_user(OTHER_USER)
    base = int(os.environ.get("GANDIVA_TEST_PORT_BASE", "16800")) + 800
    cluster = DevCluster(tempfile.mkdtemp(prefix="gandiva-acct-"), nodes=2, gpus_per_node=3, port_base=base,
                         accounting=True)
    try:
        try:
            cluster.up()
            cluster.add_account("physics", fairshare=2)
            cluster.add_account("bio", fairshare=1)
            cluster.add_user(test_user, "physics")
            cluster.add_user(OTHER_USER, "bio")
        except Exception as exc:
            # into the failure's captured output, for CI's log
            print(tails([cluster.log_dir / "slurmdbd.log", cluster.log_dir / "mariadb.log"], lines=40))
            pytest.fail(f"the devcluster with accounting did not start on port base {base}: {exc}")
        yield cluster
    finally:
        pids = [d.pid for d in cluster.status().daemons if d.pid is not None]
        cluster.down()
        assert not any(Path(f"/proc/{p}/cmdline").exists() and Path(f"/proc/{p}/cmdline").read_bytes()
                       for p in pids), "a daemon of the accounting cluster outlived down()"
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
