"""The wrapper under the real local Slurm: the batch script execs it, the controller's signal reaches it,
training checkpoints at a mini-batch boundary, and the job requeue-holds itself (same id, PENDING held)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from job_wrapper import checkpoint as ckpt
from job_wrapper.progress import read_events
from slurm_gandiva.requeue.contract import JobFiles, read_progress
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SubmitRequest
from tests.helpers import wait_for

pytestmark = pytest.mark.slurm  # every test here uses the real cluster

BIN = Path(sys.executable).parent
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def test_signalled_job_checkpoints_and_goes_pending_held(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    cmd = [str(BIN / "gandiva-wrapper"), "--progress-interval", "0.2", "--", sys.executable, str(TRAIN),
           "--epochs", "50", "--samples", "256", "--batch-size", "16", "--sleep-per-step", "0.05"]
    script = (
        "#!/bin/bash\n"
        f'export GANDIVA_STATE_DIR={shlex.quote(str(job_dir))}/"$SLURM_JOB_ID"\n'
        f"exec {shlex.join(cmd)}\n"
    )
    job_id = slurm.submit(SubmitRequest(script, options=[
        "--job-name=h2-wrapper", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--mem=1G",
        "--nodelist=n1", "--gres=gpu:g1:1,gpu:g3:1", f"--chdir={job_dir}", f"--output={job_dir}/%j.out",
    ], as_user=test_user))
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    out = job_dir / f"{job_id}.out"

    def training() -> int | None:
        job = slurm.job(job_id)
        assert not job.finished, f"job ended early: {job.state}\n{out.read_text() if out.exists() else ''}"
        prog = read_progress(files.progress)
        return prog.step if job.running and prog is not None and prog.step >= 3 else None

    wait_for(training, timeout=180, interval=0.2, what=f"job {job_id} to train 3 steps")
    slurm.signal(job_id, "USR2", batch_only=True)

    held = wait_for(
        lambda: j if (j := slurm.job(job_id)).pending and j.restart_count == 1 else None,
        timeout=120, interval=0.2, what=f"job {job_id} to be requeued",
    )
    # requeuehold run by the job itself (its owner) leaves a user hold; the controller makes it an admin hold
    assert held.hold is HoldKind.USER and held.reason in ("job_requeued_in_held_state", "JobHeldUser"), held
    status = json.loads(files.status.read_text())
    assert status["outcome"] == "suspended" and status["job_id"] == job_id, status
    # One training process per allocated GPU, each on its own GPU.
    assert status["nprocs"] == 2 and status["gpus"] == ["1", "3"] and status["child_exit_codes"] == [75, 75]
    state = ckpt.decode(files.checkpoint.read_bytes())
    assert state["step"] >= 3 and state["world_size"] == 2
    # Slurm shows the job held as soon as `scontrol requeuehold` takes; the wrapper logs it when the command
    # returns, a moment later (CI under load read the log in between).
    kinds: list[str] = wait_for(
        lambda: k if "requeuehold_done" in (k := [e["event"] for e in read_events(files.events)]) else None,
        timeout=30, interval=0.2, what="the wrapper to log its requeuehold",
    )
    assert kinds.index("signal") < kinds.index("checkpoint") < kinds.index("exit") < kinds.index("requeuehold_done")


def test_a_signalled_array_task_requeues_itself_alone(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """Task 1 of a two-task array starts last, so it runs under the array's own job id; signalled once task
    0 has completed, its wrapper must requeue-hold task 1 alone. `scontrol requeuehold <that id>` would
    requeue the whole array, the completed task 0 too (seen in CI: a cancelled task ran again)."""
    job = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_job.py"  # exits 75 at the signal
    cmd = [str(BIN / "gandiva-wrapper"), "--", sys.executable, str(job)]
    script = (
        "#!/bin/bash\n"
        '[ "$SLURM_ARRAY_TASK_ID" = 0 ] && exit 0\n'
        f'export GANDIVA_STATE_DIR={shlex.quote(str(job_dir))}/"${{SLURM_ARRAY_JOB_ID}}_$SLURM_ARRAY_TASK_ID"\n'
        f"exec {shlex.join(cmd)}\n"
    )
    array = slurm.submit(SubmitRequest(script, options=[
        "--job-name=array-requeue", "--array=0-1", "--ntasks=1", "--cpus-per-task=1", "--mem=500M",
        "--gres=gpu:1", f"--chdir={job_dir}", f"--output={job_dir}/%A_%a.out",
    ], as_user=test_user))
    first, second = f"{array}_0", f"{array}_1"
    cleanup_jobs.extend([first, second])
    events = JobFiles(job_dir / second).events

    def started() -> bool:
        states = {j.job_id: j for j in slurm.jobs() if j.array_id == array}
        done = states.get(first) is not None and states[first].state == "COMPLETED"
        up = states.get(second) is not None and states[second].running
        return done and up and any(e["event"] == "start" for e in read_events(events))

    wait_for(started, timeout=90, interval=0.2, what=f"task {first} to complete and {second} to run")
    slurm.signal(second, "USR2", batch_only=True)
    wait_for(lambda: (j := slurm.job(second)).pending and j.restart_count == 1, timeout=60, interval=0.2,
             what=f"task {second} to be requeued")
    kinds = [e["event"] for e in read_events(events)]
    assert "requeuehold_done" in kinds, kinds
    assert slurm.job(first).state == "COMPLETED", slurm.job(first)  # not requeued with it
