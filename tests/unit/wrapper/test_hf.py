"""The Hugging Face Trainer callback with the real Trainer on CPU, outside Slurm: a suspend (the flag set at a
given step) stops at that step boundary with the Trainer's own checkpoint in the state directory and exit code
75; the next run resumes from it by itself, trains exactly the remaining batches and ends with the parameters
of an uninterrupted run, bit for bit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from job_wrapper import hf as ghf
from slurm_gandiva.requeue.contract import ExitCode, read_progress

N, BATCH, EPOCHS = 48, 8, 2  # 6 steps an epoch, 12 in all


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(N, 4, generator=gen)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True), "idx": torch.tensor(i)}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
        self.seen: list[list[int]] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(idx.tolist())
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


class SuspendAt(TrainerCallback):
    def __init__(self, gandiva: ghf.GandivaTrainerCallback, at: int) -> None:
        self.gandiva, self.at = gandiva, at

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.gandiva.job.request_suspend()


def run(tmp: Path, state: Path, at: int | None = None) -> tuple[Tiny, ghf.GandivaTrainerCallback]:
    model = Tiny()
    args = TrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=BATCH, num_train_epochs=EPOCHS,
                             learning_rate=0.05, seed=3, use_cpu=True, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, remove_unused_columns=False,
                             dataloader_num_workers=0, lr_scheduler_type="linear")
    gandiva = ghf.GandivaTrainerCallback(state, fast_exit=False, progress_interval=60)
    cbs: list[TrainerCallback] = [gandiva] + ([SuspendAt(gandiva, at)] if at is not None else [])
    gandiva.train(Trainer(model=model, args=args, train_dataset=Data(), callbacks=cbs))
    return model, gandiva


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)


@pytest.mark.parametrize("at", [2, 5, 8])
def test_suspend_saves_through_the_trainer_exits_75_and_resumes_exactly(tmp_path: Path, at: int) -> None:
    ref, first = run(tmp_path / "r", tmp_path / "ref")  # first run, no checkpoint: just starts
    assert first.resumed_from is None and first.job.step == len(ref.seen)
    state = tmp_path / "job"
    with pytest.raises(SystemExit) as exc:
        run(tmp_path / "s", state, at=at)
    assert exc.value.code == ExitCode.SUSPENDED
    saved = state / ghf.SUBDIR / f"checkpoint-{at + 1}"
    assert (saved / ghf.MARK).is_file() and (saved / "trainer_state.json").is_file()
    assert not (tmp_path / "s" / "out").exists() or not list((tmp_path / "s" / "out").glob("checkpoint-*"))
    prog = read_progress(state / "progress.json")
    assert prog is not None and prog.state == "suspended" and prog.step == at + 1
    resumed, gandiva = run(tmp_path / "s", state)
    assert gandiva.resumed_from == saved
    assert resumed.seen == ref.seen[at + 1 :]  # no batch skipped or repeated
    for a, b in zip(ref.net.parameters(), resumed.net.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("damage", ["no-marker", "garbage-marker", "truncated-model", "missing-optimizer"])
def test_an_incomplete_or_damaged_newest_checkpoint_is_skipped_with_one_line(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, _ = run(tmp_path / "r", tmp_path / "ref")
    state = tmp_path / "job"
    with pytest.raises(SystemExit):
        run(tmp_path / "s", state, at=2)  # checkpoint-3
    with pytest.raises(SystemExit):
        run(tmp_path / "s", state, at=5)  # checkpoint-6
    newest = state / ghf.SUBDIR / "checkpoint-6"
    if damage == "no-marker":
        (newest / ghf.MARK).unlink()
    elif damage == "garbage-marker":
        (newest / ghf.MARK).write_bytes(b"\x00{garbage")
    elif damage == "truncated-model":
        model = newest / "model.safetensors"
        model.write_bytes(model.read_bytes()[:100])
    else:
        (newest / "optimizer.pt").unlink()
    capsys.readouterr()
    resumed, gandiva = run(tmp_path / "s", state)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "checkpoint-6" in ln]
    assert len(lines) == 1 and ("incomplete" if damage == "no-marker" else "damaged") in lines[0], lines
    assert gandiva.resumed_from == state / ghf.SUBDIR / "checkpoint-3"
    assert resumed.seen == ref.seen[3:]
    for a, b in zip(ref.net.parameters(), resumed.net.parameters(), strict=True):
        assert torch.equal(a, b)
    if damage != "no-marker":
        assert (state / ghf.SUBDIR / "checkpoint-6.corrupt").is_dir()


def test_with_no_usable_checkpoint_training_starts_over_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, _ = run(tmp_path / "r", tmp_path / "ref")
    state = tmp_path / "job"
    with pytest.raises(SystemExit):
        run(tmp_path / "s", state, at=2)
    (state / ghf.SUBDIR / "checkpoint-3" / "trainer_state.json").write_text("{truncated")
    capsys.readouterr()
    resumed, gandiva = run(tmp_path / "s", state)
    assert "training starts from the beginning" in capsys.readouterr().err
    assert gandiva.resumed_from is None and resumed.seen == ref.seen
    for a, b in zip(ref.net.parameters(), resumed.net.parameters(), strict=True):
        assert torch.equal(a, b)
