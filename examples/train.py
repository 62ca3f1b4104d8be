"""A small deterministic PyTorch training job (synthetic data; CPU, or the rank's GPU) using the job_wrapper API.

Run it through the wrapper:  gandiva-wrapper --state-dir D --nprocs 2 -- python examples/train.py --epochs 2
At the end rank 0 prints `final_params_sha256=<hex>`: the same for an uninterrupted run and for one that was
suspended and resumed any number of times with the same number of processes, and the same with
`--loader-workers N` (a DataLoader with N worker processes) as without. `--device auto` (the default) trains
on the rank's GPU where CUDA is there (the wrapper gives each rank one; NCCL then carries the gradients) and
on the CPU elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import job_wrapper


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def make_data(n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=gen)
    w = torch.randn(dim, 1, generator=gen)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=gen)
    return x, y, torch.arange(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="stop after this many mini-batches in all")
    ap.add_argument("--samples", type=int, default=512, help="dataset size")
    ap.add_argument("--batch-size", type=int, default=32, help="global mini-batch (split over the ranks)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: the rank's GPU where CUDA is available, else the CPU")
    ap.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds per step, standing for GPU time")
    ap.add_argument(
        "--sleep-per-sample",
        type=float,
        default=0.0,
        help="seconds per sample of this rank's share of the batch (GPU time that shrinks with more GPUs)",
    )
    ap.add_argument("--sample-log", default=None, help="append the sample ids each rank consumes (JSON lines)")
    ap.add_argument("--checkpoint-every", type=int, default=None, help="also checkpoint every N steps")
    ap.add_argument(
        "--loader-workers",
        type=int,
        default=None,
        help="train through job.loader() (a DataLoader with N worker processes) instead of job.batches()",
    )
    args = ap.parse_args(argv)

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (CUDA >= 10.2)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank, world = job_wrapper.init_distributed()  # NCCL with CUDA (and the rank's GPU set), gloo without
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model: nn.Module = nn.Sequential(
        nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(args.hidden, 1)
    ).to(device)
    if world > 1:
        # Bit-for-bit after a suspend at any world size (DDP's own all-reduce is exact for 2 ranks only).
        ids = [device.index] if cuda else None
        model = job_wrapper.ordered_allreduce(nn.parallel.DistributedDataParallel(model, device_ids=ids))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    data = make_data(args.samples, args.dim, args.seed + 1)
    log = open(args.sample_log, "a") if args.sample_log else None  # noqa: SIM115

    job = job_wrapper.Session(model, opt, scheduler=sched, seed=args.seed, checkpoint_every=args.checkpoint_every)
    if args.loader_workers is None:
        batches = job.batches(data, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.steps)
    else:  # the same batches in the same order, fetched by worker processes
        batches = job.loader(data, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.steps,
                             num_workers=args.loader_workers, persistent_workers=args.loader_workers > 0)
    for x, y, ids in batches:
        x = x + torch.from_numpy(np.random.standard_normal(x.shape).astype(np.float32)) * 0.01  # numpy RNG
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sched.step()
        if log is not None:
            rec = {"rank": rank, "epoch": job.epoch, "step": job.global_step, "ids": ids.tolist()}
            log.write(json.dumps(rec) + "\n")
            log.flush()
        pause = args.sleep_per_step + args.sleep_per_sample * len(ids)
        if pause > 0:
            time.sleep(pause)
        job.step()

    if rank == 0:
        print(f"final_params_sha256={params_sha256(getattr(model, 'module', model))}", flush=True)
        backend = torch.distributed.get_backend() if world > 1 else "none"
        print(f"steps={job.global_step} samples={job.samples_done} world_size={world} device={device} "
              f"backend={backend}", file=sys.stderr)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    job_wrapper.exit_process(main())  # gandiva: under the wrapper, no interpreter teardown (see exit_process)
