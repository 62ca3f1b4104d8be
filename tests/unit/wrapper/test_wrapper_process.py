"""gandiva-wrapper as a real subprocess running examples/train.py (real PyTorch, gloo on CPU; no Slurm)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from job_wrapper import checkpoint as ckpt
from job_wrapper.progress import read_events
from slurm_gandiva.requeue.contract import ExitCode, JobFiles, read_progress, stale_temps

ROOT = Path(__file__).resolve().parents[3]
WRAPPER = Path(sys.executable).with_name("gandiva-wrapper")
TRAIN = ROOT / "examples" / "train.py"
# 256 samples / 16 per batch = 16 steps per epoch, 3 epochs = 48 steps of ~0.04 s each.
TRAIN_ARGS = ["--epochs", "3", "--samples", "256", "--batch-size", "16", "--hidden", "32", "--sleep-per-step", "0.04"]
TOTAL_STEPS = 48
HASH_RE = re.compile(r"final_params_sha256=([0-9a-f]{64})")

pytestmark = pytest.mark.timeout(300)


@dataclass
class Run:
    proc: subprocess.Popen[str]
    files: JobFiles
    log: Path
    started: float

    def wait_step(self, step: int, timeout: float = 120.0) -> int:
        """Wait until progress.json reports at least `step`; returns the step seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            prog = read_progress(self.files.progress)
            if prog is not None and prog.step >= step and prog.updated >= self.started:
                return prog.step
            assert self.proc.poll() is None, f"wrapper exited early ({self.proc.returncode}): {self.output()}"
            time.sleep(0.02)
        raise AssertionError(f"no progress to step {step} in {timeout}s: {self.output()}")

    def wait_event(self, name: str, timeout: float = 120.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in read_events(self.files.events):
                if ev["event"] == name and float(ev["time"]) >= self.started:
                    return ev
            assert self.proc.poll() is None, f"wrapper exited early ({self.proc.returncode}): {self.output()}"
            time.sleep(0.02)
        raise AssertionError(f"no {name!r} event in {timeout}s: {self.output()}")

    def signal(self, sig: int = signal.SIGUSR2) -> None:
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 180.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"wrapper did not finish in {timeout}s: {self.output()}") from None

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def events(self) -> list[dict[str, object]]:
        return [e for e in read_events(self.files.events) if float(e["time"]) >= self.started]


def start(state: Path, nprocs: int = 1, extra: list[str] | None = None, env: dict[str, str] | None = None) -> Run:
    state.mkdir(parents=True, exist_ok=True)
    log = state / f"run-{time.monotonic_ns()}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE", "GANDIVA_"))}
    full_env.update(env or {})
    argv = [str(WRAPPER), "--state-dir", str(state), "--nprocs", str(nprocs), "--progress-interval", "0.1",
            "--", sys.executable, str(TRAIN), *TRAIN_ARGS, *(extra or [])]
    started = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=full_env,
                                start_new_session=True)
    return Run(proc, JobFiles(state), log, started)


def suspend_at(state: Path, step: int, nprocs: int = 1, extra: list[str] | None = None) -> int:
    """Run until `step`, signal, expect a clean suspend; returns the checkpointed step."""
    run = start(state, nprocs, extra)
    run.wait_step(step)
    run.signal()
    assert run.finish() == ExitCode.SUSPENDED, run.output()
    status = json.loads(run.files.status.read_text())
    assert status["outcome"] == "suspended"
    saved = [e for e in run.events() if e["event"] == "checkpoint"]
    assert len(saved) == 1, run.events()
    done: int = saved[0]["step"]  # type: ignore[assignment]
    return done


def finish_hash(state: Path, nprocs: int = 1, extra: list[str] | None = None) -> tuple[str, Run]:
    run = start(state, nprocs, extra)
    assert run.finish() == ExitCode.DONE, run.output()
    m = HASH_RE.search(run.output())
    assert m, run.output()
    assert json.loads(run.files.status.read_text())["outcome"] == "done"
    return m.group(1), run


@pytest.fixture(autouse=True)
def _kill_leftovers(tmp_path: Path) -> object:
    """A failed test must not leave training processes behind: kill the process group of every wrapper
    still running on this test's directory (each run starts its own session)."""
    yield
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"gandiva-wrapper") for a in cmd[:2]) and str(tmp_path).encode() in b" ".join(cmd):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(proc_dir.name), signal.SIGKILL)


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run, 1 process."""
    h, run = finish_hash(tmp_path_factory.mktemp("ref"))
    prog = read_progress(run.files.progress)
    assert prog is not None and prog.step == TOTAL_STEPS and prog.state == "done"
    assert not run.files.checkpoint.exists()  # never signalled: nothing written
    return h


def test_suspended_three_times_at_random_steps_gives_the_same_hash(tmp_path: Path, reference_hash: str) -> None:
    rng = random.Random(2)
    targets = sorted(rng.sample(range(3, TOTAL_STEPS - 8), 3))
    steps: list[int] = []
    for target in targets:
        target = max(target, steps[-1] + 2) if steps else target
        steps.append(suspend_at(tmp_path, target))
    assert steps == sorted(set(steps)) and steps[-1] < TOTAL_STEPS, steps
    h, run = finish_hash(tmp_path)
    resumed = [e for e in run.events() if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == steps[-1]
    assert h == reference_hash


def test_resize_2_1_2_sees_every_sample_exactly_once_per_epoch(tmp_path: Path) -> None:
    log = tmp_path / "samples.jsonl"
    extra = ["--sample-log", str(log)]
    s1 = suspend_at(tmp_path, 10, nprocs=2, extra=extra)
    s2 = suspend_at(tmp_path, s1 + 12, nprocs=1, extra=extra)
    assert s2 > s1
    _, run = finish_hash(tmp_path, nprocs=2, extra=extra)
    assert [e["saved_world_size"] for e in run.events() if e["event"] == "resumed"] == [1]
    seen: Counter[tuple[int, int]] = Counter()
    ranks_by_step: dict[int, set[int]] = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        for i in rec["ids"]:
            seen[(rec["epoch"], i)] += 1
        ranks_by_step.setdefault(rec["step"], set()).add(rec["rank"])
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v != 1][:10]
    assert set(seen) == {(e, i) for e in range(3) for i in range(256)}
    assert ranks_by_step[0] == {0, 1} and ranks_by_step[s1] == {0} and ranks_by_step[TOTAL_STEPS - 1] == {0, 1}


def test_two_processes_suspend_together_and_resume_bit_for_bit(tmp_path: Path) -> None:
    ref, _ = finish_hash(tmp_path / "ref", nprocs=2)
    s = suspend_at(tmp_path / "cut", 17, nprocs=2)
    assert 17 <= s < TOTAL_STEPS
    h, _ = finish_hash(tmp_path / "cut", nprocs=2)
    assert h == ref


def test_signal_before_first_batch_second_signal_and_kill_9_keep_a_loadable_checkpoint(
    tmp_path: Path, reference_hash: str
) -> None:
    """One job through the three hard cases (sharing resumes keeps the test short)."""
    # 1. A signal before the first mini-batch: the child is still importing torch, the signal is held.
    run = start(tmp_path)
    run.wait_event("start")
    run.signal()
    assert run.finish() == ExitCode.SUSPENDED, run.output()
    assert [e["step"] for e in run.events() if e["event"] == "checkpoint"] == [0]
    assert ckpt.decode(run.files.checkpoint.read_bytes())["step"] == 0

    # 2. A second signal while the checkpoint is being written: ignored, one complete checkpoint.
    run = start(tmp_path, env={"GANDIVA_TEST_CHECKPOINT_PAUSE": "1.0"})
    run.wait_step(10)
    run.signal()
    run.wait_event("checkpoint_paused")
    run.signal()
    assert run.finish() == ExitCode.SUSPENDED, run.output()
    evs = run.events()
    assert [e["count"] for e in evs if e["event"] == "signal"] == [1, 2]
    saved = [e for e in evs if e["event"] == "checkpoint"]
    assert len(saved) == 1
    second = int(saved[0]["step"])  # type: ignore[call-overload]
    assert second >= 10
    assert ckpt.decode(run.files.checkpoint.read_bytes())["step"] == second
    assert ckpt.decode(run.files.checkpoint_prev.read_bytes())["step"] == 0
    assert not stale_temps(run.files.checkpoint)

    # 3. kill -9 (wrapper and training) half-way through the next checkpoint write.
    run = start(tmp_path, env={"GANDIVA_TEST_CHECKPOINT_PAUSE": "60"})
    run.wait_step(second + 8)
    run.signal()
    run.wait_event("checkpoint_paused")
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    partial = stale_temps(run.files.checkpoint)
    assert len(partial) == 1 and partial[0].stat().st_size > 0  # the half-written file
    assert ckpt.decode(run.files.checkpoint.read_bytes())["step"] == second

    # The job continues from the last complete checkpoint and ends as if never interrupted.
    h, resumed = finish_hash(tmp_path)
    assert [e["step"] for e in resumed.events() if e["event"] == "resumed"] == [second]
    assert h == reference_hash


def test_corrupt_checkpoint_without_fallback_fails_with_one_line(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    files.checkpoint.write_bytes(ckpt.MAGIC + b"\0" * 100)
    run = start(tmp_path)
    assert run.finish() == ExitCode.FAILED
    out = run.output()
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("gandiva: ")]
    assert len(lines) == 1 and "no loadable checkpoint" in lines[0] and "checkpoint.pt" in lines[0], out
    assert json.loads(files.status.read_text())["outcome"] == "failed"


# -- the launcher alone, with a torch-free child (fast) ------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    blocked = signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    open(os.environ["OUT"] + "." + os.environ["RANK"], "w").write(
        f"{blocked} {os.environ['WORLD_SIZE']} {os.environ.get('CUDA_VISIBLE_DEVICES')} {os.environ['MASTER_PORT']}")
    got = []
    signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
    deadline = time.time() + float(os.environ.get("WAIT", "30"))
    while not got and time.time() < deadline:
        time.sleep(0.01)
    sys.exit(75 if got else int(os.environ.get("NOSIG_EXIT", "0")))
    """
)


def run_fake(tmp_path: Path, env_extra: dict[str, str], signal_it: bool) -> tuple[int, JobFiles, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE", "GANDIVA_"))}
    env.update(OUT=str(tmp_path / "child"), **env_extra)
    files = JobFiles(tmp_path / "state")
    proc = subprocess.Popen([str(WRAPPER), "--state-dir", str(files.root), "--", sys.executable, "-c", CHILD],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if signal_it:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"child.{r}").exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGUSR2)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, files, out


def test_wrapper_runs_one_child_per_gpu_and_forwards_the_signal(tmp_path: Path) -> None:
    rc, files, out = run_fake(tmp_path, {"CUDA_VISIBLE_DEVICES": "1,3"}, signal_it=True)
    assert rc == ExitCode.SUSPENDED, out
    c0 = (tmp_path / "child.0").read_text().split()
    c1 = (tmp_path / "child.1").read_text().split()
    assert c0[:3] == ["True", "2", "1"] and c1[:3] == ["True", "2", "3"]  # blocked at start, own GPU
    assert c0[3] == c1[3]  # one MASTER_PORT
    status = json.loads(files.status.read_text())
    assert status["outcome"] == "suspended" and status["gpus"] == ["1", "3"] and status["child_exit_codes"] == [75, 75]


def _failing_scontrol(tmp_path: Path, also: str = "") -> tuple[Path, Path]:
    """A bin dir with an `scontrol` that logs its arguments to the returned file, runs `also`, and fails."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    fake = bindir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n{also}\nexit 1\n')
    fake.chmod(0o755)
    return bindir, calls


def test_wrapper_requeue_holds_inside_slurm_and_survives_a_failing_scontrol(tmp_path: Path) -> None:
    bindir, calls = _failing_scontrol(tmp_path, 'echo "scontrol: error: Invalid job id" >&2')
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "0,2", "PATH": f"{bindir}:{os.environ['PATH']}"}
    rc, files, out = run_fake(tmp_path, env, signal_it=True)
    assert rc == ExitCode.SUSPENDED, out
    assert calls.read_text().split() == ["requeuehold", "4242"]
    kinds = [e["event"] for e in read_events(files.events)]
    assert kinds.index("exit") < kinds.index("requeuehold") < kinds.index("requeuehold_failed")
    assert "Invalid job id" in out
    assert json.loads(files.status.read_text())["job_id"] == "4242"


def test_wrapper_reports_a_failed_rank(tmp_path: Path) -> None:
    rc, files, out = run_fake(tmp_path, {"SLURM_JOB_GPUS": "0,1", "NOSIG_EXIT": "3", "WAIT": "0"}, signal_it=False)
    assert rc == ExitCode.FAILED, out
    status = json.loads(files.status.read_text())
    assert status["outcome"] == "failed" and "exit 3" in status["reason"]


def test_wrapper_usage_errors_exit_64(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GANDIVA_STATE_DIR"}
    res = subprocess.run([str(WRAPPER), "--", "true"], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == ExitCode.USAGE and res.stderr.count("\n") == 1 and "--state-dir" in res.stderr
    res = subprocess.run([str(WRAPPER), "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == ExitCode.USAGE and "no command" in res.stderr


COUNTING_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    got = []
    signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
    open(os.environ["OUT"] + ".ready", "w").close()
    deadline = time.time() + 30
    while not got and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)  # "checkpointing": the controller signals again meanwhile
    open(os.environ["OUT"] + ".count", "w").write(str(len(got)))
    sys.exit(75)
    """
)


def _spam_until_exit(proc: subprocess.Popen[str], events: Path) -> int:
    """Send SIGUSR2 every few ms from the training_done event until `proc` exits; returns how many were sent."""
    sent = 0
    while proc.poll() is None:
        if any(e["event"] == "training_done" for e in read_events(events)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR2)
                sent += 1
        time.sleep(0.005)
    return sent


def test_repeated_and_late_signals_neither_kill_training_nor_fail_a_finished_run(tmp_path: Path) -> None:
    # 1. A second signal while the child stops: not forwarded (the child sees one), the run is suspended.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE", "GANDIVA_"))}
    env.update(OUT=str(tmp_path / "child"))
    files = JobFiles(tmp_path / "state")
    proc = subprocess.Popen([str(WRAPPER), "--state-dir", str(files.root), "--", sys.executable, "-c", COUNTING_CHILD],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "child.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR2)
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.SUSPENDED, out
    assert (tmp_path / "child.count").read_text() == "1"
    sig = [e for e in read_events(files.events) if e["event"] == "signal"]
    assert [e.get("ignored") for e in sig] == [None, "a stop is already pending"], sig

    # 2. Signals from the end of training until the processes exit: the run is DONE, under the wrapper ...
    small = ["--epochs", "1", "--samples", "64", "--batch-size", "16", "--hidden", "8"]
    run = start(tmp_path / "late", extra=small)
    sent = _spam_until_exit(run.proc, run.files.events)
    assert sent > 0 and run.proc.returncode == ExitCode.DONE, run.output()
    assert json.loads(run.files.status.read_text())["outcome"] == "done"
    assert HASH_RE.search(run.output())

    # ... and for the training process alone (its interpreter teardown restores SIGUSR2's default action)
    alone = tmp_path / "alone"
    alone.mkdir()
    env.update(GANDIVA_STATE_DIR=str(alone))
    child = subprocess.Popen([sys.executable, str(TRAIN), *small], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    sent = _spam_until_exit(child, JobFiles(alone).events)
    out = child.stdout.read() if child.stdout else ""
    assert sent > 0 and child.returncode == 0, out


def test_an_array_task_requeue_holds_itself_by_array_and_task_id(tmp_path: Path) -> None:
    """A task's numeric id can be its array's id (the array's record ends as one of its tasks), and
    `scontrol requeuehold ARRAY_ID` requeues every task of the array, cancelled and completed ones too (seen
    in CI: a cancelled task ran again). The wrapper names its task as ARRAY_TASK."""
    bindir, calls = _failing_scontrol(tmp_path)
    env = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "11", "SLURM_JOB_GPUS": "0,1",
           "PATH": f"{bindir}:{os.environ['PATH']}"}
    rc, files, out = run_fake(tmp_path, env, signal_it=True)
    assert rc == ExitCode.SUSPENDED, out
    assert calls.read_text().split() == ["requeuehold", "7_11"]
    assert json.loads(files.status.read_text())["job_id"] == "7_11"
