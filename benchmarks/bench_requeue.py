"""What a suspend / resume through the requeue protocol costs on a real Slurm, against scancel + resubmit.

Starts its own DevCluster (default port base 27000) of the Slurm release on PATH (`scripts/slurm-release.sh`:
`gandiva_slurm_use 24.11`), runs examples/train.py under gandiva-wrapper at a few model sizes and measures,
per cycle:
  protocol  signal -> GPUs free in Slurm (the job is PENDING, its allocation released), the wrapper's
            checkpoint time and size; resume -> training resumed (the training process's "resumed" event:
            the checkpoint is loaded and the first mini-batch starts), split into its phases: the protocol's
            steps up to the release, Slurm (scheduling and launch, to the batch shell starting), the wrapper
            starting its training process, and that process (Python, `import torch`, the script, the
            checkpoint). Moves go to the other node (nothing to wait for) and back onto the same node (the
            old job credential must lapse first: `RequeueProtocol`).
  baseline  what users do today: plain `scancel` -> GPUs free, and a plain sbatch of the same script (no
            wrapper) that resumes from its newest periodic checkpoint: resubmit -> training resumed, with
            the steps lost since that checkpoint.
  in place  where the release has packing (`SlurmCapabilities.packing`; 23.02 on): two jobs co-held on
            shards of one GPU take turns through park / unpark (issue 31; bench_requeue_park.py): park
            request -> parked, unpark request -> the other job's next mini-batch, the parked job's CPU use
            and its parked bytes, beside the requeue switch. A release without packing keeps the requeue
            path only: nothing is measured in place.
  floors    measured in the same run: `python -c "import torch"`, and a trivial batch job's release ->
            its shell running and sbatch -> its shell running.
Prints the tables with medians and ratios, and merges this release's medians into
benchmarks/results/requeue.json (one entry per Slurm release; the simulator's suspend/resume/migrate
and park/unpark overheads come from the default release's entry).

    sudo .venv/bin/python benchmarks/bench_requeue.py [--repeats 3] [--sizes small,large]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_requeue_park import bench_inplace, table, wait

from job_wrapper.launcher import process_started
from slurm_gandiva.devcluster.cluster import SCHEDULER_PARAMETERS, DevCluster
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, read_progress
from slurm_gandiva.requeue.operations import Step, StepEvent, StepEventKind
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = ROOT / "examples" / "train.py"
DEFAULT_RELEASE = "24.11"  # the simulator's overheads come from this release's entry
# name -> (dim, hidden): parameters ~ dim*hidden + hidden; the checkpoint also holds SGD momentum.
SIZES = {"small": (16, 64), "medium": (256, 2048), "large": (512, 8192)}
# Acceptance (issue 14): resume -> training within 3 s and faster than a resubmit; GPUs free within 0.5 s.
TARGET_RESUME_S = 3.0
TARGET_FREE_S = 0.5
# The phases of a resume, in order: (key, what it covers).
RESUME_PHASES = (
    ("protocol_s", "protocol steps before the release (read, set placement, clear begin time)"),
    ("release_s", "the release (with any wait for the old job credential to lapse)"),
    ("slurm_start_s", "release -> batch shell running (slurmctld's next scheduling pass, slurmd's launch)"),
    ("wrapper_s", "batch shell -> training process started (gandiva-wrapper's start-up)"),
    ("process_s", "training process -> resumed (Python, import torch, the script, the checkpoint)"),
)

SUSPEND_PHASES = (
    ("signal_sent_s", "scancel --signal -> the wrapper has it"),
    ("signal_to_checkpoint_s", "-> the training process stopped at a mini-batch boundary and checkpointed"),
    ("checkpoint_to_child_exit_s", "-> the training process exited"),
    ("child_exit_to_requeuehold_s", "-> the wrapper wrote its status and requeue-held the job"),
    ("requeuehold_to_pending_s", "-> Slurm ended the batch step and the protocol saw the job PENDING"),
)


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float | None) -> None:
        if value is not None:
            self.values.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        v = self.values.get(key)
        return statistics.median(v) if v else None

    def medians(self) -> dict[str, float | None]:
        return {k: self.median(k) for k in self.values}


def script(state_dir: str, train_args: list[str]) -> str:
    cmd = [str(BIN / "gandiva-wrapper"), "--progress-interval", "0.3", "--", sys.executable, str(TRAIN), *train_args]
    return (
        f'#!/bin/bash\nexport GANDIVA_STATE_DIR={state_dir}\nmkdir -p -- "$GANDIVA_STATE_DIR"\nexec {shlex.join(cmd)}\n'
    )


def plain_script(state_dir: str, train_args: list[str]) -> str:
    """What a user runs today: the script itself, resuming from its own periodic checkpoints. Without
    SLURM_JOB_ID it does not bind its checkpoints to one Slurm job, so a resubmitted job may resume them."""
    cmd = ["env", "-u", "SLURM_JOB_ID", sys.executable, str(TRAIN), *train_args]
    return f"#!/bin/bash\nexport GANDIVA_STATE_DIR={shlex.quote(state_dir)}\nexec {shlex.join(cmd)}\n"


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


def event_after(files: JobFiles, name: str, after: float, timeout: float = 180.0) -> dict[str, Any]:
    got: dict[str, Any] = wait(
        lambda: next((e for e in events(files) if e["event"] == name and e["time"] >= after), None),
        timeout,
        f"the {name!r} event in {files.events}",
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


def bench_protocol(slurm: SlurmBackend, jobs: Path, size: str, repeats: int) -> dict[str, Samples]:
    """Samples of the suspend and of each kind of resume ("move": to the other node; "same": back onto the
    node it just left, after the credential guard)."""
    sus, moves = Samples(), {"move": Samples(), "same": Samples()}
    job_id = slurm.submit(
        SubmitRequest(
            script(f'{jobs}/"$SLURM_JOB_ID"', train_args(size, [])),
            [f"--comment={JOB_MARK}", "--mem=2G", f"--output={jobs}/%j.out", f"--job-name=bench-{size}"],
        )
    )
    files = JobFiles(jobs / job_id)
    marks: dict[tuple[Step, StepEventKind], float] = {}

    def journal(e: StepEvent) -> None:
        marks[(e.step, e.kind)] = time.time()

    proto = RequeueProtocol(slurm, jobs_root=jobs, journal=journal)
    node = "n1"
    try:
        proto.resume(job_id, Placement((GpuRef(node, 0),)))
        step = wait_progress(slurm, job_id, files, -1)
        for _ in range(repeats):
            for kind in ("move", "same"):
                step = wait_progress(slurm, job_id, files, step + 5)
                marks.clear()
                step = suspend_once(proto, files, job_id, sus, marks)
                if kind == "move":
                    node = "n2" if node == "n1" else "n1"
                marks.clear()
                t_call = time.time()
                res = proto.resume(job_id, Placement((GpuRef(node, 0),)))
                if res.outcome.value != "running":
                    raise SystemExit(f"bench_requeue: resume of {job_id} gave {res.outcome.value}: {res.detail}")
                resumed = event_after(files, "resumed", t_call)
                start = event_after(files, "start", t_call)
                m = moves[kind]
                rel0, rel1 = marks[(Step.RELEASE, StepEventKind.START)], marks[(Step.RELEASE, StepEventKind.END)]
                shell = start.get("shell_started")
                m.add("protocol_s", rel0 - t_call)
                m.add("release_s", rel1 - rel0)
                m.add("slurm_start_s", shell - rel1 if shell else None)
                m.add("wrapper_s", start["time"] - shell if shell else None)
                m.add("process_s", resumed["time"] - start["time"])
                m.add("resume_to_training_s", resumed["time"] - t_call)
                m.add("release_to_training_s", resumed["time"] - rel0)
                m.add("resume_steps_s", res.seconds)
    finally:
        slurm.cancel(job_id)
    return {"suspend": sus, **moves}


def suspend_once(
    proto: RequeueProtocol, files: JobFiles, job_id: str, s: Samples, marks: dict[tuple[Step, StepEventKind], float]
) -> int:
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
    child = next(e for e in evs if e["event"] == "child_exit" and e["time"] >= ck["time"])
    held = next((e for e in evs if e["event"] == "requeuehold_done" and e["time"] >= ck["time"]), None)
    # Where signal -> free goes (SUSPEND_PHASES).
    s.add("signal_sent_s", sent["time"] - marks[(Step.SIGNAL, StepEventKind.START)])
    s.add("signal_to_checkpoint_s", ck["time"] - sent["time"])
    s.add("checkpoint_to_exit_s", gone["time"] - ck["time"])
    s.add("checkpoint_to_child_exit_s", child["time"] - ck["time"])
    s.add("child_exit_to_requeuehold_s", held["time"] - child["time"] if held else None)
    s.add("requeuehold_to_pending_s", marks[(Step.WAIT_REQUEUE, StepEventKind.END)] - held["time"] if held else None)
    s.add("checkpoint_s", float(ck["seconds"]))
    s.add("checkpoint_bytes", float(ck["bytes"]))
    return int(ck["step"])


def bench_baseline(slurm: SlurmBackend, jobs: Path, size: str, repeats: int) -> Samples:
    s = Samples()
    state = jobs / f"baseline-{size}-{os.getpid()}"
    state.mkdir(mode=0o700)
    every = 20
    text = plain_script(str(state), train_args(size, ["--checkpoint-every", str(every)]))
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
            shell = process_started(resumed["pid"])  # the batch shell exec'd into the training process
            s.add("submit_to_shell_s", shell - t_submit if shell else None)
            s.add("process_s", resumed["time"] - shell if shell else None)
            s.add("submit_to_training_s", resumed["time"] - t_submit)
            step = int(resumed["step"])
    finally:
        slurm.cancel(job_id)
    return s


def bench_floors(slurm: SlurmBackend, jobs: Path, repeats: int) -> Samples:
    """The floors of a resume measured in this run: Python importing torch (and what examples/train.py
    imports), and Slurm starting a trivial batch job after its release and after its sbatch."""
    s = Samples()
    for _ in range(repeats):
        for key, code in (
            ("import_torch_s", "import torch"),
            # Any optimizer's first construction imports torch._dynamo (torch._compile._disable_dynamo).
            ("torch_optimizer_s", "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)"),
        ):
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True)
            s.add(key, time.monotonic() - t0)
    opts = ["--mem=100M", "--output=/dev/null", "--gres=gpu:g1:1", "--nodelist=n2", "--job-name=floor"]
    for i in range(repeats):
        for key, hold in (("release_to_shell_s", True), ("submit_to_shell_s", False)):
            mark = jobs / f"floor-{os.getpid()}-{i}-{key}"
            text = f"#!/bin/bash\ndate +%s.%N > {shlex.quote(str(mark))}\n"
            t0 = time.time()
            job_id = slurm.submit(SubmitRequest(text, [*opts, *(["--hold"] if hold else [])]))
            if hold:
                time.sleep(0.3)
                t0 = time.time()
                slurm.release(job_id)
            started = float(wait(lambda m=mark: m.exists() and m.read_text().strip(), 60.0, f"floor job {job_id}"))
            s.add(key, started - t0)
            wait(lambda j=job_id: slurm.job(j).finished, 60.0, f"floor job {job_id} to end")
    # A rotation's releases: 4 held jobs released 0.3 s apart, each on its own GPU.
    for i in range(repeats):
        held = []
        for gpu in range(4):
            mark = jobs / f"floor-{os.getpid()}-burst-{i}-{gpu}"
            text = f"#!/bin/bash\ndate +%s.%N > {shlex.quote(str(mark))}\n"
            burst_opts = ["--mem=100M", "--output=/dev/null", f"--gres=gpu:g{gpu}:1", "--nodelist=n2", "--hold"]
            held.append((slurm.submit(SubmitRequest(text, [*burst_opts, "--job-name=burst"])), mark))
        time.sleep(1.0)
        released = []
        for job_id, _ in held:
            released.append(time.time())
            slurm.release(job_id)
            time.sleep(0.3)
        for (job_id, mark), t0 in zip(held, released, strict=True):
            started = float(wait(lambda m=mark: m.exists() and m.read_text().strip(), 60.0, f"burst job {job_id}"))
            s.add("burst_release_to_shell_s", started - t0)
        for job_id, _ in held:
            wait(lambda j=job_id: slurm.job(j).finished, 60.0, f"burst job {job_id} to end")
    return s


def fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 1e6:.2f} MB" if v >= 1e5 else f"{v / 1e3:.1f} kB"
    return f"{v:.3f} {unit}".rstrip()


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "FAIL")


def report(
    release: str, results: dict[str, dict[str, Any]], floors: dict[str, float | None], repeats: int, packing: bool
) -> None:
    print(
        f"Slurm {release}: requeue protocol vs scancel + resubmit (plain sbatch of the same script): medians of "
        f"{repeats} cycles (load avg {os.getloadavg()[0]:.1f})"
    )
    head = f"{'size':<7} {'ckpt size':>10} {'ckpt time':>10} |"
    head += f" {'signal->free':>12} {'scancel->free':>13} {'ratio':>6} |"
    head += f" {'resume->train':>13} {'(release->)':>11} {'resubmit->train':>15} {'ratio':>6} | {'lost steps':>10}"
    print(head)
    print("-" * len(head))
    for size, r in results.items():
        p, mv, b = r["suspend"], r["move"], r["baseline"]
        print(
            f"{size:<7} {fmt(p.get('checkpoint_bytes'), 'B'):>10} {fmt(p.get('checkpoint_s')):>10} |"
            f" {fmt(p.get('signal_to_gpus_free_s')):>12} {fmt(b.get('cancel_to_gpus_free_s')):>13}"
            f" {ratio(p.get('signal_to_gpus_free_s'), b.get('cancel_to_gpus_free_s')):>6} |"
            f" {fmt(mv.get('resume_to_training_s')):>13} {fmt(mv.get('release_to_training_s')):>11}"
            f" {fmt(b.get('submit_to_training_s')):>15}"
            f" {ratio(mv.get('resume_to_training_s'), b.get('submit_to_training_s')):>6} |"
            f" {fmt(b.get('lost_steps'), ''):>10}"
        )
    print("\nwhere a suspend goes (medians):")
    print(f"  {'phase':<86}" + "".join(f"{size:>15}" for size in results))
    for key, what in SUSPEND_PHASES:
        print(f"  {what:<86}" + "".join(f"{fmt(results[size]['suspend'].get(key)):>15}" for size in results))
    print(
        f"  {'total: signal -> GPUs free':<86}"
        + "".join(f"{fmt(results[size]['suspend'].get('signal_to_gpus_free_s')):>15}" for size in results)
    )
    print("\nwhere a resume goes (medians; move = to the other node, same = back onto the node it left):")
    cols = [f"{size} {kind}" for size in results for kind in ("move", "same")]
    cols += [f"{size} resubmit" for size in results]
    print(f"  {'phase':<86}" + "".join(f"{c:>15}" for c in cols))
    for key, what in RESUME_PHASES:
        vals = [results[size][kind].get(key) for size in results for kind in ("move", "same")]
        base = [results[size]["baseline"].get(_BASELINE_PHASE.get(key, "")) for size in results]
        print(f"  {what:<86}" + "".join(f"{fmt(v):>15}" for v in [*vals, *base]))
    totals = [results[size][kind].get("resume_to_training_s") for size in results for kind in ("move", "same")]
    totals += [results[size]["baseline"].get("submit_to_training_s") for size in results]
    print(f"  {'total: resume (or sbatch) -> training resumed':<86}" + "".join(f"{fmt(v):>15}" for v in totals))
    print("\nfloors measured in this run:")
    for key, what in (
        ("import_torch_s", 'python -c "import torch"'),
        ("torch_optimizer_s", "python: import torch, build one optimizer (its first one imports torch._dynamo)"),
        ("release_to_shell_s", "a trivial held batch job: scontrol release -> its shell running"),
        ("submit_to_shell_s", "a trivial batch job: sbatch -> its shell running"),
        ("burst_release_to_shell_s", "4 trivial held jobs released 0.3 s apart: release -> shell running, each"),
    ):
        print(f"  {what:<80} {fmt(floors.get(key)):>10}")
    print("\nacceptance (issue 14):")
    for size, r in results.items():
        mv, b, p = r["move"], r["baseline"], r["suspend"]
        res, sub, free = mv.get("release_to_training_s"), b.get("submit_to_training_s"), p.get("signal_to_gpus_free_s")
        total = mv.get("resume_to_training_s")
        print(
            f"  {size:<7} release -> training {fmt(res)} <= {TARGET_RESUME_S:.0f} s: "
            f"{verdict(None if res is None else res <= TARGET_RESUME_S)};"
            f" resume -> training {fmt(total)} below resubmit {fmt(sub)}: "
            f"{verdict(None if total is None or sub is None else total < sub)};"
            f" signal -> GPUs free {fmt(free)} <= {TARGET_FREE_S} s: "
            f"{verdict(None if free is None else free <= TARGET_FREE_S)}"
        )
    print()
    if packing:
        print("\n".join(table(results, repeats)))
    else:
        print(
            f"in-place switch: Slurm {release} has no packing (SlurmCapabilities.packing is false): the release "
            "keeps the requeue path only; nothing measured in place"
        )


# The baseline's figure that stands beside each resume phase (it has no protocol, release or wrapper).
_BASELINE_PHASE = {"slurm_start_s": "submit_to_shell_s", "process_s": "process_s"}


def merged_results(path: Path, release: str, entry: dict[str, Any]) -> dict[str, Any]:
    """requeue.json with this release's entry replaced; the simulator's overheads from DEFAULT_RELEASE's
    entry (or this one, if that release has none yet)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    releases = old.get("releases") if isinstance(old.get("releases"), dict) else {}
    key = ".".join(release.split(".")[:2])  # one entry per major release (24.11), its full version inside
    releases[key] = {"slurm": release, **entry}
    src_release = DEFAULT_RELEASE if DEFAULT_RELEASE in releases else key
    src = releases[src_release]
    first = next(iter(src["sizes"].values()))
    suspend_s = first["suspend"].get("signal_to_gpus_free_s")
    resume_s = first["move"].get("resume_to_training_s")
    inplace = first.get("inplace") or {}
    return {
        "what": "medians per Slurm release; protocol = gandiva requeue protocol, baseline = scancel + plain "
        "resubmit; benchmarks/bench_requeue.py",
        "releases": dict(sorted(releases.items())),
        # What the simulator charges (seconds; the first size of the default release): a migrate is a
        # suspend plus a resume.
        "overheads": {
            "from": f"Slurm {src_release}",
            "suspend_s": suspend_s,
            "resume_s": resume_s,
            "migrate_s": (suspend_s + resume_s) if suspend_s is not None and resume_s is not None else None,
            # The in-place switch (issue 31; only where the release has packing): park request -> parked,
            # unpark request -> the job training again (its next mini-batch done).
            **{k: inplace[k] for k in ("park_s", "unpark_s") if inplace.get(k) is not None},
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large", help=f"comma list of {','.join(SIZES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--state-dir", default="/tmp/gandiva-bench-requeue")
    ap.add_argument("--port-base", type=int, default=27000)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "requeue.json"))
    ap.add_argument(
        "--scheduler-parameters",
        default=SCHEDULER_PARAMETERS,
        help=f"the cluster's SchedulerParameters (default {SCHEDULER_PARAMETERS}; '' for Slurm's defaults)",
    )
    ap.add_argument("--floors-only", action="store_true", help="measure and print the floors only; write nothing")
    args = ap.parse_args(argv)
    sizes = [x for x in args.sizes.split(",") if x]
    if unknown := [x for x in sizes if x not in SIZES]:
        ap.error(f"unknown sizes {unknown}: pick from {list(SIZES)}")

    cluster = DevCluster(args.state_dir, port_base=args.port_base, scheduler_parameters=args.scheduler_parameters)
    cluster.up()
    slurm = make_backend(cluster.env)
    release = cluster.capabilities.release_text
    packing = cluster.capabilities.packing
    jobs = cluster.jobs_dir / f"bench-{int(time.time())}"
    jobs.mkdir()
    results: dict[str, dict[str, Any]] = {}
    try:
        floors = bench_floors(slurm, jobs, args.repeats).medians()
        if args.floors_only:
            print(f"Slurm {release}, SchedulerParameters={args.scheduler_parameters or '(Slurm defaults)'}:")
            for key, value in floors.items():
                print(f"  {key:<28} {fmt(value):>10}")
            return 0
        for size in sizes:
            proto = bench_protocol(slurm, jobs, size, args.repeats)
            base = bench_baseline(slurm, jobs, size, args.repeats)
            results[size] = {
                "dim_hidden": SIZES[size],
                **{k: v.medians() for k, v in proto.items()},
                "baseline": base.medians(),
                "repeats": args.repeats,
            }
            if packing:
                results[size]["inplace"] = bench_inplace(slurm, jobs, size, train_args(size, []), args.repeats)
    finally:
        if not args.keep:
            cluster.down()

    report(release, results, floors, args.repeats, packing)
    entry = {
        "scheduler_parameters": args.scheduler_parameters,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "backend": type(slurm).__name__,
        "packing": packing,
        "floors": floors,
        "sizes": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged_results(out, release, entry), indent=2) + "\n")
    print(f"wrote {out} (Slurm {release})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
