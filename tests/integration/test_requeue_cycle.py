"""The suspend / migrate / resize / resume cycle on the real local Slurm, driven through the admin CLI.

Jobs are submitted as the non-root test user, marked --comment=gandiva (so job_submit.lua holds them),
and run examples/train.py under gandiva-wrapper. Root drives them with `gandiva suspend|resume|migrate|
resize` as subprocesses, the way an admin or the controller would.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from slurm_gandiva.errors import ProtocolError
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, read_progress
from slurm_gandiva.requeue.operations import Outcome, Phase, phase
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SubmitRequest
from tests.helpers import run_as, wait_for

pytestmark = pytest.mark.slurm  # every test here uses the real cluster

BIN = Path(sys.executable).parent
GANDIVA = str(BIN / "gandiva")
WRAPPER = str(BIN / "gandiva-wrapper")
TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
START_LINE = re.compile(r"^gandiva-test start restart=(\d+) node=(\S+) cvd=(\S*)$", re.M)


def job_script(job_dir: Path, train_args: list[str]) -> str:
    """A batch script like `gandiva sbatch` writes for examples/train.py with `train_args`."""
    return wrapped_job_script(job_dir, [sys.executable, TRAIN, *train_args])


def wrapped_job_script(job_dir: Path, command: list[str]) -> str:
    """A batch script like `gandiva sbatch` writes: state dir per job id, then exec the wrapper on `command`."""
    cmd = [WRAPPER, "--signal", "USR2", "--progress-interval", "0.3", "--", *command]
    return (
        "#!/bin/bash\n"
        f'export GANDIVA_STATE_DIR={shlex.quote(str(job_dir))}/"$SLURM_JOB_ID"\n'
        'mkdir -p -- "$GANDIVA_STATE_DIR"\n'
        'echo "gandiva-test start restart=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME '
        'cvd=$CUDA_VISIBLE_DEVICES"\n'
        f"exec {shlex.join(cmd)}\n"
    )


def submit(
    slurm: SlurmBackend, user: str, job_dir: Path, name: str, train_args: list[str], gpus: int, gres: str | None
) -> str:
    """Submit as `user`, marked for the controller. `gres` None: no GPU request until the protocol sets one."""
    return slurm.submit(
        SubmitRequest(
            job_script(job_dir, train_args),
            options=[
                f"--comment={JOB_MARK}",
                f"--job-name={name}",
                "--nodes=1",
                "--ntasks=1",
                f"--cpus-per-task={gpus}",
                "--mem=1G",
                f"--chdir={job_dir}",
                f"--output={job_dir}/%j.out",
                *([f"--gres={gres}"] if gres else []),
            ],
            as_user=user,
        )
    )


def gandiva(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([GANDIVA, *argv], env=env, capture_output=True, text=True, timeout=200, check=False)
    assert proc.returncode == 0, f"gandiva {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    return proc


def progress_step(files: JobFiles) -> int:
    p = read_progress(files.progress)
    return p.step if p else -1


def wait_training(slurm: SlurmBackend, files: JobFiles, job_id: str, beyond: int, timeout: float = 60.0) -> int:
    """Wait until the job runs and its progress passed step `beyond`; returns that step."""

    def probe() -> int | None:
        job = slurm.job(job_id)
        assert not job.finished, f"job {job_id} ended early: {job.state}"
        step = progress_step(files)
        return step if job.running and step > beyond else None

    return wait_for(probe, timeout=timeout, interval=0.2, what=f"job {job_id} to train past step {beyond}")


def wait_finished(slurm: SlurmBackend, job_id: str, timeout: float = 120.0) -> str:
    job = wait_for(
        lambda: j if (j := slurm.job(job_id)).finished else None, timeout=timeout, what=f"job {job_id} to finish"
    )
    return job.state


def starts(out: Path) -> list[tuple[int, str, str]]:
    """(restart count, node, CUDA_VISIBLE_DEVICES) of every start of the job, from its output."""
    return [(int(r), n, c) for r, n, c in START_LINE.findall(out.read_text())]


def reference_hash(tmp: Path, train_args: list[str], nprocs: int = 1) -> subprocess.Popen[str]:
    """The uninterrupted run, outside Slurm, through the same wrapper (`nprocs` processes)."""
    return subprocess.Popen(
        [WRAPPER, "--state-dir", str(tmp), "--nprocs", str(nprocs), "--", sys.executable, TRAIN, *train_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hash_of(text: str) -> str:
    m = re.search(r"final_params_sha256=([0-9a-f]{64})", text)
    assert m, f"no final_params_sha256 in:\n{text}"
    return m.group(1)


def test_suspended_three_times_and_moved_gives_the_uninterrupted_hash(
    slurm: SlurmBackend,
    slurm_env: dict[str, str],
    test_user: str,
    job_dir: Path,
    cleanup_jobs: list[str],
    tmp_path: Path,
) -> None:
    # Steps slow enough (0.1 s) that each slice trains a little while, however loaded the machine is; 96 of
    # them: the four slices before the last take some 20.
    args = ["--epochs", "6", "--samples", "256", "--batch-size", "16", "--sleep-per-step", "0.1"]
    ref = reference_hash(tmp_path / "ref", args)
    # An untyped count (a plain `sbatch --gres=gpu:1` job; `gandiva sbatch` submits none): every placement
    # below is still an exact GPU.
    job_id = submit(slurm, test_user, job_dir, "h3-hash", args, gpus=1, gres="gpu:1")
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    assert phase(slurm.job(job_id)) in (Phase.REQUEUED, Phase.QUEUED_HELD)  # held by job_submit.lua
    root = ["--jobs-root", str(job_dir)]

    # First start (a START of a never-run held job), then 3 x (suspend, resume on the other node).
    placements = [("n1", "2"), ("n2", "1"), ("n1", "3"), ("n2", "0")]
    out = gandiva(slurm_env, "resume", job_id, "--node", "n1", "--gpus", "2", *root).stdout
    assert "verify" in out and "resume -> running on n1:2" in out, out
    step = wait_training(slurm, files, job_id, beyond=2)
    for i, (node, gpu) in enumerate(placements[1:], start=1):
        out = gandiva(slurm_env, "suspend", job_id, *root).stdout
        assert "suspend -> suspended" in out and "wrapper reported suspended" in out, out
        step = progress_step(files)  # where it checkpointed: the next slice must get past it
        held = slurm.job(job_id)
        assert phase(held) is Phase.HELD and held.hold is HoldKind.ADMIN and held.restart_count == i
        if i == 1:
            # The owner cannot jump the controller: neither release nor re-place the held job.
            rel = run_as(test_user, ["scontrol", "release", job_id], slurm_env)
            upd = run_as(test_user, ["scontrol", "update", f"jobid={job_id}", "gres=gpu:g0:1"], slurm_env)
            assert rel.returncode != 0 and upd.returncode != 0, (rel, upd)
            time.sleep(0.5)
            still = slurm.job(job_id)
            assert still.pending and still.hold is HoldKind.ADMIN, still
        cmd = "resume" if i % 2 else "migrate"  # migrate of a held job is a plain resume
        out = gandiva(slurm_env, cmd, job_id, "--node", node, "--gpus", gpu, *root).stdout
        assert f"running on {node}:{gpu}" in out and "Slurm gave" in out, out
        job = slurm.job(job_id)
        assert dict(job.gpus) == {node: (int(gpu),)}
        step = wait_training(slurm, files, job_id, beyond=step + 2)

    assert wait_finished(slurm, job_id) == "COMPLETED"
    ref_out, ref_err = ref.communicate(timeout=120)
    assert ref.returncode == 0, ref_err
    out_file = job_dir / f"{job_id}.out"
    assert hash_of(out_file.read_text()) == hash_of(ref_out)
    # Each start saw exactly the GPU the protocol chose (CUDA_VISIBLE_DEVICES is the node-local index).
    assert starts(out_file) == [(r, n, g) for r, (n, g) in enumerate(placements)]


def test_resize_two_one_two_sees_every_sample_once_per_epoch(
    slurm: SlurmBackend,
    slurm_env: dict[str, str],
    test_user: str,
    job_dir: Path,
    cleanup_jobs: list[str],
) -> None:
    samples, epochs = 96, 4  # 48 steps: the two resizes take some 12
    log = job_dir / "samples.jsonl"
    args = [
        "--epochs",
        str(epochs),
        "--samples",
        str(samples),
        "--batch-size",
        "8",
        "--sleep-per-step",
        "0.1",
        "--sample-log",
        str(log),
    ]
    # Submitted without --gres: the protocol's first placement sets it.
    job_id = submit(slurm, test_user, job_dir, "h3-resize", args, gpus=2, gres=None)
    cleanup_jobs.append(job_id)
    files = JobFiles(job_dir / job_id)
    root = ["--jobs-root", str(job_dir), "--json"]

    chosen: list[str] = []
    step = -1
    for argv in (
        ["resume", job_id, "--node", "n2", "--gpus", "1,3"],
        ["resize", job_id, "--gpus", "1"],
        ["resize", job_id, "--gpus", "2", "--node", "n1"],
    ):
        if chosen:
            step = wait_training(slurm, files, job_id, beyond=step + 2)
        else:
            assert phase(slurm.job(job_id)) in (Phase.REQUEUED, Phase.QUEUED_HELD)
        res = json.loads(gandiva(slurm_env, *argv, *root).stdout)
        assert res["outcome"] == "running", res
        chosen.append(res["placement"])  # e.g. "n2:1+3"
        job = slurm.job(job_id)
        assert res["placement"] == str(Placement(tuple(GpuRef(n, i) for n, ix in job.gpus.items() for i in ix)))
    assert chosen == ["n2:1+3", "n2:1", "n1:0+1"]  # resize keeps one of its GPUs, then the lowest free
    assert wait_finished(slurm, job_id) == "COMPLETED"

    # Every sample exactly once per epoch, across world sizes 2 -> 1 -> 2.
    seen: dict[int, Counter[int]] = {}
    sizes = set()
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        seen.setdefault(rec["epoch"], Counter()).update(rec["ids"])
        sizes.add(rec["rank"])
    assert sorted(seen) == list(range(epochs))
    for epoch, counts in seen.items():
        assert counts == Counter(range(samples)), f"epoch {epoch}: repeats or gaps"
    assert sizes == {0, 1}
    # The starts saw the GPUs the protocol chose, as CUDA_VISIBLE_DEVICES.
    got = starts(job_dir / f"{job_id}.out")
    want = [(r, c.split(":")[0], c.split(":")[1].replace("+", ",")) for r, c in enumerate(chosen)]
    assert got == want
    events = [json.loads(x) for x in files.events.read_text().splitlines()]
    assert [e["nprocs"] for e in events if e["event"] == "start"] == [2, 1, 2]


def test_suspend_escalates_when_the_job_ignores_the_signal(
    slurm: SlurmBackend,
    slurm_env: dict[str, str],
    test_user: str,
    job_dir: Path,
    cleanup_jobs: list[str],
) -> None:
    # A job that traps and ignores the signal (no wrapper): the protocol must force the requeue-hold.
    script = "#!/bin/bash\ntrap 'echo ignored' USR2\necho trapped\nwhile true; do sleep 0.2; done\n"
    job_id = slurm.submit(
        SubmitRequest(script, [f"--comment={JOB_MARK}", "--mem=100M", f"--output={job_dir}/%j.out"], as_user=test_user)
    )
    cleanup_jobs.append(job_id)
    # The admin CLI run by the job's owner is refused (job_submit.lua), with a hint to run it as root.
    denied = run_as(test_user, [GANDIVA, "resume", job_id, "--node", "n1", "--gpus", "3"], slurm_env)
    assert denied.returncode != 0 and "must run as root or the SlurmUser" in denied.stderr, denied
    assert phase(slurm.job(job_id)) in (Phase.REQUEUED, Phase.QUEUED_HELD)
    proto = RequeueProtocol(slurm, suspend_timeout=2.0, jobs_root=job_dir)
    assert proto.resume(job_id, Placement((GpuRef("n1", 3),))).outcome is Outcome.RUNNING
    # RUNNING comes as Slurm allocates; a signal sent before the batch shell runs its trap would be lost.
    out = job_dir / f"{job_id}.out"
    wait_for(lambda: out.exists() and "trapped" in out.read_text(), 30.0, what="the job's trap")
    res = proto.suspend(job_id)
    assert res.outcome is Outcome.ESCALATED and "lost" in res.detail
    job = slurm.job(job_id)
    assert job.pending and job.hold is HoldKind.ADMIN
    assert "ignored" in (job_dir / f"{job_id}.out").read_text()  # the signal did arrive
    # A second suspend is a no-op; the GPU is free again for others.
    again = proto.suspend(job_id)
    assert again.outcome is Outcome.SUSPENDED and all(s.skipped for s in again.steps)


def test_a_requeued_jobs_old_gpu_indices_tie_it_as_the_capabilities_say(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """`SlurmCapabilities.requeue_keeps_gpu_indices`, which placement works around (`Job.requeue_indices`,
    `GpuPool.find`): on 22.05 b, requeued from n1:1, released onto n1:2 stays pending while c holds n1:1;
    onto n2, where nobody holds a GPU 1, it starts at once. From 23.02.2 on it starts on n1:2 at once."""
    caps = slurm.capabilities()
    # The shell ignores the suspend signal, so b's suspend escalates to root's requeue-hold: killed by the
    # signal instead, b twice stayed JobHeldUser after its release (24.11, CI).
    script = "#!/bin/bash\ntrap '' USR2\necho started\nwhile true; do sleep 0.2; done\n"

    def held_job(name: str) -> str:
        jid = slurm.submit(
            SubmitRequest(
                script,
                [f"--comment={JOB_MARK}", f"--job-name={name}", "--mem=100M", f"--output={job_dir}/%j.out"],
                as_user=test_user,
            )
        )
        cleanup_jobs.append(jid)
        return jid

    def on(node: str, i: int) -> Placement:
        return Placement((GpuRef(node, i),))

    a, b, c = held_job("a"), held_job("b"), held_job("c")
    proto = RequeueProtocol(slurm, suspend_timeout=1.0, jobs_root=job_dir)
    assert proto.resume(a, on("n1", 0)).outcome is Outcome.RUNNING
    assert proto.resume(b, on("n1", 1)).outcome is Outcome.RUNNING
    # RUNNING comes as Slurm allocates; a signal before the batch shell runs is another test's case
    # (seen once on 24.11: b then stayed held as JobHeldUser after its release).
    out = job_dir / f"{b}.out"
    wait_for(lambda: out.exists() and "started" in out.read_text(), 30.0, what="b's batch shell")
    assert proto.suspend(b).outcome in (Outcome.SUSPENDED, Outcome.ESCALATED)
    assert proto.resume(c, on("n1", 1)).outcome is Outcome.RUNNING
    if not caps.requeue_keeps_gpu_indices:
        t0 = time.monotonic()
        assert proto.resume(b, on("n1", 2)).outcome is Outcome.RUNNING  # c holds n1:1, b's old index
        assert time.monotonic() - t0 < 8.0
        assert slurm.job(b).gpus == {"n1": (2,)}
        return
    proto.start_timeout = 8.0
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match="did not start"):
        proto.resume(b, on("n1", 2))  # n1:2 is free, but c holds n1:1, b's old index
    assert time.monotonic() - t0 >= 8.0
    assert slurm.job(b).pending and slurm.job(b).hold is HoldKind.ADMIN  # held again, nothing lost
    proto.start_timeout = 60.0
    t0 = time.monotonic()
    assert proto.resume(b, on("n2", 2)).outcome is Outcome.RUNNING
    assert time.monotonic() - t0 < 8.0
    assert slurm.job(b).gpus == {"n2": (2,)}
