"""PyTorch Lightning under slurm-gandiva (`pip install 'slurm-gandiva[lightning]'`).

    gandiva = job_wrapper.lightning.GandivaCallback()
    trainer = L.Trainer(max_epochs=3, callbacks=[gandiva])
    gandiva.fit(trainer, model)              # trainer.fit(model, ckpt_path=<newest checkpoint of this job or None>)

and, for an exact data position across a suspend, the module's `train_dataloader()` returns
`job_wrapper.lightning.loader(dataset, batch_size=32)`.

The suspend signal only sets a flag. At the next `on_train_batch_end` every rank saves through
`trainer.save_checkpoint` (model, optimizers, schedulers, loops mid-epoch, callbacks, the loader's position),
rank 0 makes it durable and renames it over `lightning.ckpt` in the job's state directory (the previous one
becomes `lightning.prev.ckpt`), and the process exits 75 (`ExitCode.SUSPENDED`): the wrapper requeue-holds
the job. Lightning's own SLURM auto-requeue (its SIGUSR1 handler, which checkpoints inside the handler and
runs `scontrol requeue`) is switched off.

With several processes (the wrapper starts one per GPU) the Trainer takes `**trainer_args()`: DDP over the
wrapper's processes. The ranks agree at every batch end (an all-reduce MAX of the flag over gloo), so all stop
at the same batch. A damaged newest checkpoint is set aside: the job resumes from the one before, or starts
fresh, with one line.

On the controller's park request the ranks park at the same optimizer step instead (job_wrapper.park: the
LightningModule's and the optimizers' tensors to host memory, no CPU used, the same process goes on after the
unpark); a suspend signal while parked checkpoints from host memory and exits 75. The loader's workers wait.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
from torch.utils.data import DataLoader

from job_wrapper import checkpoint as ckpt
from job_wrapper._integration import Suspender, batch_samples
from job_wrapper.api import _tensors, rank_and_world_size
from job_wrapper.data import (
    GatheredTensors,
    IgnoreSignalInWorkers,
    ResumableSampler,
    SeededDataset,
    TensorsDataset,
    only,
)

CHECKPOINT = "lightning.ckpt"
PREVIOUS = "lightning.prev.ckpt"
FORMAT = 1


class WrapperEnvironment(TorchElasticEnvironment):
    """The processes gandiva-wrapper starts (RANK, WORLD_SIZE, MASTER_ADDR/PORT set; Lightning creates none).
    Each sees only its own GPU (the wrapper narrows CUDA_VISIBLE_DEVICES), so its device index is 0: the Trainer
    runs `devices=1, num_nodes=WORLD_SIZE` (`trainer_args()`)."""

    @staticmethod
    def detect() -> bool:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()


def trainer_args() -> dict[str, Any]:
    """`L.Trainer(**trainer_args(), ...)`: with several wrapper processes, DDP over them (`WrapperEnvironment`,
    `use_distributed_sampler=False`: `loader()` shards itself); with one, `devices=1`."""
    _, world = rank_and_world_size()
    if world <= 1:
        return {"devices": 1}
    return {"devices": 1, "num_nodes": world, "strategy": "ddp", "plugins": [WrapperEnvironment()],
            "use_distributed_sampler": False}


class _LoaderSampler(ResumableSampler):
    """A ResumableSampler whose position only the callback moves: Lightning's `set_epoch` calls (made after
    the epoch's `iter()`, and with the old epoch when a run resumed right after an epoch's last batch) are
    ignored, the position already knows its epoch. Its length is the whole epoch's, as Lightning expects of a
    stateful loader (it subtracts the batches its loop state counts as done)."""

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        """Batches of a whole epoch: Lightning counts the ones its restored loop state says are done."""
        return -(-self.epoch_len // self.batch_size)


class ResumableLoader(DataLoader[Any]):
    """A DataLoader over a `ResumableSampler`: Lightning saves its `state_dict()` (epoch, global samples
    consumed) in the checkpoint's loop state and loads it before the resumed epoch's `iter()`, so the run
    continues with the first unconsumed batch (and Lightning does not warn about an unresumable loader)."""

    gandiva_sampler: _LoaderSampler

    def state_dict(self) -> dict[str, int]:
        return self.gandiva_sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.gandiva_sampler.load_state_dict(state)


def loader(
    dataset: Any,
    batch_size: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    **dataloader_args: Any,
) -> ResumableLoader:
    """A resumable DataLoader: `Session.loader()`'s batches (the global batch of `batch_size` split over the
    ranks, `epoch_order(n, seed, epoch)`), with workers seeded per batch. Give the Trainer
    `use_distributed_sampler=False` on several processes: the sampler shards itself."""
    if rank is None or world_size is None:
        rank, world_size = rank_and_world_size()
    n = len(dataset[0]) if _tensors(dataset) else len(dataset)
    sampler = _LoaderSampler(n, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle,
                             drop_last=drop_last)
    if isinstance(dataset, torch.Tensor) or _tensors(dataset):
        dataset = TensorsDataset(dataset) if collate_fn is not None else GatheredTensors(dataset)
        collate_fn = collate_fn or only
    sig = Suspender.signal_number()
    dl = ResumableLoader(
        SeededDataset(dataset),
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        worker_init_fn=IgnoreSignalInWorkers(sig, dataloader_args.pop("worker_init_fn", None)),
        generator=torch.Generator().manual_seed(seed),
        **dataloader_args,
    )
    dl.gandiva_sampler = sampler
    return dl


def _loaders(iterables: Any) -> Iterable[Any]:
    if isinstance(iterables, dict):
        for v in iterables.values():
            yield from _loaders(v)
    elif isinstance(iterables, (list, tuple)):
        for v in iterables:
            yield from _loaders(v)
    else:
        yield iterables


class GandivaCallback(pl.Callback):
    """Suspend at a batch boundary on the controller's signal, checkpoint through Lightning, exit 75; resume
    from the job's newest checkpoint in `fit()`. Park in place on the controller's park request (the module's
    and optimizers' device state to host memory until the unpark). `state_dir`/`fast_exit`: as for `Session`."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, fast_exit: bool | None = None,
                 progress_interval: float | None = None) -> None:
        super().__init__()
        self.job = Suspender(state_dir, fast_exit=fast_exit, progress_interval=progress_interval)
        self.job.listen()  # now: a signal during start-up (model build, data) waits for the first batch's end
        self.resumed_from: Path | None = None
        self._loaders: list[ResumableLoader] = []
        self._rng: list[Any] | None = None
        self._stop = False  # the ranks agreed to stop at the next optimizer step
        self._park_seq = 0  # the park request the ranks agreed on, acted on at the next optimizer step

    @property
    def checkpoint_path(self) -> Path:
        return self.job.files.root / CHECKPOINT

    def resume_path(self) -> Path | None:
        """The newest readable checkpoint of this job, or None. The newest is checked (`torch.save`'s zip: every
        member's CRC); a damaged one is set aside as `<name>.corrupt` (rank 0) and the one before is taken, with
        one line, or none: training starts from the beginning, with one line."""
        damaged = False
        for path in (self.checkpoint_path, self.job.files.root / PREVIOUS):
            if not path.is_file():
                continue
            why = _damage(path)
            if why is None:
                return path
            damaged = True
            self.job.warn(f"{path} is damaged ({why}): set aside as {path.name}.corrupt", path=str(path))
            if self.job.rank == 0:  # the other ranks read the same file, and skip it too (or find it gone)
                with contextlib.suppress(OSError):
                    os.replace(path, path.with_name(path.name + ".corrupt"))
        if damaged:
            self.job.warn(f"no readable checkpoint in {self.job.files.root}: training starts from the beginning")
        return None

    def fit(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        """`trainer.fit(*args, **kwargs)`, resuming from this job's newest checkpoint when there is one (a first
        run just starts, or loads the `ckpt_path` you pass); exits 75 when suspended."""
        path = self.resume_path()
        if path is not None:
            kwargs["ckpt_path"] = str(path)
            self.resumed_from = path
        try:
            trainer.fit(*args, **kwargs)
        finally:
            self.job.stop_listening()
        self.job.event("training_done", step=self.job.step, samples=self.job.samples)
        self.job.close("done")

    # -- hooks ---------------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Ours is in place before Lightning registers its handlers, so it never takes our signal.
        self.job.listen()
        env = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            env.auto_requeue = False
            if trainer.is_global_zero:
                print("gandiva: Lightning's SLURM auto-requeue is off: the controller requeues this job "
                      "(Trainer(plugins=[SLURMEnvironment(auto_requeue=False)]) says so without this line)",
                      file=sys.stderr, flush=True)
            self.job.event("lightning_auto_requeue_off")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rng is not None:
            # Restored here, after the resumed epoch's iter() (which an uninterrupted run did at the epoch's
            # start): the global RNG continues as it would have after the checkpointed batch.
            if len(self._rng) == trainer.world_size and trainer.global_rank < len(self._rng):
                ckpt.restore_rng(self._rng[trainer.global_rank])
            self._rng = None
        self._loaders = [dl for dl in _loaders(trainer.train_dataloader) if isinstance(dl, ResumableLoader)]
        if self._loaders and trainer.max_epochs is not None and trainer.max_epochs > 0:
            s = self._loaders[0].gandiva_sampler
            total = s.epoch_len * trainer.max_epochs
            if trainer.max_steps > 0:
                total = min(total, trainer.max_steps * s.batch_size)
            self.job.total_samples = total
        self.job.epoch = trainer.current_epoch
        self.job.connect_ranks()  # the strategy initialised torch.distributed in its setup
        self.job.start_progress()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._loaders:
            n = self._loaders[0].gandiva_sampler.next_batch_samples()
            for dl in self._loaders:
                dl.gandiva_sampler.advance()
        else:
            n = batch_samples(batch) * trainer.world_size
        self.job.batch_done(n)
        self.job.epoch = trainer.current_epoch
        # Every rank stops (or parks) at the same batch (anyone's flag or request), and only where the optimizer
        # stepped: accumulated gradients are not part of a checkpoint (nor of a suspend while parked).
        stop, seq = self.job.boundary()
        self._stop = self._stop or stop
        self._park_seq = max(self._park_seq, seq)
        if not ((batch_idx + 1) % trainer.accumulate_grad_batches == 0
                or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch):
            return
        if self._park_seq and not self._stop:
            seq, self._park_seq = self._park_seq, 0
            # The device state: the module (the strategy's DDP wrapper shares its tensors) and its optimizers.
            self._stop = not self.job.park(seq, [pl_module, *trainer.optimizers])
        if self._stop:
            self._suspend(trainer)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        rng = ckpt.capture_rng()
        rngs: list[Any] = [rng]
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            rngs = [None] * trainer.world_size
            torch.distributed.all_gather_object(rngs, rng)
        checkpoint["gandiva"] = {"format": FORMAT, "job": self.job.identity, "step": self.job.step,
                                 "samples": self.job.samples, "rng": rngs, "world_size": trainer.world_size}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        st = checkpoint.get("gandiva")
        if not isinstance(st, dict):
            if self.resumed_from is not None:
                self.job.fail(f"{self.resumed_from} was not written by gandiva's callback: delete it to start over")
            return  # a checkpoint of the user's own (a first run's ckpt_path)
        try:
            ckpt.check_identity(st, self.job.identity, str(self.resumed_from), self.job.files.root)
        except ckpt.CheckpointError as exc:
            self.job.fail(str(exc))
        self.job.step, self.job.samples = int(st["step"]), int(st["samples"])
        self._rng = st["rng"] if int(st["world_size"]) == trainer.world_size else None
        self.job.event("resumed", path=str(self.resumed_from), step=self.job.step,
                       epoch=int(checkpoint.get("epoch", 0)), world_size=trainer.world_size)

    # -- the suspend ---------------------------------------------------------------------------------

    def _suspend(self, trainer: pl.Trainer) -> None:
        self.job.event("stop_requested", step=self.job.step)
        tmp = self.job.files.root / f"{CHECKPOINT}.tmp.{os.getpid()}"
        t0 = self.job._clock()
        trainer.save_checkpoint(tmp)  # every rank; the strategy writes on rank 0
        if trainer.is_global_zero:
            self.job.fsync_replace(tmp, self.checkpoint_path, self.job.files.root / PREVIOUS)
            self.job.event("checkpoint", reason="suspend", step=self.job.step,
                           bytes=self.checkpoint_path.stat().st_size, seconds=round(self.job._clock() - t0, 6),
                           path=str(self.checkpoint_path))
        self.job.exit_suspended()


def _damage(path: Path) -> str | None:
    """Why `path` is not a readable `torch.save` checkpoint (a zip: truncated, garbage, a bad CRC), or None."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                return f"bad CRC in {bad}"
            if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()):
                return "no data.pkl: not a torch.save file"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
