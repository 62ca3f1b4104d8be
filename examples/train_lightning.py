"""A small deterministic PyTorch Lightning job (synthetic data, CPU) under slurm-gandiva.

Run it through the wrapper:  gandiva-wrapper --state-dir D -- python examples/train_lightning.py --epochs 2
(or by hand: `python examples/train_lightning.py`, checkpoints in ./gandiva-state). The lines gandiva needs are
marked `# gandiva`. At the end it prints `final_params_sha256=<hex>`: the same for an uninterrupted run and for
one suspended and resumed any number of times, with the same number of processes (the wrapper starts one per GPU;
they train with DDP over gloo).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from job_wrapper import exit_process
from job_wrapper.lightning import GandivaCallback, loader, trainer_args


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Regressor(pl.LightningModule):
    def __init__(self, samples: int, dim: int, batch_size: int, seed: int, sleep: float, workers: int) -> None:
        super().__init__()
        torch.manual_seed(seed)  # the same initial weights in every run
        self.net = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
        gen = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(samples, dim, generator=gen)
        self.y = torch.tanh(self.x @ torch.randn(dim, 1, generator=gen))
        self.batch_size, self.seed, self.sleep, self.workers = batch_size, seed, sleep, workers

    def train_dataloader(self) -> Any:
        # gandiva: a DataLoader whose position is in Lightning's checkpoint (exact mid-epoch resume)
        return loader((self.x, self.y), batch_size=self.batch_size, seed=self.seed, num_workers=self.workers,
                      persistent_workers=self.workers > 0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.sleep:
            time.sleep(self.sleep)  # stands for GPU time
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds per step, standing for GPU time")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    model = Regressor(args.samples, args.dim, args.batch_size, args.seed, args.sleep_per_step, args.workers)
    gandiva = GandivaCallback()  # gandiva
    trainer = pl.Trainer(accelerator="cpu", max_epochs=args.epochs, deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[gandiva], **trainer_args())  # gandiva: the callback; DDP over the wrapper's ranks
    gandiva.fit(trainer, model)  # gandiva: trainer.fit(model), resuming from the job's newest checkpoint
    if trainer.is_global_zero:
        print(f"final_params_sha256={params_sha256(model.net)}", flush=True)
        print(f"steps={gandiva.job.step} samples={gandiva.job.samples}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_process(main())  # gandiva: under the wrapper, no interpreter teardown (see exit_process)
