"""Park and unpark across nodes on the real local Slurm (issue 31, item 1): a job on two nodes (whole GPUs: parking
needs no shards) is parked and unparked twice by the protocol. The controller signals only the batch shell
(`scancel --batch`), and srun forwards no SIGURG: the batch wrapper relays it to both nodes' launchers over
srun's standard input. Both nodes' ranks park at one step, go on at once after the unpark, and the job ends
never requeued with the parameters of an uninterrupted run. (Lightning, HF Trainer and `job.loader()` jobs park
through the same signal path: tests/unit/wrapper/test_frameworks_park.py proves them in real processes.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gandiva.requeue.contract import JobFiles, read_progress
from slurm_gandiva.requeue.operations import Outcome
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend
from tests.integration.test_multinode import BOTH, on
from tests.integration.test_requeue_cycle import hash_of, reference_hash, submit, wait_finished, wait_training

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

ARGS = ["--epochs", "30", "--samples", "128", "--batch-size", "16", "--sleep-per-step", "0.05"]


def events(files: JobFiles) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in files.events.read_text().splitlines() if ln.strip()]


def test_a_job_on_two_nodes_parks_and_unparks_on_both_and_ends_bit_identical(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    ref = reference_hash(tmp_path / "ref", ARGS, nprocs=2)
    job_id = submit(slurm, test_user, job_dir, "park-mn", ARGS, gpus=1, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, suspend_timeout=60.0, jobs_root=job_dir)
    res = proto.resume(job_id, on(BOTH, 0))
    assert res.outcome is Outcome.RUNNING, (job_dir / f"{job_id}.out").read_text()
    step = wait_training(slurm, files, job_id, beyond=2, timeout=120.0)
    for _ in range(2):
        res = proto.park(job_id)
        assert res.outcome is Outcome.PARKED, res.describe()  # within the timeout: no escalation
        prog = read_progress(files.progress)
        assert prog is not None and prog.state == "parked" and prog.step >= step
        back = proto.unpark(job_id)
        assert back.outcome is Outcome.RUNNING, back.describe()
        # Both nodes' ranks go on at once (a rank left to its 30 s recheck would hold the other in a collective).
        step = wait_training(slurm, files, job_id, beyond=prog.step + 2, timeout=10.0)
    assert wait_finished(slurm, job_id, timeout=180.0) == "COMPLETED"
    assert slurm.job(job_id).restart_count == 0  # never requeued
    ref_out, ref_err = ref.communicate(timeout=120)
    assert ref.returncode == 0, ref_err
    assert hash_of((job_dir / f"{job_id}.out").read_text()) == hash_of(ref_out)
    evs = events(files)
    starts = [e for e in evs if e["event"] == "node_start"]
    assert sorted(str(e["host"]) for e in starts) == ["n1", "n2"]
    ranks = {int(p) for e in starts for p in e["children"]}  # type: ignore[attr-defined]
    woken = [e for e in evs if e["event"] == "park_signal" and "forwarded_to" in e]  # by each node's launcher
    assert len(woken) >= 8 and {int(p) for e in woken for p in e["forwarded_to"]} == ranks, woken  # type: ignore[attr-defined]
    assert len([e for e in evs if e["event"] == "unparked"]) == 2
    assert not [e for e in evs if e["event"] in ("checkpoint", "resumed")]
