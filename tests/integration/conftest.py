"""Fixtures for tests against the real cluster: a per-test job directory and job clean-up."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import SlurmError
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import OTHER_USER, TEST_USER, ensure_user


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
