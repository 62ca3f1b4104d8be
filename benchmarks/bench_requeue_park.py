"""The in-place switch (park / unpark, issue 31) over real Slurm, for bench_requeue.py to set beside the requeue switch.

Two jobs (examples/train.py under gandiva-wrapper) co-hold one GPU, each on a shard of it (started by
`RequeueProtocol.resume` with a shared placement), and take turns: each switch is a park of the computing
job A and an unpark of the parked job B, both through the protocol. Per switch:
  park_s            the park request (the protocol's call) -> A's own "parked" event
  *_signal_s        of it, the protocol's SIGNAL step: the park signal to the batch shell through Slurm
                    (`scancel --signal`), a Slurm call although no Slurm state changes
  unpark_running_s  the unpark request -> B's own "unparked" event (its state back, about to compute)
  unpark_s          the unpark request -> B's next mini-batch done (its first progress report past the
                    step it parked at; reports every PROGRESS_INTERVAL_S: that is the resolution)
  switch_s          A's park request -> B's next mini-batch done (what the other job waits)
  parked CPU        A's training process's utime + stime over CPU_WINDOW_S while parked (from /proc), and
                    its wrapper's (the batch shell exec'd into gandiva-wrapper, the training process's parent)
  parked_bytes      what A reports it holds in host memory while parked (progress.json)
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from job_wrapper.progress import read_events
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK, JobFiles, Progress, read_progress
from slurm_gandiva.requeue.operations import Outcome, Step
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest

BIN = Path(sys.executable).parent
TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train.py"
PROGRESS_INTERVAL_S = 0.02  # the co-held jobs report this often: the resolution of "next mini-batch done"
CPU_WINDOW_S = 2.0
TARGET_SWITCH_S = 0.5  # issue 31: park request -> the other job training again, median
SHARED_GPU = GpuRef("n1", 1)  # away from the requeue job's g0 and the floors' n2 g1
KEYS = (
    "park_s",
    "park_call_s",
    "park_signal_s",
    "unpark_signal_s",
    "unpark_running_s",
    "unpark_s",
    "switch_s",
    "parked_cpu_s",
    "wrapper_cpu_s",
    "parked_bytes",
)


def cpu_seconds(stat: str, ticks: int) -> float:
    """utime + stime (all threads) in seconds from the text of /proc/PID/stat; `ticks` = SC_CLK_TCK.
    The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def parent_pid(stat: str) -> int:
    """The parent's pid (field 4) from the text of /proc/PID/stat."""
    return int(stat.rsplit(")", 1)[1].split()[1])


def _stat(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text()


def _cpu(pid: int) -> float:
    return cpu_seconds(_stat(pid), os.sysconf("SC_CLK_TCK"))


def medians(samples: Mapping[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in samples.items() if v}


def requeue_switch_s(suspend: Mapping[str, Any], move: Mapping[str, Any]) -> float | None:
    """The requeue switch of a GPU from one job to another: its suspend (signal -> GPUs free) plus the other's
    resume -> training (as the simulator's migrate)."""
    free, resume = suspend.get("signal_to_gpus_free_s"), move.get("resume_to_training_s")
    return free + resume if free is not None and resume is not None else None


def _f(v: float | None, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.3f} {unit}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.1f}x" if a is not None and b else "-"


def table(results: Mapping[str, Mapping[str, Any]], repeats: int) -> list[str]:
    """The in-place rows beside the requeue switch's, per size (medians; ratio = requeue / in place), and the
    acceptance line of issue 31. `results[size]` holds "suspend", "move" and "inplace" medians."""
    lines = [
        f"in-place switch (two jobs co-held on shards of one GPU, park A / unpark B through the protocol) vs "
        f"the requeue switch (A suspended, B resumed): medians of {2 * repeats} switches"
    ]
    head = (
        f"{'size':<7} {'parked':>9} | {'park->parked':>12} {'unpark->step':>12} {'switch':>8} |"
        f" {'signal->free':>12} {'resume->train':>13} {'switch':>8} | {'ratio':>6} |"
        f" {'parked CPU/2s':>13} {'wrapper CPU/2s':>14}"
    )
    lines += [head, "-" * len(head)]
    for size, r in results.items():
        ip = r.get("inplace") or {}
        sus, mv = r.get("suspend") or {}, r.get("move") or {}
        rq = requeue_switch_s(sus, mv)
        nbytes = ip.get("parked_bytes")
        lines.append(
            f"{size:<7} {'-' if nbytes is None else f'{nbytes / 1e6:.2f} MB':>9} |"
            f" {_f(ip.get('park_s')):>12} {_f(ip.get('unpark_s')):>12} {_f(ip.get('switch_s')):>8} |"
            f" {_f(sus.get('signal_to_gpus_free_s')):>12} {_f(mv.get('resume_to_training_s')):>13} {_f(rq):>8} |"
            f" {_ratio(rq, ip.get('switch_s')):>6} |"
            f" {_f(ip.get('parked_cpu_s')):>13} {_f(ip.get('wrapper_cpu_s')):>14}"
        )
    lines.append(
        "switch = A's park request -> B's next mini-batch done after its unpark (in place); A's suspend "
        "signal -> GPUs free, plus B's resume -> training (requeue)"
    )
    lines.append("in place, where it goes (medians):")
    for key, what in (
        ("park_call_s", "park: the protocol's call -> it returns (saw A parked)"),
        ("park_signal_s", "of it, the park signal through Slurm (scancel --signal)"),
        ("unpark_running_s", "unpark request -> B's state back (its 'unparked' event)"),
        ("unpark_signal_s", "of it, the unpark signal through Slurm (scancel --signal)"),
    ):
        lines.append(
            f"  {what:<66}" + "".join(f"{_f((r.get('inplace') or {}).get(key)):>12}" for r in results.values())
        )
    lines.append("\nacceptance (issue 31):")
    for size, r in results.items():
        ip = r.get("inplace") or {}
        sw, cpu = ip.get("switch_s"), ip.get("parked_cpu_s")
        ok = "-" if sw is None else ("PASS" if sw <= TARGET_SWITCH_S else "FAIL")
        lines.append(
            f"  {size:<7} in-place switch (request -> the other job training) {_f(sw)} <= "
            f"{TARGET_SWITCH_S} s: {ok}; parked training process CPU {_f(cpu)} in {CPU_WINDOW_S:.0f} s"
        )
    return lines


def _script(state_dir: str, train_args: list[str]) -> str:
    cmd = [
        str(BIN / "gandiva-wrapper"),
        "--progress-interval",
        str(PROGRESS_INTERVAL_S),
        "--",
        sys.executable,
        str(TRAIN),
        *train_args,
    ]
    return (
        f'#!/bin/bash\nexport GANDIVA_STATE_DIR={state_dir}\nmkdir -p -- "$GANDIVA_STATE_DIR"\nexec {shlex.join(cmd)}\n'
    )


def wait(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """`probe()` once it is truthy; exits with one line after `timeout` seconds (the benchmarks' one wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"bench_requeue: timed out after {timeout:.0f} s waiting for {what}")


def _event(files: JobFiles, name: str, after: float, what: str) -> dict[str, Any]:
    got: dict[str, Any] = wait(
        lambda: next((e for e in read_events(files.events) if e["event"] == name and e["time"] >= after), None),
        60.0,
        what,
    )
    return got


def _progress(files: JobFiles, pred: Callable[[Progress], bool], what: str) -> Progress:
    got: Progress = wait(lambda: (p := read_progress(files.progress)) is not None and pred(p) and p, 180.0, what)
    return got


def bench_inplace(slurm: SlurmBackend, jobs: Path, size: str, train_args: list[str], repeats: int) -> dict[str, float]:
    """Medians (KEYS) of 2 * `repeats` in-place switches between two jobs co-held on SHARED_GPU."""
    s: dict[str, list[float]] = {k: [] for k in KEYS}
    ids = [
        slurm.submit(
            SubmitRequest(
                _script(f'{jobs}/"$SLURM_JOB_ID"', train_args),
                [f"--comment={JOB_MARK}", "--mem=2G", f"--output={jobs}/%j.out", f"--job-name=park-{size}-{n}"],
            )
        )
        for n in "ab"
    ]
    proto = RequeueProtocol(slurm, jobs_root=jobs)
    shard = Placement((SHARED_GPU,), shared=True)
    try:
        for jid in ids:
            res = proto.resume(jid, shard)
            if res.outcome is not Outcome.RUNNING:
                raise SystemExit(f"bench_requeue: resume of {jid} onto a shard gave {res.outcome.value}: {res.detail}")
        files = {jid: JobFiles(jobs / jid) for jid in ids}
        for jid in ids:
            _progress(files[jid], lambda p: p.step >= 1, f"job {jid} to train")
        pids = {}
        for jid in ids:
            child = int(_event(files[jid], "start", 0.0, f"job {jid}'s start event")["children"][0])
            pids[jid] = (child, parent_pid(_stat(child)))
        run, idle = ids
        if proto.park(idle).outcome is not Outcome.PARKED:
            raise SystemExit(f"bench_requeue: job {idle} did not park")
        for _ in range(2 * repeats):
            at = _progress(files[run], lambda p: p.state == "running", f"job {run} running").step
            _progress(files[run], lambda p, at=at: p.step >= at + 3, f"job {run} to train on")
            held = read_progress(files[idle].progress)
            assert held is not None and held.state == "parked", held
            t0 = time.time()
            res = proto.park(run)
            if res.outcome is not Outcome.PARKED:
                raise SystemExit(f"bench_requeue: park of {run} gave {res.outcome.value}: {res.detail}")
            parked = _event(files[run], "parked", t0, f"job {run}'s parked event")
            t1 = time.time()
            back = proto.unpark(idle)
            if back.outcome is not Outcome.RUNNING:
                raise SystemExit(f"bench_requeue: unpark of {idle} gave {back.outcome.value}: {back.detail}")
            unparked = _event(files[idle], "unparked", t1, f"job {idle}'s unparked event")
            nxt = _progress(
                files[idle],
                lambda p, at=held.step: p.state == "running" and p.step > at,
                f"job {idle}'s next mini-batch",
            )
            s["park_s"].append(parked["time"] - t0)
            s["park_call_s"].append(res.seconds)
            for key, op in (("park_signal_s", res), ("unpark_signal_s", back)):
                sig = op.step(Step.SIGNAL)
                if sig is not None:
                    s[key].append(sig.seconds)
            s["unpark_running_s"].append(unparked["time"] - t1)
            s["unpark_s"].append(nxt.updated - t1)
            s["switch_s"].append(nxt.updated - t0)
            now = read_progress(files[run].progress)
            if now is not None and now.parked_bytes is not None:
                s["parked_bytes"].append(float(now.parked_bytes))
            child, wrapper = pids[run]
            c0, w0 = _cpu(child), _cpu(wrapper)
            time.sleep(CPU_WINDOW_S)
            s["parked_cpu_s"].append(_cpu(child) - c0)
            s["wrapper_cpu_s"].append(_cpu(wrapper) - w0)
            run, idle = idle, run
    finally:
        for jid in ids:
            slurm.cancel(jid)
    out = medians(s)
    out["parked_cpu_s"] = max(s["parked_cpu_s"])  # the worst window: a parked job uses no CPU in any of them
    return out
