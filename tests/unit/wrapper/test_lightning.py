"""The Lightning callback with the real Lightning on CPU, outside Slurm: a suspend (the flag set at a given
batch) stops at that batch boundary with a Lightning checkpoint in the state directory and exit code 75; the
next run resumes from it by itself and ends with the parameters of an uninterrupted run, bit for bit."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment  # type: ignore[attr-defined]
from torch import nn

from job_wrapper import lightning as gl
from job_wrapper.progress import read_events
from slurm_gandiva.requeue.contract import ExitCode, read_progress

N, BATCH, EPOCHS = 96, 16, 2  # 6 batches an epoch, 12 in all


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(N, 4, generator=gen)
        self.y = self.x.sum(1, keepdim=True)
        self.seen: list[list[int]] = []

    def train_dataloader(self) -> Any:
        return gl.loader((self.x, self.y, torch.arange(N)), batch_size=BATCH, seed=3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, ids = batch
        self.seen.append(ids.tolist())
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)}


class SuspendAt(pl.Callback):
    """Sets the callback's flag (what the signal handler does) during batch `at` (0-based, over the job)."""

    def __init__(self, gandiva: gl.GandivaCallback, at: int) -> None:
        self.gandiva, self.at = gandiva, at

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.gandiva.job.step == self.at:
            self.gandiva.job.request_suspend()


def trainer(callbacks: list[pl.Callback], **kw: Any) -> pl.Trainer:
    kw.setdefault("max_epochs", EPOCHS)
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                      callbacks=callbacks, **kw)


def params(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def run(state: Path, at: int | None = None, **kw: Any) -> tuple[Tiny, gl.GandivaCallback]:
    model = Tiny()
    gandiva = gl.GandivaCallback(state, fast_exit=False, progress_interval=60)
    cbs: list[pl.Callback] = [gandiva] + ([SuspendAt(gandiva, at)] if at is not None else [])
    gandiva.fit(trainer(cbs, **kw), model)
    return model, gandiva


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("at", [3, 5, 8])  # mid-epoch, an epoch's last batch, the second epoch
def test_suspend_checkpoints_exits_75_and_resumes_to_the_uninterrupted_parameters(tmp_path: Path, at: int) -> None:
    ref, first = run(tmp_path / "ref")  # first run, no checkpoint: just starts
    assert first.resumed_from is None and first.job.step == len(ref.seen)
    state = tmp_path / "job"
    with pytest.raises(SystemExit) as exc:
        run(state, at=at)
    assert exc.value.code == ExitCode.SUSPENDED
    assert (state / gl.CHECKPOINT).is_file()
    st = torch.load(state / gl.CHECKPOINT, weights_only=False)
    assert st["gandiva"]["step"] == at + 1  # stopped at the boundary after the signalled batch
    assert st["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"epoch": (at + 1) // 6, "position": (at + 1) % 6 * BATCH, "size": N, "batch_size": BATCH, "seed": 3}]
    prog = read_progress(state / "progress.json")
    assert prog is not None and prog.state == "suspended" and prog.step == at + 1
    resumed, gandiva = run(state)
    assert gandiva.resumed_from == state / gl.CHECKPOINT
    assert all(torch.equal(a, b) for a, b in zip(params(ref.net), params(resumed.net), strict=True))
    # Exactly the batches the uninterrupted run trained after the checkpoint, none repeated or skipped.
    assert resumed.seen == ref.seen[at + 1 :]
    assert [e["event"] for e in read_events(state / "events.jsonl")].count("resumed") == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_with_gradient_accumulation_the_suspend_waits_for_the_optimizer_step(tmp_path: Path) -> None:
    ref, _ = run(tmp_path / "ref", accumulate_grad_batches=2)
    state = tmp_path / "job"
    with pytest.raises(SystemExit):
        run(state, at=2, accumulate_grad_batches=2)  # signalled in batch 2: batch 3 completes the step
    assert torch.load(state / gl.CHECKPOINT, weights_only=False)["gandiva"]["step"] == 4
    resumed, _ = run(state, accumulate_grad_batches=2)
    assert resumed.seen == ref.seen[4:]
    assert all(torch.equal(a, b) for a, b in zip(params(ref.net), params(resumed.net), strict=True))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lightning_slurm_auto_requeue_is_switched_off_and_never_takes_our_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside a Slurm job, Lightning would install its auto-requeue handler (checkpoint + scontrol requeue)
    # on requeue_signal; here that is our own signal.
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    env = SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR2)
    handlers: dict[str, Any] = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *a: Any) -> None:
            handlers["usr2"] = signal.getsignal(signal.SIGUSR2)
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGUSR2)  # what the wrapper forwards

    model = Tiny()
    gandiva = gl.GandivaCallback(tmp_path, fast_exit=False, progress_interval=60)
    tr = trainer([gandiva, Probe()], plugins=[env])
    called: list[int] = []
    monkeypatch.setattr(tr._signal_connector, "_slurm_sigusr_handler_fn", lambda *a: called.append(1))
    with pytest.raises(SystemExit) as exc:
        gandiva.fit(tr, model)
    assert exc.value.code == ExitCode.SUSPENDED
    assert env.auto_requeue is False
    assert handlers["usr2"] == gandiva.job._on_signal  # ours, not Lightning's
    assert not called and not list(tmp_path.glob("hpc_ckpt_*"))
    assert torch.load(tmp_path / gl.CHECKPOINT, weights_only=False)["gandiva"]["step"] == 3
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_IGN, gandiva.job._on_signal)  # never the default


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_with_one_line(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, _ = run(tmp_path / "ref")
    state = tmp_path / "job"
    with pytest.raises(SystemExit):
        run(state, at=2)  # lightning.ckpt at step 3
    with pytest.raises(SystemExit):
        run(state, at=6)  # lightning.ckpt at step 7, the one at 3 becomes lightning.prev.ckpt
    newest = state / gl.CHECKPOINT
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    capsys.readouterr()
    resumed, gandiva = run(state)
    err = capsys.readouterr().err
    assert gandiva.resumed_from == state / gl.PREVIOUS
    assert [ln for ln in err.splitlines() if "damaged" in ln] == [
        f"gandiva: {newest} is damaged ({gl._damage(state / (gl.CHECKPOINT + '.corrupt'))}): set aside as "
        f"{gl.CHECKPOINT}.corrupt"]
    assert resumed.seen == ref.seen[3:]  # from the previous checkpoint: batches 3.. again
    assert all(torch.equal(a, b) for a, b in zip(params(ref.net), params(resumed.net), strict=True))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_damaged_only_checkpoint_starts_over_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, _ = run(tmp_path / "ref")
    state = tmp_path / "job"
    with pytest.raises(SystemExit):
        run(state, at=4)
    (state / gl.CHECKPOINT).write_bytes(b"not a checkpoint")
    capsys.readouterr()
    resumed, gandiva = run(state)
    err = capsys.readouterr().err
    assert gandiva.resumed_from is None and "training starts from the beginning" in err
    assert resumed.seen == ref.seen and gandiva.job.step == len(ref.seen)
    assert all(torch.equal(a, b) for a, b in zip(params(ref.net), params(resumed.net), strict=True))
