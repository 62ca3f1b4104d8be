"""Jobs on several nodes on the real local Slurm: one job across n1 and n2, suspended, moved, resized, and a
rank killed on one node.

The batch script runs gandiva-wrapper on the first node; it starts one launcher per node through srun, and
every launcher runs its node's ranks of examples/train.py (gloo on CPU; Slurm's fake GPUs). The placements go
through the requeue protocol, as the controller's would.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JobFiles, read_progress
from slurm_gandiva.requeue.operations import OpResult, Outcome
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend
from tests.helpers import wait_for
from tests.integration.test_requeue_cycle import hash_of, reference_hash, submit, wait_finished, wait_training

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]


def on(nodes: tuple[str, ...], *gpus: int) -> Placement:
    """The same GPUs on each of `nodes` (what Slurm's per-node gres gives a job)."""
    return Placement(tuple(GpuRef(n, g) for n in nodes for g in gpus))


BOTH = ("n1", "n2")


def events(files: JobFiles) -> list[dict[str, object]]:
    return [json.loads(x) for x in files.events.read_text().splitlines()]


def starts(files: JobFiles) -> list[tuple[object, list[object]]]:
    """(nprocs of the whole job, hosts of its node launchers) of every start."""
    out: list[tuple[object, list[object]]] = []
    for e in events(files):
        if e["event"] == "start":
            out.append((e["nprocs"], []))
        elif e["event"] == "node_start" and out:
            out[-1][1].append(e["host"])
    return [(n, sorted(h)) for n, h in out]  # type: ignore[type-var]


def wait_fresh_training(slurm: SlurmBackend, files: JobFiles, job_id: str, since: float) -> None:
    """Wait until the ranks started after `since` have trained two steps (progress.json from an earlier
    start would say so at once, and a signal sent before the batch shell's trap kills the job)."""

    def fresh() -> bool:
        if (job := slurm.job(job_id)).finished:
            status = files.status.read_text() if files.status.exists() else "none"
            raise AssertionError(f"job {job_id} ended ({job.state}); its status: {status}")
        prog = read_progress(files.progress)
        return prog is not None and prog.started is not None and prog.started > since and prog.step >= 2

    wait_for(lambda: fresh() or None, timeout=120.0, interval=0.2, what="the new start to train")


def test_a_4_gpu_job_on_two_nodes_is_suspended_and_resumed_there_to_the_uninterrupted_hash(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    args = ["--epochs", "3", "--samples", "512", "--batch-size", "32", "--sleep-per-step", "0.2"]  # 48 steps, 9.6 s
    job_id = submit(slurm, test_user, job_dir, "mn-hash", args, gpus=1, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, suspend_timeout=90.0, jobs_root=job_dir)
    # Two ranks on each node (the 8-rank job across nodes is the move/resize test's): the same mechanism, half
    # the processes to start twice and to run again uninterrupted for the reference, on 2 cores.
    whole = on(BOTH, 0, 1)
    res = proto.resume(job_id, whole)
    assert res.outcome is Outcome.RUNNING and res.placement == whole, res
    job = slurm.job(job_id)
    assert dict(job.gpus) == {"n1": (0, 1), "n2": (0, 1)}
    step = wait_training(slurm, files, job_id, beyond=3, timeout=120.0)
    res = proto.suspend(job_id)
    assert res.outcome is Outcome.SUSPENDED, res  # every rank on both nodes stopped at one step: no escalation
    held = slurm.job(job_id)
    assert held.pending and held.hold is HoldKind.ADMIN and held.restart_count == 1
    status = json.loads(files.status.read_text())
    assert status["outcome"] == "suspended" and status["child_exit_codes"] == [75] * 4, status
    assert status["step"] > step
    ref = reference_hash(tmp_path / "ref", args, nprocs=4)  # the same 4 ranks, uninterrupted, outside Slurm
    res = proto.resume(job_id, whole)
    assert res.outcome is Outcome.RUNNING, res
    assert wait_finished(slurm, job_id, timeout=240.0) == "COMPLETED"
    ref_out, ref_err = ref.communicate(timeout=240)
    assert ref.returncode == 0, ref_err
    assert hash_of((job_dir / f"{job_id}.out").read_text()) == hash_of(ref_out)
    assert starts(files) == [(4, ["n1", "n2"]), (4, ["n1", "n2"])]
    resumed = [e for e in events(files) if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["world_size"] == 4 and resumed[0]["step"] == status["step"]


def test_a_job_across_nodes_moves_to_other_gpus_and_resizes_8_4_8_seeing_every_sample_once_per_epoch(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    samples, epochs = 128, 6  # 48 steps of 8 ranks or fewer (8 an epoch): the four moves take some 15 of them
    log = job_dir / "samples.jsonl"
    args = ["--epochs", str(epochs), "--samples", str(samples), "--batch-size", "16", "--sleep-per-step", "0.1",
            "--sample-log", str(log)]
    job_id = submit(slurm, test_user, job_dir, "mn-move", args, gpus=1, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, suspend_timeout=90.0, jobs_root=job_dir)
    plan: list[tuple[Callable[..., OpResult], Placement]] = [
        (proto.resume, on(BOTH, 0, 1)),  # 4 GPUs, two on each node
        (proto.migrate, on(BOTH, 2, 3)),  # moved to the other two GPUs of each node
        (proto.resize, on(BOTH, 0, 1, 2, 3)),  # 8
        (proto.resize, on(("n1",), 0, 1, 2, 3)),  # 4 on one node
        (proto.resize, on(BOTH, 0, 1, 2, 3)),  # 8 again
    ]
    since = 0.0
    for i, (op, target) in enumerate(plan):
        if i:
            wait_fresh_training(slurm, files, job_id, since)
        since = time.time()
        res = op(job_id, target)
        assert res.outcome is Outcome.RUNNING and res.placement == target, (i, res)
        job = slurm.job(job_id)
        assert Placement(tuple(GpuRef(n, g) for n, ix in job.gpus.items() for g in ix)) == target
    assert wait_finished(slurm, job_id, timeout=240.0) == "COMPLETED"
    seen: dict[int, Counter[int]] = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        seen.setdefault(rec["epoch"], Counter()).update(rec["ids"])
    assert sorted(seen) == list(range(epochs))
    for epoch, counts in seen.items():
        assert counts == Counter(range(samples)), f"epoch {epoch}: repeats or gaps"
    assert starts(files) == [(4, ["n1", "n2"]), (4, ["n1", "n2"]), (8, ["n1", "n2"]), (4, []), (8, ["n1", "n2"])]


def test_a_rank_killed_on_the_second_node_fails_the_job_cleanly_with_nothing_left_running(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    args = ["--epochs", "200", "--samples", "256", "--batch-size", "16", "--sleep-per-step", "0.1"]
    job_id = submit(slurm, test_user, job_dir, "mn-kill", args, gpus=1, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, suspend_timeout=90.0, jobs_root=job_dir)
    assert proto.resume(job_id, on(BOTH, 0, 1)).outcome is Outcome.RUNNING
    wait_training(slurm, files, job_id, beyond=3, timeout=120.0)
    launched = {e["host"]: e["children"] for e in events(files) if e["event"] == "node_start"}
    assert sorted(launched) == ["n1", "n2"]  # type: ignore[type-var]
    ranks = [int(p) for pids in launched.values() for p in pids]  # type: ignore[attr-defined]
    victim = int(launched["n2"][1])  # type: ignore[index]  # rank 3, on the second node
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    assert wait_finished(slurm, job_id, timeout=90.0) == "FAILED"
    took = time.monotonic() - t0
    assert took < 60.0, f"the job took {took:.0f} s to end after a rank died"
    status = json.loads(files.status.read_text())
    assert status["outcome"] == "failed" and "killed by SIGKILL" in status["reason"], status

    def gone() -> bool:
        return not any(Path(f"/proc/{p}").exists() for p in ranks)

    wait_for(lambda: gone() or None, timeout=30.0, what="every rank of the failed job to be gone")
