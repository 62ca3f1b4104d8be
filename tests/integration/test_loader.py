"""A job training through Session.loader() (a DataLoader with 2 worker processes) on the real local Slurm:
suspended by the RequeueProtocol mid-epoch, resumed on another node's GPU, and finished with the parameters
of an uninterrupted run, which are those of batches() too.

The job script, submission and waits are test_requeue_cycle's (examples/train.py under gandiva-wrapper).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from job_wrapper import checkpoint as ckpt
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JobFiles, read_progress
from slurm_gandiva.requeue.operations import Outcome
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend
from tests.integration.test_requeue_cycle import (
    hash_of,
    progress_step,
    reference_hash,
    starts,
    submit,
    wait_finished,
    wait_training,
)

pytestmark = pytest.mark.slurm  # every test here uses the real cluster

SAMPLES, BATCH, EPOCHS = 192, 16, 4  # 12 steps an epoch, 48 in all


def test_loader_with_workers_suspended_and_moved_gives_the_uninterrupted_hash(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    args = ["--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--batch-size", str(BATCH),
            "--sleep-per-step", "0.2"]  # 9.6 s: the test signals the job after step 3, however loaded
    loader_args = [*args, "--loader-workers", "2"]
    # The uninterrupted runs (outside Slurm, the same wrapper, 1 process): loader() and batches().
    refs = [reference_hash(tmp_path / "ref-loader", loader_args), reference_hash(tmp_path / "ref-batches", args)]
    job_id = submit(slurm, test_user, job_dir, "loader", loader_args, gpus=1, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, jobs_root=job_dir)

    assert proto.resume(job_id, Placement((GpuRef("n1", 1),))).outcome is Outcome.RUNNING
    wait_training(slurm, files, job_id, beyond=3)
    res = proto.suspend(job_id)
    assert res.outcome is Outcome.SUSPENDED, res
    # Stopped at a mini-batch boundary mid-training; the checkpoint counts the global samples the loop
    # consumed in the epoch (what the workers had prefetched beyond them is not counted).
    st = ckpt.decode(files.checkpoint.read_bytes())
    assert 3 < st["step"] < EPOCHS * SAMPLES // BATCH, st["step"]
    assert (st["epoch"], st["position"]) == divmod(st["step"] * BATCH, SAMPLES), st
    prog = read_progress(files.progress)
    assert prog is not None and prog.state == "suspended" and prog.step == st["step"]
    assert prog.batch_time_avg > 0 and prog.samples_per_s > 0  # mini-batch times for the controller

    assert proto.resume(job_id, Placement((GpuRef("n2", 2),))).outcome is Outcome.RUNNING
    assert wait_finished(slurm, job_id) == "COMPLETED"
    assert progress_step(files) == EPOCHS * SAMPLES // BATCH
    out = (job_dir / f"{job_id}.out").read_text()
    hashes = set()
    for ref in refs:
        ref_out, ref_err = ref.communicate(timeout=60)
        assert ref.returncode == 0, ref_err
        hashes.add(hash_of(ref_out))
    assert hashes == {hash_of(out)}
    assert starts(job_dir / f"{job_id}.out") == [(0, "n1", "1"), (1, "n2", "2")]
