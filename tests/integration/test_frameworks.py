"""PyTorch Lightning and the Hugging Face Trainer on the real local Slurm, through their gandiva callbacks:
each job is held at submission like a `gandiva sbatch` job, started by the RequeueProtocol on n1, suspended
mid-training (the wrapper forwards the signal, the callback checkpoints through the framework at the next
batch boundary and exits 75, the wrapper requeue-holds the job), resumed on another node's GPU, and ends
with the parameters of an uninterrupted run, bit for bit: both frameworks restore the RNG states and the
data position exactly (Lightning through the resumable loader's state in its loop state, the Trainer by
skipping the batches of the epoch already trained), so no tolerance is needed.

The uninterrupted reference runs outside Slurm through the same wrapper, at the same time as the job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_requeue_cycle import WRAPPER, hash_of, starts, wait_finished, wait_training, wrapped_job_script

from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, read_progress
from slurm_gandiva.requeue.protocol import Outcome, RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNS = {
    # framework: (script, arguments, steps in all)
    "lightning": ("train_lightning.py", ["--epochs", "2", "--samples", "192", "--batch-size", "16", "--workers", "1"],
                  24),
    "hf": ("train_hf.py", ["--epochs", "2", "--samples", "128", "--batch-size", "16"], 16),
}


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_framework_job_suspended_and_moved_gives_the_uninterrupted_hash(
    framework: str, slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    script, args, total = RUNS[framework]
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    ref = subprocess.Popen([WRAPPER, "--state-dir", str(tmp_path / "ref"), "--", *cmd, "--output-dir",
                            str(tmp_path / "ref-out")] if framework == "hf" else
                           [WRAPPER, "--state-dir", str(tmp_path / "ref"), "--", *cmd],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_cmd = [*cmd, "--sleep-per-step", "0.1"] + (["--output-dir", str(job_dir / "hf-out")] if framework == "hf"
                                                   else [])
    job_id = slurm.submit(SubmitRequest(wrapped_job_script(job_dir, job_cmd), options=[
        f"--comment={JOB_MARK}", f"--job-name={framework}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
        "--mem=2G", f"--chdir={job_dir}", f"--output={job_dir}/%j.out"], as_user=test_user))
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    proto = RequeueProtocol(slurm, jobs_root=job_dir)

    assert proto.resume(job_id, Placement((GpuRef("n1", 1),))).outcome is Outcome.RUNNING
    wait_training(slurm, files, job_id, beyond=3)
    res = proto.suspend(job_id)
    assert res.outcome is Outcome.SUSPENDED, res
    # The framework's own checkpoint, in the job's state directory, taken at a batch boundary mid-training.
    prog = read_progress(files.progress)
    assert prog is not None and prog.state == "suspended" and 3 < prog.step < total, prog
    assert prog.batch_time_avg > 0 and prog.samples_per_s > 0  # mini-batch times for the controller
    if framework == "lightning":
        assert (files.root / "lightning.ckpt").is_file()
        assert not list(files.root.glob("hpc_ckpt_*")) and not list(job_dir.glob("hpc_ckpt_*"))
    else:
        mark = json.loads((files.root / "hf" / f"checkpoint-{prog.step}" / "gandiva.json").read_text())
        assert mark["step"] == prog.step and mark["job"]["job_id"] == job_id

    assert proto.resume(job_id, Placement((GpuRef("n2", 2),))).outcome is Outcome.RUNNING
    assert wait_finished(slurm, job_id) == "COMPLETED"
    prog = read_progress(files.progress)
    assert prog is not None and prog.state == "done" and prog.step == total
    out = (job_dir / f"{job_id}.out").read_text()
    ref_out, ref_err = ref.communicate(timeout=60)
    assert ref.returncode == 0, ref_err
    assert hash_of(out) == hash_of(ref_out)
    assert starts(job_dir / f"{job_id}.out") == [(0, "n1", "1"), (1, "n2", "2")]
    if framework == "lightning":
        assert "auto-requeue is off" in out  # Lightning detected Slurm; its requeue handler was not installed
