"""PyTorch Lightning and the Hugging Face Trainer on the real local Slurm, through their gandiva callbacks,
with 2 GPUs: the wrapper starts 2 ranks (DDP over gloo). Each job is held at submission like a `gandiva sbatch`
job, started by the RequeueProtocol on 2 GPUs of n1, suspended mid-training (the wrapper forwards the signal to
both ranks, which agree on the batch boundary to stop at; the framework's checkpoint is written once and every
rank exits 75; the wrapper requeue-holds the job), resumed on 2 GPUs of n2, and ends with the parameters of an
uninterrupted 2-rank run, bit for bit: both frameworks restore every rank's RNG states and the data position
exactly (Lightning through the resumable loader's state in its loop state, the Trainer by skipping the batches
of the epoch already trained), and gloo's all-reduce on CPU sums in the same order every time, so no tolerance
is needed.

The uninterrupted reference runs outside Slurm through the same wrapper (--nprocs 2), at the same time as the job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from job_wrapper.progress import read_events
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, read_progress
from slurm_gandiva.requeue.operations import Outcome
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest
from tests.integration.test_requeue_cycle import (
    WRAPPER,
    hash_of,
    starts,
    wait_finished,
    wait_training,
    wrapped_job_script,
)

pytestmark = pytest.mark.slurm  # every test here uses the real cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNS = {
    # framework: (script, arguments, steps in all); 2 ranks. Lightning's --batch-size is the global batch (the
    # loader splits it), the Trainer's the per-device one.
    "lightning": ("train_lightning.py", ["--epochs", "2", "--samples", "192", "--batch-size", "16", "--workers", "1"],
                  24),
    "hf": ("train_hf.py", ["--epochs", "2", "--samples", "192", "--batch-size", "8"], 24),
}
# The job's steps (not the reference's) are slowed so that the test sees it train past step 3 and signals it
# before it ends: at 0.1 s a step, the Trainer's 16 steps took 2 s and a loaded machine missed them.
SLEEP_PER_STEP = "0.3"


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_framework_job_suspended_and_moved_gives_the_uninterrupted_hash(
    framework: str, slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    script, args, total = RUNS[framework]
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    ref_cmd = [WRAPPER, "--state-dir", str(tmp_path / "ref"), "--nprocs", "2", "--", *cmd]
    ref = subprocess.Popen(ref_cmd + (["--output-dir", str(tmp_path / "ref-out")] if framework == "hf" else []),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_cmd = [*cmd, "--sleep-per-step", SLEEP_PER_STEP]
    job_cmd += ["--output-dir", str(job_dir / "hf-out")] if framework == "hf" else []
    job_id = slurm.submit(SubmitRequest(wrapped_job_script(job_dir, job_cmd), options=[
        f"--comment={JOB_MARK}", f"--job-name={framework}", "--nodes=1", "--ntasks=1", "--cpus-per-task=2",
        "--mem=2G", f"--chdir={job_dir}", f"--output={job_dir}/%j.out"], as_user=test_user))
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, jobs_root=job_dir)

    assert proto.resume(job_id, Placement((GpuRef("n1", 0), GpuRef("n1", 1)))).outcome is Outcome.RUNNING
    wait_training(slurm, files, job_id, beyond=3)
    res = proto.suspend(job_id)
    assert res.outcome is Outcome.SUSPENDED, res
    # The framework's own checkpoint, in the job's state directory, taken at a batch boundary mid-training.
    prog = read_progress(files.progress)
    assert prog is not None and prog.state == "suspended" and 3 < prog.step < total, prog
    assert prog.batch_time_avg > 0 and prog.samples_per_s > 0  # mini-batch times for the controller
    status = json.loads(files.status.read_text())
    assert status["nprocs"] == 2 and status["gpus"] == ["0", "1"] and status["child_exit_codes"] == [75, 75], status
    events = [e["event"] for e in read_events(files.events)]
    assert events.count("checkpoint") == 1 and events.count("stop_requested") == 1, events
    if framework == "lightning":
        assert (files.root / "lightning.ckpt").is_file()
        assert not list(files.root.glob("hpc_ckpt_*")) and not list(job_dir.glob("hpc_ckpt_*"))
    else:
        mark = json.loads((files.root / "hf" / f"checkpoint-{prog.step}" / "gandiva.json").read_text())
        assert mark["step"] == prog.step and mark["job"]["job_id"] == job_id and mark["world_size"] == 2
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(mark["files"])  # each rank's part, then the mark

    assert proto.resume(job_id, Placement((GpuRef("n2", 2), GpuRef("n2", 3)))).outcome is Outcome.RUNNING
    assert wait_finished(slurm, job_id) == "COMPLETED"
    prog = read_progress(files.progress)
    assert prog is not None and prog.state == "done" and prog.step == total
    out = (job_dir / f"{job_id}.out").read_text()
    ref_out, ref_err = ref.communicate(timeout=60)
    assert ref.returncode == 0, ref_err
    assert hash_of(out) == hash_of(ref_out)
    assert starts(job_dir / f"{job_id}.out") == [(0, "n1", "0,1"), (1, "n2", "2,3")]
    status = json.loads(files.status.read_text())
    assert status["gpus"] == ["2", "3"] and status["child_exit_codes"] == [0, 0], status
    if framework == "lightning":
        # The ranks are the wrapper's (WrapperEnvironment), not Slurm's tasks: Lightning's SLURM requeue handler
        # is never installed.
        assert "auto-requeue is off" not in out and "GLOBAL_RANK: 1, MEMBER: 2/2" in out
