"""What a suspend / resume through the requeue protocol costs on a real Slurm, against scancel + resubmit.

Starts its own DevCluster (default port base 27000), runs examples/train.py under gandiva-wrapper at a
few model sizes and measures, per cycle:
  protocol  signal -> GPUs free in Slurm (the job is PENDING, its allocation released), the wrapper's
            checkpoint time and size, release -> training resumed (the wrapper's "resumed" event: the
            checkpoint is loaded and the first mini-batch starts);
  baseline  plain `scancel` -> GPUs free, and resubmit -> training resumed from the newest periodic
            checkpoint (with the steps lost since that checkpoint).
Prints a table with medians and the protocol/baseline ratios, and writes the medians to
benchmarks/results/requeue.json (the simulator's suspend/resume/migrate overheads come from there).

    sudo .venv/bin/python benchmarks/bench_requeue.py [--repeats 3] [--sizes small,large]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, read_progress
from slurm_gandiva.requeue.protocol import RequeueProtocol, Step, StepEvent, StepEventKind
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = ROOT / "examples" / "train.py"
# name -> (dim, hidden): parameters ~ dim*hidden + hidden; the checkpoint also holds SGD momentum.
SIZES = {"small": (16, 64), "medium": (256, 2048), "large": (512, 8192)}


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        v = self.values.get(key)
        return statistics.median(v) if v else None


def script(state_dir: str, train_args: list[str]) -> str:
    cmd = [str(BIN / "gandiva-wrapper"), "--progress-interval", "0.3", "--", sys.executable, str(TRAIN), *train_args]
    return (
        f'#!/bin/bash\nexport GANDIVA_STATE_DIR={state_dir}\nmkdir -p -- "$GANDIVA_STATE_DIR"\nexec {shlex.join(cmd)}\n'
    )


def events(files: JobFiles) -> list[dict[str, Any]]:
    try:
        lines = files.events.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def wait(probe: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"bench_requeue: timed out after {timeout:.0f} s waiting for {what}")


def event_after(files: JobFiles, name: str, after: float, timeout: float = 180.0) -> dict[str, Any]:
    got: dict[str, Any] = wait(
        lambda: next((e for e in events(files) if e["event"] == name and e["time"] >= after), None),
        timeout,
        f"the wrapper's {name!r} event in {files.events}",
    )
    return got


def wait_progress(slurm: SlurmBackend, job_id: str, files: JobFiles, beyond: int) -> int:
    def probe() -> int | None:
        job = slurm.job(job_id)
        if job.finished:
            raise SystemExit(f"bench_requeue: job {job_id} ended ({job.state}); see {files.root}")
        p = read_progress(files.progress)
        return p.step if job.running and p is not None and p.step > beyond else None

    return int(wait(probe, 180.0, f"job {job_id} to train past step {beyond}", interval=0.1))


def train_args(size: str, extra: list[str]) -> list[str]:
    dim, hidden = SIZES[size]
    return ["--epochs", "100000", "--dim", str(dim), "--hidden", str(hidden), "--sleep-per-step", "0.05", *extra]


def bench_protocol(slurm: SlurmBackend, jobs: Path, size: str, repeats: int) -> Samples:
    s = Samples()
    job_id = slurm.submit(
        SubmitRequest(
            script(f'{jobs}/"$SLURM_JOB_ID"', train_args(size, [])),
            [f"--comment={JOB_MARK}", "--mem=2G", f"--output={jobs}/%j.out", f"--job-name=bench-{size}"],
        )
    )
    files = JobFiles(jobs / job_id)
    release_wall: list[float] = []

    def journal(e: StepEvent) -> None:
        if e.step is Step.RELEASE and e.kind is StepEventKind.START:
            release_wall.append(time.time())

    proto = RequeueProtocol(slurm, jobs_root=jobs, journal=journal)
    try:
        node = ["n1", "n2"]
        proto.resume(job_id, Placement((GpuRef(node[0], 0),)))
        step = wait_progress(slurm, job_id, files, -1)
        for i in range(repeats):
            step = wait_progress(slurm, job_id, files, step + 5)
            res = proto.suspend(job_id)
            if res.outcome.value != "suspended":
                raise SystemExit(f"bench_requeue: suspend of {job_id} gave {res.outcome.value}: {res.detail}")
            sig = res.step(Step.SIGNAL)
            req = res.step(Step.WAIT_REQUEUE)
            assert sig is not None and req is not None
            s.add("signal_to_gpus_free_s", sig.seconds + req.seconds)
            s.add("suspend_total_s", res.seconds)
            evs = events(files)
            ck = [e for e in evs if e["event"] == "checkpoint" and e.get("reason") == "suspend"][-1]
            sent = [e for e in evs if e["event"] == "signal" and e["time"] <= ck["time"]][-1]
            gone = next(e for e in evs if e["event"] == "exit" and e["time"] >= ck["time"])
            # Where signal -> free goes: to the checkpoint written, then the training process exiting.
            s.add("signal_to_checkpoint_s", ck["time"] - sent["time"])
            s.add("checkpoint_to_exit_s", gone["time"] - ck["time"])
            s.add("checkpoint_s", float(ck["seconds"]))
            s.add("checkpoint_bytes", float(ck["bytes"]))
            step = int(ck["step"])
            # Migrate: resume on the other node (same GPU index, which Slurm 22.05 can give exactly).
            res = proto.resume(job_id, Placement((GpuRef(node[(i + 1) % 2], 0),)))
            resumed = event_after(files, "resumed", release_wall[-1])
            s.add("release_to_training_s", resumed["time"] - release_wall[-1])
            s.add("resume_steps_s", res.seconds)
    finally:
        slurm.cancel(job_id)
    return s


def bench_baseline(slurm: SlurmBackend, jobs: Path, size: str, repeats: int) -> Samples:
    s = Samples()
    state = jobs / f"baseline-{size}-{os.getpid()}"
    every = 20
    text = script(str(state), train_args(size, ["--checkpoint-every", str(every)]))
    files = JobFiles(state)
    opts = ["--mem=2G", f"--output={jobs}/baseline-%j.out", f"--job-name=base-{size}", "--gres=gpu:g0:1"]
    job_id = slurm.submit(SubmitRequest(text, [*opts, "--nodelist=n1"]))
    try:
        step = wait_progress(slurm, job_id, files, -1)
        for i in range(repeats):
            step = wait_progress(slurm, job_id, files, step + every + 5)
            t0 = time.monotonic()
            slurm.cancel(job_id)
            wait(lambda j=job_id: slurm.job(j).finished, 120.0, f"job {job_id} to end after scancel")
            s.add("cancel_to_gpus_free_s", time.monotonic() - t0)
            last = read_progress(files.progress)
            cks = [e for e in events(files) if e["event"] == "checkpoint"]
            if last is not None and cks:
                s.add("lost_steps", float(max(0, last.step - int(cks[-1]["step"]))))
            t_submit = time.time()
            job_id = slurm.submit(SubmitRequest(text, [*opts, f"--nodelist={['n2', 'n1'][i % 2]}"]))
            resumed = event_after(files, "resumed", t_submit)
            s.add("submit_to_training_s", resumed["time"] - t_submit)
            step = int(resumed["step"])
    finally:
        slurm.cancel(job_id)
    return s


def fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 1e6:.2f} MB" if v >= 1e5 else f"{v / 1e3:.1f} kB"
    return f"{v:.3f} {unit}".rstrip()


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large", help=f"comma list of {','.join(SIZES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--state-dir", default="/tmp/gandiva-bench-requeue")
    ap.add_argument("--port-base", type=int, default=27000)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "requeue.json"))
    args = ap.parse_args(argv)
    sizes = [x for x in args.sizes.split(",") if x]
    if unknown := [x for x in sizes if x not in SIZES]:
        ap.error(f"unknown sizes {unknown}: pick from {list(SIZES)}")

    cluster = DevCluster(args.state_dir, port_base=args.port_base)
    cluster.up()
    slurm = make_backend(cluster.env)
    jobs = cluster.jobs_dir / f"bench-{int(time.time())}"
    jobs.mkdir()
    results: dict[str, dict[str, Any]] = {}
    try:
        for size in sizes:
            proto = bench_protocol(slurm, jobs, size, args.repeats)
            base = bench_baseline(slurm, jobs, size, args.repeats)
            results[size] = {
                "dim_hidden": SIZES[size],
                "protocol": {k: proto.median(k) for k in proto.values},
                "baseline": {k: base.median(k) for k in base.values},
                "repeats": args.repeats,
            }
    finally:
        if not args.keep:
            cluster.down()

    print(
        f"Slurm {cluster.capabilities.release_text}: requeue protocol vs scancel + resubmit: medians of "
        f"{args.repeats} cycles (load avg {os.getloadavg()[0]:.1f})"
    )
    head = (
        f"{'size':<7} {'ckpt size':>10} {'ckpt time':>10} | {'signal->free':>12} {'scancel->free':>13} {'ratio':>6} |"
    )
    head += f" {'release->train':>14} {'resubmit->train':>15} {'ratio':>6} | {'lost steps (base)':>17}"
    print(head)
    print("-" * len(head))
    for size, r in results.items():
        p, b = r["protocol"], r["baseline"]
        print(
            f"{size:<7} {fmt(p.get('checkpoint_bytes'), 'B'):>10} {fmt(p.get('checkpoint_s')):>10} |"
            f" {fmt(p.get('signal_to_gpus_free_s')):>12} {fmt(b.get('cancel_to_gpus_free_s')):>13}"
            f" {ratio(p.get('signal_to_gpus_free_s'), b.get('cancel_to_gpus_free_s')):>6} |"
            f" {fmt(p.get('release_to_training_s')):>14} {fmt(b.get('submit_to_training_s')):>15}"
            f" {ratio(p.get('release_to_training_s'), b.get('submit_to_training_s')):>6} |"
            f" {fmt(b.get('lost_steps'), ''):>17}"
        )
    print("where the protocol's signal -> free goes (wrapper events):")
    for size, r in results.items():
        p = r["protocol"]
        print(
            f"  {size:<7} signal -> checkpoint written {fmt(p.get('signal_to_checkpoint_s'))},"
            f" checkpoint -> wrapper exit {fmt(p.get('checkpoint_to_exit_s'))},"
            f" then Slurm's requeue until PENDING"
        )
    first = results[sizes[0]]["protocol"]
    suspend_s = first.get("signal_to_gpus_free_s")
    resume_s = first.get("release_to_training_s")
    out = {
        "what": "medians; protocol = gandiva requeue protocol, baseline = scancel + resubmit",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "sizes": results,
        # What the simulator charges (seconds, the first size): a migrate is a suspend plus a resume.
        "overheads": {
            "suspend_s": suspend_s,
            "resume_s": resume_s,
            "migrate_s": (suspend_s + resume_s) if suspend_s is not None and resume_s is not None else None,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
