"""Park and unpark on the real local Slurm (issue 31, items 2 and 6, the protocol part): two jobs co-hold one GPU
(each a shard of it, as packing places them) and take turns in place, each turn a park of one and an unpark of
the other, with no Slurm state change (never requeued); then the parked one moves to a GPU of its own by the
requeue path (a checkpoint from host memory), and both end with the parameters of an uninterrupted run.
Their own event logs show that the two never computed at once. A job that does not answer the park request
goes the requeue path. Where Slurm cannot co-hold (22.05: no switching a held job between shards and whole
GPUs), the capabilities say so and the controller keeps the requeue path.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JobFiles
from slurm_gandiva.requeue.operations import Outcome, Step
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import wait_for
from tests.integration.test_requeue_cycle import (
    hash_of,
    progress_step,
    reference_hash,
    submit,
    wait_finished,
    wait_training,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

TURNS = 4
# 240 steps of 0.05 s: more than both need for their turns, however loaded the machine (80 were not, on 26.05).
ARGS = ["--epochs", "30", "--samples", "128", "--batch-size", "16", "--sleep-per-step", "0.05"]


def events(files: JobFiles) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in files.events.read_text().splitlines() if ln.strip()]


def computing(files: JobFiles, start: float, end: float) -> list[tuple[float, float]]:
    """The spans between `start` and `end` in which the job was not parked, from its own events."""
    spans, since = [], start
    for e in events(files):
        t = float(str(e["time"]))
        if e["event"] == "parked":
            spans.append((since, t))
            since = float("inf")
        elif e["event"] == "unparked":
            since = t
    if since < end:
        spans.append((since, end))
    return [(a, b) for a, b in spans if a < b]


def test_two_jobs_co_held_on_one_gpu_take_turns_in_place_and_end_bit_identical(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str], tmp_path: Path
) -> None:
    caps = slurm.capabilities()
    if not caps.packing:  # 22.05: the requeue path only; no shards to co-hold a GPU with
        assert not caps.gres_kind_switch and caps.release < (23, 2, 0), caps.describe()
        return
    ref = reference_hash(tmp_path / "ref", ARGS)
    a, b = (submit(slurm, test_user, job_dir, f"co-{n}", ARGS, gpus=1, gres=None) for n in "ab")
    cleanup_jobs += [a, b]
    fa, fb = JobFiles(job_dir / a), JobFiles(job_dir / b)
    proto = RequeueProtocol(slurm, suspend_timeout=60.0, jobs_root=job_dir)
    shard = Placement((GpuRef("n1", 0),), shared=True)
    for jid in (a, b):
        assert proto.resume(jid, shard).outcome is Outcome.RUNNING
    wait_training(slurm, fa, a, beyond=1)
    wait_training(slurm, fb, b, beyond=1)
    assert proto.park(b).outcome is Outcome.PARKED  # b waits its turn; a computes
    t0 = min(float(str(e["time"])) for e in events(fb) if e["event"] == "parked")
    switches = []
    run, wait = (a, fa), (b, fb)
    for _ in range(2 * TURNS):
        step = progress_step(run[1])
        wait_training(slurm, run[1], run[0], beyond=step + 2)  # it computes on its turn
        parked = progress_step(wait[1])
        res = proto.park(run[0])
        assert res.outcome is Outcome.PARKED, res.describe()
        back = proto.unpark(wait[0])
        assert back.outcome is Outcome.RUNNING, back.describe()
        switches.append(res.seconds + back.seconds)
        assert progress_step(wait[1]) >= parked  # it goes on from where it parked: no checkpoint read
        run, wait = wait, run
    # The parked one is moved to a GPU of its own by the requeue path: it checkpoints from host memory, is
    # requeued and starts there (as the controller moves a parked job that its policy places elsewhere).
    moved = proto.migrate(wait[0], Placement((GpuRef("n1", 1),)))
    assert moved.outcome is Outcome.RUNNING, moved.describe()
    for jid in (a, b):
        assert wait_finished(slurm, jid) == "COMPLETED"
        job = slurm.job(jid)
        assert job.restart_count == (1 if jid == wait[0] else 0)  # every turn in place; the move requeued once
    ref_out, ref_err = ref.communicate(timeout=120)
    assert ref.returncode == 0, ref_err
    for jid in (a, b):
        assert hash_of((job_dir / f"{jid}.out").read_text()) == hash_of(ref_out), f"job {jid} differs"
    # Never both computing while they shared the GPU: their own event logs, from b's first park to the last switch.
    end = max(float(str(e["time"])) for f in (fa, fb) for e in events(f) if e["event"] == "unparked")
    spans_a, spans_b = computing(fa, t0, end), computing(fb, t0, end)
    overlap = [(x, y) for x in spans_a for y in spans_b if min(x[1], y[1]) > max(x[0], y[0])]
    assert not overlap, overlap
    assert len([e for e in events(fa) if e["event"] == "parked"]) == TURNS
    assert len([e for e in events(fb) if e["event"] == "parked"]) == TURNS + 1
    print(f"in-place switches (park + unpark): median {sorted(switches)[len(switches) // 2]:.2f} s")


def test_a_job_that_does_not_park_goes_the_requeue_path(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """A job without the wrapper (a shell loop that ignores every signal) never parks: after the park timeout it
    is suspended as the protocol suspends (then root's forced requeue-hold), so its GPU is free in bounded time."""
    from slurm_gandiva.requeue.contract import JOB_MARK
    from slurm_gandiva.slurm.base import SubmitRequest

    script = ("#!/bin/bash\ntrap '' USR2 URG\n"  # deaf to the suspend signal too: root's requeue-hold ends it
              f'mkdir -p -- {job_dir}/"$SLURM_JOB_ID"\nwhile true; do sleep 1; done\n')
    jid = slurm.submit(SubmitRequest(script, options=[
        f"--comment={JOB_MARK}", "--job-name=deaf", "--nodes=1", "--ntasks=1", "--mem=100M",
        f"--chdir={job_dir}", f"--output={job_dir}/%j.out"], as_user=test_user))
    cleanup_jobs.append(jid)
    proto = RequeueProtocol(slurm, suspend_timeout=3.0, jobs_root=job_dir)
    assert proto.resume(jid, Placement((GpuRef("n2", 0),))).outcome is Outcome.RUNNING
    wait_for(lambda: (job_dir / jid).is_dir(), timeout=30, what="the job's state directory")
    res = proto.park(jid, timeout=3.0)
    assert res.outcome is Outcome.ESCALATED and "did not park" in res.detail, res.describe()
    assert res.seconds < 3.0 + 3.0 + 30.0
    job = slurm.job(jid)
    assert job.pending and not job.gpus


LIAR = r'''
import json, os, signal, sys, time
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
seen = []
signal.signal(signal.SIGURG, lambda *_: seen.append(1))
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
n = 0
while True:  # it computes, whatever it reports
    n += 1
    if n % 20000 == 0:
        with open(os.path.join(d, "count.tmp"), "w") as f:
            f.write(str(n))
        os.replace(os.path.join(d, "count.tmp"), os.path.join(d, "count"))
    if seen:
        seen.clear()
        req = json.load(open(os.path.join(d, "park-request.json")))
        rep = dict(step=n, epoch=0, samples=n, total_samples=None, batch_time_avg=0.1, samples_per_s=1.0,
                   world_size=1, updated=time.time(), state="parked", request_seq=req["seq"])
        with open(os.path.join(d, "progress.tmp"), "w") as f:
            json.dump(rep, f)
        os.replace(os.path.join(d, "progress.tmp"), os.path.join(d, "progress.json"))
'''


def job_processes(jid: str) -> dict[int, str]:
    """pid -> state letter (R, S, T, ...) of every process of job `jid` on this machine, but slurmstepd."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if f"SLURM_JOB_ID={jid}".encode() in env and "slurmstepd" not in stat:
            out[int(proc.name)] = stat.rsplit(")", 1)[1].split()[0]
    return out


def test_a_job_that_says_parked_but_computes_on_is_frozen(
    slurm: SlurmBackend, test_user: str, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """A job's report is its own word: one that answers the park request with "parked" and goes on computing
    (it would take the GPU from the job it co-holds it with, another user's) is frozen once it reports, so
    it computes nothing until it is unparked; then it goes on."""
    from slurm_gandiva.requeue.contract import JOB_MARK
    from slurm_gandiva.slurm.base import SubmitRequest

    caps = slurm.capabilities()
    script = f"#!/bin/bash\nexec /usr/bin/python3 -c {shlex.quote(LIAR)} {job_dir}/\"$SLURM_JOB_ID\"\n"
    jid = slurm.submit(SubmitRequest(script, options=[
        f"--comment={JOB_MARK}", "--job-name=liar", "--nodes=1", "--ntasks=1", "--mem=100M",
        f"--chdir={job_dir}", f"--output={job_dir}/%j.out"], as_user=test_user))
    cleanup_jobs.append(jid)
    proto = RequeueProtocol(slurm, suspend_timeout=3.0, jobs_root=job_dir)
    where = Placement((GpuRef("n2", 1),), shared=caps.packing)
    assert proto.resume(jid, where).outcome is Outcome.RUNNING
    count = job_dir / jid / "count"
    wait_for(count.exists, timeout=30, what="the job to compute")
    res = proto.park(jid)
    assert res.outcome is Outcome.PARKED, res.describe()
    # Every process of the job stops (slurmctld's agent delivers the SIGSTOP a moment after the call).
    wait_for(lambda: set(job_processes(jid).values()) == {"T"}, timeout=10, what="the job's processes to stop")
    frozen = count.read_text()
    time.sleep(1.5)
    assert count.read_text() == frozen, "a parked job computed on"
    assert slurm.job(jid).running  # Slurm's state unchanged: it holds its GPU (shard) and memory
    back = proto.unpark(jid, timeout=3.0)  # thawed; it never reports "running": then the requeue path
    assert back.outcome is Outcome.ESCALATED and back.steps[0].step is Step.THAW, back.describe()
    job = slurm.job(jid)
    assert job.pending and not job.gpus and not job.shards  # its GPU freed in bounded time
