"""A tiny Lightning or Hugging Face Trainer job for the multi-rank tests, run by gandiva-wrapper --nprocs 2 (gloo,
CPU). `--stop-rank R --stop-at S`: only rank R sets the suspend flag, at the start of its step S (0-based), as if
only it had seen the signal; every rank must still stop at the end of that step. Rank 0 prints
`final_params_sha256=<hex>` at the end. `--epochs E` (2 by default), `--sleep S`: seconds each step sleeps (time
to park the job at a step of one's choosing); neither changes the parameters of a step."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn

N, BATCH = 64, 8  # global batches of 8 (4 a rank): 8 steps an epoch, 16 in 2 epochs


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))


def data() -> torch.Tensor:
    return torch.randn(N, 4, generator=torch.Generator().manual_seed(1))


def lightning(stop_rank: int, stop_at: int, epochs: int, sleep: float) -> None:
    import lightning.pytorch as pl

    from job_wrapper.lightning import GandivaCallback, loader, trainer_args

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()
            self.x = data()

        def train_dataloader(self) -> Any:
            return loader((self.x, self.x.sum(1, keepdim=True)), batch_size=BATCH, seed=3)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class StopAt(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *a: Any) -> None:
            if trainer.global_rank == stop_rank and gandiva.job.step == stop_at:
                gandiva.job.request_suspend()
            time.sleep(sleep)

    model = Tiny()
    gandiva = GandivaCallback()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[gandiva, StopAt()], **trainer_args())
    gandiva.fit(trainer, model)
    if trainer.is_global_zero:
        print(f"final_params_sha256={params_sha256(model.net)} steps={gandiva.job.step}", flush=True)


def hf(stop_rank: int, stop_at: int, epochs: int, sleep: float) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from job_wrapper.hf import GandivaTrainerCallback

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        x = data()

        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    class StopAt(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if args.process_index == stop_rank and state.global_step == stop_at:
                gandiva.job.request_suspend()
            time.sleep(sleep)

    model = Tiny()
    out = os.environ["GANDIVA_STATE_DIR"] + "/out"
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH // 2,
                             num_train_epochs=epochs, learning_rate=0.05, seed=3, use_cpu=True, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False, dataloader_num_workers=0, ddp_find_unused_parameters=False)
    gandiva = GandivaTrainerCallback()
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[gandiva, StopAt()])
    gandiva.train(trainer)
    if trainer.is_world_process_zero():
        print(f"final_params_sha256={params_sha256(model.net)} steps={gandiva.job.step}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=["lightning", "hf"])
    ap.add_argument("--stop-rank", type=int, default=-1)
    ap.add_argument("--stop-at", type=int, default=-1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    (lightning if a.framework == "lightning" else hf)(a.stop_rank, a.stop_at, a.epochs, a.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
