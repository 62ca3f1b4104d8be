"""A small deterministic Hugging Face Trainer job (a tiny GPT-2 built from a config in code, synthetic tokens,
CPU) under slurm-gandiva. Nothing is downloaded (HF_HUB_OFFLINE=1).

Run it through the wrapper:  gandiva-wrapper --state-dir D -- python examples/train_hf.py --epochs 2
(or by hand: `python examples/train_hf.py`, checkpoints in ./gandiva-state). The lines gandiva needs are marked
`# gandiva`. At the end it prints `final_params_sha256=<hex>`: the same for an uninterrupted run and for one
suspended and resumed any number of times, with the same number of processes (the wrapper starts one per GPU;
they train with DDP over gloo).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a tiny model made in code: never fetch anything

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from job_wrapper import exit_process
from job_wrapper.hf import GandivaTrainerCallback


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Synthetic token sequences: counting patterns the model can learn."""

    def __init__(self, samples: int, length: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (samples, 1), generator=gen)
        stride = torch.randint(1, 4, (samples, 1), generator=gen)
        self.ids = (start + stride * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Sleep(TrainerCallback):  # type: ignore[misc]
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)  # stands for GPU time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="hf-output", help="the Trainer's output_dir (the final model)")
    ap.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds per step, standing for GPU time")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config)
    targs = TrainingArguments(output_dir=args.output_dir, per_device_train_batch_size=args.batch_size,
                              num_train_epochs=args.epochs, learning_rate=1e-3, seed=args.seed, use_cpu=True,
                              report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
                              dataloader_num_workers=0, ddp_find_unused_parameters=False)
    gandiva = GandivaTrainerCallback()  # gandiva
    callbacks: list[TrainerCallback] = [gandiva]  # gandiva: the callback
    if args.sleep_per_step:
        callbacks.append(Sleep(args.sleep_per_step))
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(args.samples, 16, 64, args.seed + 1),
                      callbacks=callbacks)
    gandiva.train(trainer)  # gandiva: trainer.train(), resuming from the job's newest checkpoint
    if trainer.is_world_process_zero():
        print(f"final_params_sha256={params_sha256(model)}", flush=True)
        print(f"steps={gandiva.job.step} samples={gandiva.job.samples}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_process(main())  # gandiva: under the wrapper, no interpreter teardown (see exit_process)
