"""The training-loop API in one process (world size 1): suspend, resume bit-for-bit, data order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from job_wrapper import Session, epoch_order
from job_wrapper.order import shard
from job_wrapper.progress import read_events
from slurm_gandiva.requeue.contract import ExitCode, JobFiles, read_progress

N, BATCH, EPOCHS = 40, 8, 3  # 5 steps per epoch, 15 in all


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("RANK", "WORLD_SIZE", "GANDIVA_STATE_DIR", "GANDIVA_SIGNAL", "GANDIVA_TEST_CHECKPOINT_PAUSE",
                "GANDIVA_FAST_EXIT"):
        monkeypatch.delenv(var, raising=False)
    old = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, old)


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


DATA = (torch.randn(N, 4, generator=torch.Generator().manual_seed(1)), torch.arange(N))


def train(state: Path, suspend_after: int | None = None, log: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """Train to the end, or until `suspend_after` steps of this run (then SystemExit from step())."""
    model, opt, sched = make()
    job = Session(model, opt, scheduler=sched, seed=3, state_dir=state, progress_interval=60)
    for done, (x, ids) in enumerate(job.batches(DATA, batch_size=BATCH, epochs=EPOCHS), start=1):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if log is not None:
            log.extend((job.epoch, int(i)) for i in ids)
        if done == suspend_after:
            job.request_suspend()
        job.step(samples=1)  # ignored inside batches(): the position counts the global batch (8)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_suspend_and_resume_in_process_is_bit_for_bit(tmp_path: Path) -> None:
    ref = train(tmp_path / "ref")
    log: list[tuple[int, int]] = []
    for k in (4, 1, 6):
        with pytest.raises(SystemExit) as exc:
            train(tmp_path / "cut", suspend_after=k, log=log)
        assert exc.value.code == ExitCode.SUSPENDED
    out = train(tmp_path / "cut", log=log)
    assert torch.equal(out, ref)
    counts = Counter(log)
    assert set(counts.values()) == {1} and len(counts) == N * EPOCHS
    events = [e["event"] for e in read_events(JobFiles(tmp_path / "cut").events)]
    assert events.count("checkpoint") == 3 and events.count("resumed") == 3
    prog = read_progress(JobFiles(tmp_path / "cut").progress)
    assert prog is not None and prog.step == 15 and prog.samples == N * EPOCHS and prog.state == "done"
    assert prog.total_samples == N * EPOCHS and prog.epoch == EPOCHS and prog.world_size == 1


def test_the_signal_only_sets_a_flag_and_the_boundary_suspends(tmp_path: Path) -> None:
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path, progress_interval=60)
    it = job.batches(DATA, batch_size=BATCH)
    next(it)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert job._signalled  # handled (flag set) but nothing else happened yet
    assert not JobFiles(tmp_path).checkpoint.exists()
    with pytest.raises(SystemExit) as exc:
        job.step()
    assert exc.value.code == ExitCode.SUSPENDED
    from job_wrapper import checkpoint as ckpt

    st = ckpt.decode(JobFiles(tmp_path).checkpoint.read_bytes())
    assert (st["step"], st["epoch"], st["position"], st["samples"]) == (1, 0, BATCH, BATCH)
    assert read_progress(JobFiles(tmp_path).progress).state == "suspended"


def test_signal_before_the_first_batch_checkpoints_the_initial_state(tmp_path: Path) -> None:
    model, opt, _ = make()
    before = [p.detach().clone() for p in model.parameters()]
    job = Session(model, opt, state_dir=tmp_path, progress_interval=60)
    job.request_suspend()
    with pytest.raises(SystemExit) as exc:
        next(iter(job.batches(DATA, batch_size=BATCH)))
    assert exc.value.code == ExitCode.SUSPENDED
    model2, opt2, _ = make()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)
    Session(model2, opt2, state_dir=tmp_path, progress_interval=60)
    assert all(torch.equal(a, b) for a, b in zip(before, model2.parameters(), strict=True))


def test_a_corrupt_checkpoint_without_fallback_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    JobFiles(tmp_path).checkpoint.write_bytes(b"garbage")
    model, opt, _ = make()
    with pytest.raises(SystemExit) as exc:
        Session(model, opt, state_dir=tmp_path, progress_interval=60)
    assert exc.value.code == ExitCode.FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gandiva: no loadable checkpoint")
    assert [e["event"] for e in read_events(JobFiles(tmp_path).events)] == ["error"]


def test_periodic_checkpoints_and_max_steps(tmp_path: Path) -> None:
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path, checkpoint_every=4, progress_interval=60)
    steps = sum(1 for _ in job.batches(DATA, batch_size=BATCH, epochs=EPOCHS, max_steps=11))  # no step(): implicit
    assert steps == 11 and job.global_step == 11 and job.epoch == 2 and job.samples_done == 11 * BATCH
    saved = [e["step"] for e in read_events(JobFiles(tmp_path).events) if e["event"] == "checkpoint"]
    assert saved == [4, 8]
    assert read_progress(JobFiles(tmp_path).progress).total_samples == 11 * BATCH


def test_a_script_run_by_hand_trains_with_checkpoints_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside Slurm and the wrapper: plain training, checkpoints in ./gandiva-state (said once), and a
    second run resumes from them, as under the wrapper (issue 16, item 5: no traceback)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    model, opt, _ = make()
    job = Session(model, opt, progress_interval=60, install_signal_handler=False)
    assert job.files.root == tmp_path / "gandiva-state"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plain training" in err and str(tmp_path / "gandiva-state") in err
    job.save_checkpoint()
    model2, opt2, _ = make()
    again = Session(model2, opt2, progress_interval=60, install_signal_handler=False)
    assert again.resumed_from is not None and again.files.root == job.files.root


def test_a_slurm_job_without_a_state_dir_ends_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inside a Slurm job the wrapper names the directory: without one, one line and the failed exit code,
    never checkpoints written into the job's working directory."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.chdir(tmp_path)
    model, opt, _ = make()
    with pytest.raises(SystemExit) as exc:
        Session(model, opt)
    assert exc.value.code == int(ExitCode.FAILED)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GANDIVA_STATE_DIR" in err and "gandiva sbatch" in err
    assert not (tmp_path / "gandiva-state").exists()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    batch=st.integers(1, 9),
    worlds=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 12), min_size=3, max_size=3),
)
def test_every_sample_once_per_epoch_whatever_the_world_sizes(
    n: int, batch: int, worlds: list[int], cuts: list[int]
) -> None:
    """Positions count global samples, so changing the world size between runs never skips or repeats."""
    order = epoch_order(n, seed=7, epoch=0)
    assert sorted(order) == list(range(n)) and order == epoch_order(n, seed=7, epoch=0)
    seen: list[int] = []
    pos, run = 0, 0
    while pos < n:
        world = worlds[run % len(worlds)]
        for _ in range(max(1, cuts[run % len(cuts)])):  # this run's steps before it is suspended
            if pos >= n:
                break
            gb = order[pos : pos + batch]
            parts = [shard(gb, r, world) for r in range(world)]
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            seen.extend(i for p in parts for i in p)
            pos += len(gb)
        run += 1
    assert sorted(seen) == list(range(n))


def test_epoch_order_depends_on_seed_and_epoch() -> None:
    assert epoch_order(50, 1, 0) != epoch_order(50, 1, 1)
    assert epoch_order(50, 1, 0) != epoch_order(50, 2, 0)
    assert json.dumps(epoch_order(5, 0, 0))  # plain ints


def test_resume_from_the_previous_checkpoint_sets_the_corrupt_one_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = JobFiles(tmp_path)
    for k in (2, 3):  # two suspends: checkpoint.pt (step 5) and checkpoint.prev.pt (step 2)
        with pytest.raises(SystemExit):
            train(tmp_path, suspend_after=k)
    files.checkpoint.write_bytes(files.checkpoint.read_bytes()[:-10])
    model, opt, sched = make()
    job = Session(model, opt, scheduler=sched, seed=3, state_dir=tmp_path, progress_interval=60)
    assert job.resumed_from == files.checkpoint_prev and job.global_step == 2
    assert "warning" in capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt.corrupt").exists() and not files.checkpoint.exists()
    job.request_suspend()
    with pytest.raises(SystemExit):
        next(iter(job.batches(DATA, batch_size=BATCH, epochs=EPOCHS)))
    # the good previous checkpoint was not overwritten by the corrupt one
    from job_wrapper import checkpoint as ckpt

    assert ckpt.decode(files.checkpoint_prev.read_bytes())["step"] == 2
    assert ckpt.decode(files.checkpoint.read_bytes())["step"] == 2


def test_step_samples_counts_outside_batches(tmp_path: Path) -> None:
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path, progress_interval=60)
    job.step(samples=10)
    job.step()
    assert (job.global_step, job.samples_done, job.epoch) == (2, 10, 0)


def test_once_training_is_over_the_signal_is_ignored(tmp_path: Path) -> None:
    """Done or suspended, the process ignores later signals: at interpreter teardown Python would restore the
    default action (terminate), so a late signal would turn a finished run into a failed one."""
    train(tmp_path / "done")
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGUSR2)  # ignored: the test process lives on
    with pytest.raises(SystemExit):
        train(tmp_path / "cut", suspend_after=2)
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    # while training the signal is handled (a flag), never ignored
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path / "live", progress_interval=60)
    assert signal.getsignal(signal.SIGUSR2) == job._on_signal
    job._close("done")


@pytest.mark.parametrize("fast", [True, False])
def test_exit_process_skips_the_interpreter_teardown_only_under_the_wrapper(tmp_path: Path, fast: bool) -> None:
    """Under the wrapper (GANDIVA_FAST_EXIT=1) a script's last exit_process(code) leaves with os._exit: the
    exit code kept, stdout flushed, no atexit handler (torch's teardown, where gloo can abort a rank) run;
    elsewhere it is sys.exit."""
    script = tmp_path / "s.py"
    script.write_text(
        "import atexit, sys\n"
        "from job_wrapper import exit_process\n"
        "atexit.register(lambda: print('teardown ran', flush=True))\n"
        "sys.stdout.write('trained ')\n"
        "exit_process(3)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GANDIVA_FAST_EXIT"}
    if fast:
        env["GANDIVA_FAST_EXIT"] = "1"
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stdout.startswith("trained ")
    assert ("teardown ran" in p.stdout) is not fast
