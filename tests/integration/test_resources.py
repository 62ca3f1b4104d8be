"""Issue 29, item 5, against the real local Slurm cluster: CPUs and memory count. The controller never plans a
start on a node whose CPUs or memory other jobs hold (its own or another user's), even where that node has
free GPUs: no start times out, and a job runs where its CPUs and memory are free. The devcluster counts memory
(SelectTypeParameters=CR_Core_Memory, DefMemPerCPU: a job's CPUs' share of a node).

Port base: GANDIVA_TEST_PORT_BASE (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.controller.service import BACKOFF_EVENT
from slurm_gandiva.devcluster.cluster import CPUS_PER_NODE, MEMORY_MB, DevCluster
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import OTHER_USER, TEST_USER, ensure_user, run_as
from tests.integration.test_controller import Env, make_env, wait_for
from tests.integration.test_hostile import gsbatch

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

START_BOUND_S = 30.0  # well under the controller's 60-s start timeout (suspend_timeout)


@pytest.fixture
def env(slurm_cluster: DevCluster, slurm: SlurmBackend, tmp_path: Path) -> Iterator[Env]:
    for j in slurm.jobs():  # leftovers would join this controller's workload or hold CPUs
        if not j.finished:
            with contextlib.suppress(Exception):
                slurm.cancel(j.job_id)
    tmp_path.chmod(0o755)
    e = make_env(slurm_cluster, slurm, tmp_path, {"n1": (0, 1, 2), "n2": (0, 1)}, "gandiva", 600,
                 "pack = no\nmigrate = no\ngrow = no")
    e.conf.chmod(0o644)
    e.start()
    try:
        wait_for(lambda: "controller running" in e.log_text(), 90, "the controller to start")
        yield e
    finally:
        with contextlib.suppress(Exception):
            e.stop(timeout=60)
        for j in slurm.jobs():
            if not j.finished:
                with contextlib.suppress(Exception):
                    slurm.cancel(j.job_id)


def assert_no_backoff(env: Env, jobs: list[str]) -> None:
    """No start or move of `jobs` backed off (none timed out), and no tick failed. Only the test's own jobs:
    an earlier test's job, cancelled at its end, may fail a move of its own."""
    store = env.store()
    try:
        events = store.events(kinds=[BACKOFF_EVENT])
    finally:
        store.close()
    backoffs = [e for e in events if e.job_id in jobs]
    assert not backoffs, (backoffs, jobs)
    assert "tick failed" not in env.log_text()


def test_a_node_whose_cpus_are_taken_is_not_offered(
    env: Env, slurm_cluster: DevCluster, slurm: SlurmBackend
) -> None:
    a, b = ensure_user(TEST_USER), ensure_user(OTHER_USER)
    assert CPUS_PER_NODE == 8
    # Another user's job outside gandiva takes every CPU of n2 (and no GPU).
    proc = run_as(b, ["sbatch", "--parsable", "-p", "gpu", "-w", "n2", "-c", "8", "-o", "/dev/null",
                      "--wrap", "sleep 600"], slurm_cluster.env)
    assert proc.returncode == 0, proc.stderr
    hog = proc.stdout.strip()
    wait_for(lambda: slurm.job(hog).state == "RUNNING", 60, "the CPU hog to run on n2")
    mine = []
    for _ in range(2):
        proc = gsbatch(slurm_cluster, a, "-c", "4", "--", "sleep", "600")
        assert proc.returncode == 0, proc.stderr
        mine.append(proc.stdout.strip())
    t0 = time.time()
    wait_for(lambda: all(slurm.job(j).state == "RUNNING" for j in mine), 60, "A's two -c 4 jobs to run")
    assert time.time() - t0 < START_BOUND_S
    assert [slurm.job(j).nodes for j in mine] == [("n1",), ("n1",)]  # n2's free GPUs have no CPUs
    if os.environ.get("GANDIVA_CPU_PROBE"):
        out = subprocess.run(["sinfo", "--json"], capture_output=True, text=True, env={**os.environ,
                             **slurm_cluster.env}, check=False).stdout
        Path(os.environ["GANDIVA_CPU_PROBE"]).write_text(out)
    slurm.cancel(hog)
    wait_for(lambda: slurm.job(hog).finished, 30, "the hog to end")
    # n1 has a free GPU but A's jobs hold its 8 CPUs: B's job runs on n2, at once.
    proc = gsbatch(slurm_cluster, b, "--", "sleep", "600")
    assert proc.returncode == 0, proc.stderr
    third = proc.stdout.strip()
    t0 = time.time()
    wait_for(lambda: slurm.job(third).state == "RUNNING", 60, "B's job to run")
    assert time.time() - t0 < START_BOUND_S
    assert slurm.job(third).nodes == ("n2",)
    assert_no_backoff(env, [*mine, third])


def test_a_node_whose_memory_is_taken_is_not_offered(
    env: Env, slurm_cluster: DevCluster, slurm: SlurmBackend
) -> None:
    a, b = ensure_user(TEST_USER), ensure_user(OTHER_USER)
    assert slurm.capabilities().memory_consumable  # found from the running Slurm's SelectTypeParameters
    assert (CPUS_PER_NODE, MEMORY_MB) == (8, 8000)
    # Two jobs of another user outside gandiva fill n2's memory (one CPU each, no GPU).
    hogs = []
    for _ in range(2):
        proc = run_as(b, ["sbatch", "--parsable", "-p", "gpu", "-w", "n2", "--mem=4000", "-o", "/dev/null",
                          "--wrap", "sleep 600"], slurm_cluster.env)
        assert proc.returncode == 0, proc.stderr
        hogs.append(proc.stdout.strip())
    wait_for(lambda: all(slurm.job(j).state == "RUNNING" for j in hogs), 60, "the memory hogs to run on n2")
    # A's two jobs whose --mem fills a node: n2 has free GPUs and CPUs but no memory, so both go to n1.
    mine = []
    for _ in range(2):
        proc = gsbatch(slurm_cluster, a, "--mem=4000", "--", "sleep", "600")
        assert proc.returncode == 0, proc.stderr
        mine.append(proc.stdout.strip())
    t0 = time.time()
    wait_for(lambda: all(slurm.job(j).state == "RUNNING" for j in mine), 60, "A's two --mem=4000 jobs to run")
    assert time.time() - t0 < START_BOUND_S
    assert [slurm.job(j).nodes for j in mine] == [("n1",), ("n1",)]
    for j in hogs:
        slurm.cancel(j)
    wait_for(lambda: all(slurm.job(j).finished for j in hogs), 30, "the hogs to end")
    # n1 has a free GPU and 6 free CPUs, but A's jobs hold its memory: B's job (DefMemPerCPU) runs on n2, at once.
    proc = gsbatch(slurm_cluster, b, "--", "sleep", "600")
    assert proc.returncode == 0, proc.stderr
    third = proc.stdout.strip()
    t0 = time.time()
    wait_for(lambda: slurm.job(third).state == "RUNNING", 60, "B's job to run")
    assert time.time() - t0 < START_BOUND_S
    assert slurm.job(third).nodes == ("n2",)
    assert slurm.job(third).min_memory_per_node == MEMORY_MB // CPUS_PER_NODE  # DefMemPerCPU, not the node
    assert_no_backoff(env, [*mine, third])
