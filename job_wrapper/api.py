"""The training-loop API: three lines in a user's loop.

    job = job_wrapper.Session(model, optimizer, scheduler=sched, seed=0)   # resumes if a checkpoint exists
    for batch in job.batches(dataset, batch_size=64, epochs=3):            # deterministic, any world size
        ...forward / backward / optimizer.step()...
        job.step()                                                          # boundary: suspend if signalled

The signal handler only sets a flag; `step()` reads it (one attribute) at every mini-batch boundary. When
set, the state is checkpointed by rank 0 and every rank exits with ExitCode.SUSPENDED.

Several ranks must stop at the same step (a rank that stops early leaves the others blocked in DDP's
all-reduce). Rank 0 decides: at the boundary after step s where it sees the flag, it publishes stop-at
s + 1 in a small control file and signals the other ranks. No other rank can have finished step s + 1 yet
(that needs rank 0's share of its all-reduce), and the signal is pending before rank 0 contributes, so
every rank reads the control file no later than its boundary s + 1.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from job_wrapper import checkpoint as ckpt
from job_wrapper.agree import StopAgreement
from job_wrapper.launcher import FAST_EXIT_ENV
from job_wrapper.order import epoch_order, shard
from job_wrapper.park import ParkControl
from job_wrapper.progress import Counters, ProgressReporter, append_event
from slurm_gandiva.requeue.contract import (
    PARK_SIGNAL,
    PROGRESS_INTERVAL_ENV,
    SIGNAL_ENV,
    STATE_DIR_ENV,
    ExitCode,
    StateDirError,
    ensure_state_dir,
    job_files,
    signal_from_name,
)

if TYPE_CHECKING:
    from job_wrapper.data import ResumableSampler

FORMAT = 1
PAUSE_ENV = "GANDIVA_TEST_CHECKPOINT_PAUSE"  # test hook: seconds to stall half-way through a checkpoint write
_NEVER = 1 << 62


class Stateful(Protocol):
    """Anything with state_dict / load_state_dict (model, optimizer, LR scheduler, GradScaler, ...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def rank_and_world_size() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from the environment the wrapper (or torchrun) sets; (0, 1) when unset."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


LOCAL_STATE_DIR = "gandiva-state"  # a script run by hand, outside Slurm and the wrapper, checkpoints here


def _local_state_dir() -> Path:
    """Where a script run without the wrapper keeps its checkpoints: ./gandiva-state outside Slurm (said on
    stderr once, so that a second run resuming from it is no surprise). Inside a Slurm job the wrapper always
    names the directory: without one, the job ends with one line instead of writing into its working directory."""
    if os.environ.get("SLURM_JOB_ID"):
        print(f"gandiva: no state directory: submit with `gandiva sbatch` or set {STATE_DIR_ENV}", file=sys.stderr,
              flush=True)
        raise SystemExit(int(ExitCode.FAILED))
    local = Path.cwd() / LOCAL_STATE_DIR
    if rank_and_world_size()[0] == 0:
        print(f"gandiva: not under gandiva-wrapper: plain training, checkpoints in {local} "
              f"(a second run resumes from them; delete it to start over)", file=sys.stderr, flush=True)
    return local


DIST_BACKEND_ENV = "GANDIVA_DIST_BACKEND"


def default_backend(env: Mapping[str, str] | None = None) -> str:
    """The torch.distributed backend for this process: $GANDIVA_DIST_BACKEND when set, else NCCL where CUDA
    is available, else gloo."""
    chosen = (os.environ if env is None else env).get(DIST_BACKEND_ENV, "").strip()
    if chosen:
        return chosen
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: str | None = None) -> tuple[int, int]:
    """Initialise torch.distributed from the wrapper's environment when WORLD_SIZE > 1; returns (rank, size).

    `backend`: default `default_backend()` (NCCL with CUDA, gloo without; $GANDIVA_DIST_BACKEND overrides).
    With NCCL the rank's device is set first: its one visible GPU under the wrapper (CUDA_VISIBLE_DEVICES per
    rank), GPU LOCAL_RANK where a launcher shows each rank all of the node's GPUs.
    """
    rank, world = rank_and_world_size()
    if world > 1:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            chosen = backend or default_backend()
            if chosen == "nccl" and torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            dist.init_process_group(chosen, init_method="env://", rank=rank, world_size=world)
    return rank, world


def ordered_allreduce(ddp_model: Any) -> Any:
    """Make a DistributedDataParallel model's gradient average independent of its bucket layout; returns it.

    DDP re-lays its gradient buckets after the first step of every run (in the order gradients became
    ready), and a ring all-reduce adds each element's parts in an order that follows the layout. With three
    or more ranks float addition then rounds differently, so a run resumed from a checkpoint drifts from the
    uninterrupted one in the last bits (two ranks are exact: a + b == b + a). This hook gathers every
    rank's bucket and adds them in rank order: the result depends on the gradients alone, and a resumed run
    is bit-for-bit the uninterrupted one at any world size. It costs an all-gather (world-size times the
    bytes of an all-reduce): meant for runs that must be exactly reproducible, and for tests.
    """
    import torch
    import torch.distributed as dist

    def hook(state: object, bucket: Any) -> Any:
        grad = bucket.buffer()
        world = dist.get_world_size()
        parts = [torch.empty_like(grad) for _ in range(world)]
        fut = dist.all_gather(parts, grad, async_op=True).get_future()

        def summed(_: Any) -> Any:
            total = parts[0].clone()
            for part in parts[1:]:
                total += part
            return total.div_(world)

        return fut.then(summed)

    hook.__annotations__ = {}  # DDP checks them at run time, where `from __future__ import annotations` made strings
    ddp_model.register_comm_hook(None, hook)
    return ddp_model


def exit_suspended(*, fast: bool) -> NoReturn:
    """End the training process with the suspended exit code; `fast` (under the wrapper) skips torch's
    interpreter teardown with os._exit, after flushing stdout and stderr."""
    _leave(int(ExitCode.SUSPENDED), fast=fast)


def exit_process(code: int = 0) -> NoReturn:
    """End a training script with `code`: call it last (`exit_process(main())`). Under the wrapper it skips
    the interpreter's teardown, as a suspend does: there torch.distributed's gloo threads can abort a rank
    after training ended ("terminate called without an active exception"; pytorch/pytorch#65513, #190489),
    and the job would end FAILED. Nothing runs after it, atexit handlers included; stdout and stderr are
    flushed."""
    _leave(code, fast=os.environ.get(FAST_EXIT_ENV) == "1")


def _leave(code: int, *, fast: bool) -> NoReturn:
    if fast:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    raise SystemExit(code)


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)  # DDP / DataParallel keep the real model in .module


def _tensors(dataset: Any) -> bool:
    """Whether `dataset` is a tuple/list of tensors (indexed together, sample i = the i-th row of each)."""
    import torch

    return isinstance(dataset, (tuple, list)) and bool(dataset) and all(isinstance(t, torch.Tensor) for t in dataset)


def _fetcher(dataset: Any) -> Callable[[Sequence[int]], Any]:
    """How to fetch samples by index from a tensor, a tuple/list of tensors, or a map-style dataset."""
    import torch

    def index(idx: Sequence[int]) -> Any:
        return torch.as_tensor(idx, dtype=torch.long)

    if isinstance(dataset, torch.Tensor):
        return lambda idx: dataset[index(idx)]
    if _tensors(dataset):
        kind = type(dataset)
        return lambda idx: kind(t[ix] for ix in (index(idx),) for t in dataset)
    from torch.utils.data import default_collate

    return lambda idx: default_collate([dataset[i] for i in idx])


def _stop_workers(batches: Any) -> None:
    """End a DataLoader iterator's worker processes (its own clean-up, which otherwise runs when collected)."""
    shutdown = getattr(batches, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()


def _len(dataset: Any) -> int:
    if _tensors(dataset):
        return len(dataset[0])
    return len(dataset)


class Session:
    """Checkpoint/resume and suspend-on-signal for one training process (one rank).

    Construct it after the model (DDP-wrapped or not), optimizer and LR scheduler exist: it restores them
    from the newest complete checkpoint, or seeds the RNGs with `seed` (+ rank) on a fresh start.
    `checkpoint_every` adds a periodic checkpoint every that many steps (bounds the loss on a crash).
    `fast_exit` (default: on under gandiva-wrapper) ends a suspended process with os._exit after flushing
    stdout/stderr: torch's interpreter teardown takes seconds, during which the GPUs stay allocated.
    `finally` blocks and atexit handlers then do not run; without it the suspend raises SystemExit(75).
    """

    def __init__(
        self,
        model: Stateful,
        optimizer: Stateful | None = None,
        *,
        scheduler: Stateful | None = None,
        seed: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
        extra: Mapping[str, Stateful] | None = None,
        checkpoint_every: int | None = None,
        progress_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        install_signal_handler: bool = True,
        fast_exit: bool | None = None,
        park_request_owner: int = 0,
    ) -> None:
        self.rank, self.world_size = rank_and_world_size()
        self.files = job_files(state_dir or os.environ.get(STATE_DIR_ENV) or _local_state_dir())
        try:
            if not self.files.root.parent.exists():  # outside the wrapper (which makes it): a new tree
                self.files.root.parent.mkdir(parents=True, exist_ok=True)
            ensure_state_dir(self.files.root)  # 0700; refused: planted, writable by others, unwritable
        except (StateDirError, OSError) as exc:
            why = exc if isinstance(exc, StateDirError) else f"cannot create {self.files.root}: {exc.strerror}"
            print(f"gandiva: {why}", file=sys.stderr, flush=True)
            raise SystemExit(int(ExitCode.FAILED)) from None
        self.identity = ckpt.job_identity()  # the job the checkpoints belong to (None outside Slurm)
        self._saved_dataset_size: int | None = None  # from the checkpoint resumed, when it recorded one
        self._dataset_size: int | None = None
        self.seed = seed
        self._objects: dict[str, Stateful] = {"model": model}
        if optimizer is not None:
            self._objects["optimizer"] = optimizer
        if scheduler is not None:
            self._objects["scheduler"] = scheduler
        for name, obj in (extra or {}).items():
            if name in self._objects:
                raise ValueError(f"extra state name {name!r} is reserved: use another name")
            self._objects[name] = obj
        self._clock = clock
        # Counters, restored from the checkpoint. position = global samples consumed in the current epoch.
        self.global_step = 0
        self.epoch = 0
        self.samples_done = 0
        self.resumed_from: Path | None = None
        self.position = 0
        self._epoch_len = _NEVER
        self._pending = 0  # samples in the mini-batch that batches() / loader() last yielded
        self._in_batches = False
        self._sampler: ResumableSampler | None = None  # bound by sampler(): step() advances by its batches
        self._on_close: list[Callable[[], None]] = []
        self._total_samples: int | None = None
        self._checkpoint_every = checkpoint_every or 0
        self._next_periodic = checkpoint_every or _NEVER
        self._signalled = False  # set by the signal handler; the only thing it does
        self._agreement: StopAgreement | None = None  # the ranks' stop agreement (several ranks only)
        self._closed = False
        self._fast_exit = os.environ.get(FAST_EXIT_ENV) == "1" if fast_exit is None else fast_exit
        self.signal = signal_from_name(os.environ.get(SIGNAL_ENV))
        # Park/unpark on the controller's request (contract: park-request.json owned by `park_request_owner`,
        # root; the park signal wakes us). The owner is an argument, never the environment.
        self._parking = ParkControl(self.files, self.rank, owner=park_request_owner)
        if install_signal_handler:
            self.install_signal_handler()
        if self.world_size > 1:
            self._connect_peers()
        self._restore()
        interval = progress_interval
        if interval is None:
            interval = float(os.environ.get(PROGRESS_INTERVAL_ENV, "5"))
        self._progress: ProgressReporter | None = None
        if self.rank == 0:
            self._progress = ProgressReporter(
                self.files.progress, self._counters, world_size=self.world_size, interval=interval, clock=clock
            )
            self._progress.start()

    # -- signal -------------------------------------------------------------------------------------

    def install_signal_handler(self) -> None:
        """Catch the suspend signal (flag only), then unblock it: the wrapper starts us with it blocked so
        that a signal sent during start-up waits for this handler instead of killing the process."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("create the Session in the main thread: only it can receive signals")
        signal.signal(self.signal, self._on_signal)
        signal.signal(PARK_SIGNAL, self._parking.on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {self.signal, PARK_SIGNAL})
        # A loop that never reaches the end of batches() still stops listening before interpreter teardown.
        atexit.register(self._stop_listening)

    def _stop_listening(self) -> None:
        """Ignore the suspend signal from now on (training is over: done, suspended or failed).

        At interpreter teardown (seconds with torch) Python restores the signal's default action, which
        kills the process: a late or repeated signal would turn a finished run into a failed one. An
        ignored signal survives that (Python leaves SIG_IGN alone).
        """
        atexit.unregister(self._stop_listening)
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(self.signal) == self._on_signal:
            signal.signal(self.signal, signal.SIG_IGN)
        if signal.getsignal(PARK_SIGNAL) == self._parking.on_signal:
            signal.signal(PARK_SIGNAL, signal.SIG_DFL)  # ignored by default

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True

    def request_suspend(self) -> None:
        """Ask for a suspend at the next boundary, as the signal does."""
        self._signalled = True

    # -- the loop -----------------------------------------------------------------------------------

    def batches(
        self,
        dataset: Any,
        batch_size: int,
        *,
        epochs: int = 1,
        max_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> Iterator[Any]:
        """This rank's part of each global mini-batch of `batch_size` samples, from the resumed position on.

        The global order depends only on (seed, epoch), and the position is counted in global samples,
        so every sample is seen exactly once per epoch even when the world size changes between runs.
        If the loop body does not call step(), the iterator calls it after the body.
        """
        n = self._bind_data(_len(dataset), batch_size, epochs, max_steps, drop_last)
        epoch_len = self._epoch_len
        fetch = _fetcher(dataset)
        self._in_batches = True
        if self._signalled:
            self._signal_boundary()  # a signal before the first mini-batch
        while self.epoch < epochs and (max_steps is None or self.global_step < max_steps):
            epoch = self.epoch
            order = epoch_order(n, self.seed, epoch) if shuffle else list(range(n))
            while self.epoch == epoch and (max_steps is None or self.global_step < max_steps):
                start = self.position
                gb = order[start : min(start + batch_size, epoch_len)]
                self._pending = len(gb)
                step_before = self.global_step
                yield fetch(gb if self.world_size == 1 else shard(gb, self.rank, self.world_size))
                if self.global_step == step_before:
                    self.step()
        self._in_batches = False
        self._finish()

    def _bind_data(self, n: int, batch_size: int, epochs: int | None, max_steps: int | None, drop_last: bool) -> int:
        """Check the dataset against the checkpoint and set the epoch length and the total for progress."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self._saved_dataset_size is not None and n != self._saved_dataset_size:
            self._fail(
                f"the dataset has {n} samples but {self.resumed_from} was taken over {self._saved_dataset_size}: "
                "resuming would skip or repeat samples; restore the dataset, or delete the checkpoint files "
                f"in {self.files.root} to start from scratch"
            )
        self._dataset_size = n
        epoch_len = n - n % batch_size if drop_last else n
        if epoch_len == 0:
            raise ValueError(f"dataset of {n} samples gives no batch of {batch_size}")
        self._epoch_len = epoch_len
        total = epochs * epoch_len if epochs is not None else None
        if max_steps is not None:
            steps_per_epoch = -(-epoch_len // batch_size)
            full, rest = divmod(max_steps, steps_per_epoch)
            by_steps = full * epoch_len + min(rest * batch_size, epoch_len)
            total = by_steps if total is None else min(total, by_steps)
        self._total_samples = total
        return n

    def sampler(
        self,
        dataset: Any,
        batch_size: int,
        *,
        epochs: int | None = None,
        max_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> ResumableSampler:
        """A batch sampler for your own `DataLoader(dataset, batch_sampler=job.sampler(dataset, 64))`.

        It yields this rank's share of each global mini-batch of `batch_size` samples, in batches()'s order,
        from the position of the checkpoint resumed. Each step() marks one of its batches consumed (the
        position in the checkpoint counts them, never what the workers prefetched), so call step() once per
        batch; `for epoch in range(job.epoch, epochs): for batch in loader: ...` then resumes mid-epoch.
        `dataset` may be its size. `epochs`/`max_steps` only tell the progress report the total work.
        For bit-for-bit resumes give the DataLoader `generator=torch.Generator()` (without one it draws its
        workers' seed from torch's global RNG at every epoch's start, and a resumed run draws once more),
        and wrap a dataset with random transforms in `SeededDataset`; loader() does both.
        """
        from job_wrapper.data import ResumableSampler

        n = dataset if isinstance(dataset, int) else _len(dataset)
        self._bind_data(n, batch_size, epochs, max_steps, drop_last)
        self._sampler = ResumableSampler(n, batch_size, seed=self.seed, rank=self.rank, world_size=self.world_size,
                                         shuffle=shuffle, drop_last=drop_last, cursor=self)
        return self._sampler

    def loader(
        self,
        dataset: Any,
        batch_size: int,
        *,
        epochs: int = 1,
        max_steps: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        **dataloader_args: Any,
    ) -> Iterator[Any]:
        """batches() through a `torch.utils.data.DataLoader`: worker processes, pinned memory, prefetching.

        The same global mini-batches in the same order as batches() (the same parameters, for a dataset
        without randomness), from the resumed position on, over `epochs` (or `max_steps`); step() after the
        body as in batches(). In the workers, the RNGs are seeded per batch (`data.SeededDataset`), so random
        transforms are reproducible across a suspend too. Other keyword arguments go to the DataLoader.
        """
        import torch
        from torch.utils.data import DataLoader

        from job_wrapper.data import GatheredTensors, IgnoreSignalInWorkers, SeededDataset, TensorsDataset, only

        sampler = self.sampler(dataset, batch_size, epochs=epochs, max_steps=max_steps, shuffle=shuffle,
                               drop_last=drop_last)
        if isinstance(dataset, torch.Tensor) or _tensors(dataset):
            # Without a collate_fn, each batch is fetched as batches() fetches it (and comes out alike).
            dataset = TensorsDataset(dataset) if collate_fn is not None else GatheredTensors(dataset)
            collate_fn = collate_fn or only
        last = sampler.epoch_len % batch_size
        if collate_fn is None and 0 < last < self.world_size:
            raise ValueError(f"the epoch's last global batch has {last} samples for {self.world_size} ranks: "
                             "some rank would get none, which the default collate cannot batch; pass drop_last=True")
        extra = dict(dataloader_args)
        if num_workers > 0:
            extra["persistent_workers"] = persistent_workers
            if prefetch_factor is not None:
                extra["prefetch_factor"] = prefetch_factor
        data = DataLoader(
            SeededDataset(dataset),
            batch_sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            worker_init_fn=IgnoreSignalInWorkers(self.signal, worker_init_fn),
            # The workers' base seed is drawn from this generator: from the process's torch RNG otherwise,
            # which would then differ after a resume (one more draw at the resumed epoch's start).
            generator=torch.Generator().manual_seed(self.seed),
            **extra,
        )
        return self._iterate(data, epochs, max_steps)

    def _iterate(self, data: Any, epochs: int, max_steps: int | None) -> Iterator[Any]:
        sampler = self._sampler
        assert sampler is not None
        batches: Iterator[Any] | None = None
        # Suspended, failed or done: end the workers now, not when the iterator is collected (a fast exit
        # skips that, leaving them to notice a dead parent seconds later).
        self._on_close.append(lambda: _stop_workers(batches))
        self._in_batches = True
        if self._signalled:
            self._signal_boundary()
        while self.epoch < epochs and (max_steps is None or self.global_step < max_steps):
            batches = iter(data)  # starts at the consumed position; the workers then run ahead of it
            for batch in batches:
                self._pending = sampler.next_batch_samples()
                step_before = self.global_step
                yield batch
                if self.global_step == step_before:
                    self.step()
                if max_steps is not None and self.global_step >= max_steps:
                    break
        self._in_batches = False
        self._finish()

    def step(self, samples: int | None = None) -> None:
        """Mark a mini-batch boundary; suspends (checkpoint + exit) here when the signal has come.

        `samples`: for loops that use neither batches()/loader() nor sampler(), the samples this mini-batch
        consumed over all ranks. Otherwise it is ignored: the position always advances by the global batch
        consumed (a rank's own len(batch) would break exactly-once on several ranks).
        """
        if self._in_batches:
            n = self._pending
        elif self._sampler is not None:
            n = self._sampler.next_batch_samples()
        else:
            n = self._pending if samples is None else samples
        self.global_step += 1
        self.samples_done += n
        self.position += n
        if self.position >= self._epoch_len or self.global_step >= self._next_periodic:
            self._roll()
        if self._agreement is not None:
            self._agreed_boundary()
        elif self._signalled:
            self._suspend()
        elif self._parking.signalled:
            seq = self._parking.wanted(self.global_step)
            if seq:
                self._park(seq)

    def _roll(self) -> None:
        if self.position >= self._epoch_len:
            self.epoch += 1
            self.position = 0
        if self.global_step >= self._next_periodic:
            self._next_periodic = self.global_step + self._checkpoint_every
            self.save_checkpoint(reason="periodic")

    def _counters(self) -> Counters:
        return Counters(self.global_step, self.epoch, self.samples_done, self._total_samples)

    # -- stopping -----------------------------------------------------------------------------------

    def _connect_peers(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                "WORLD_SIZE > 1 but torch.distributed is not initialised: call job_wrapper.init_distributed() "
                "before wrapping the model in DDP"
            )
        self._agreement = StopAgreement.connect()

    def _signal_boundary(self) -> None:
        """At a mini-batch boundary with the signal seen: one process suspends here; several ranks go on to
        the boundary where they agree (`_agreed_boundary`)."""
        if self._agreement is None:
            self._suspend()

    def _agreed_boundary(self) -> None:
        """Every rank at every boundary: suspend here when the ranks agree to (`StopAgreement`), so all stop
        at the same step wherever and whenever the signal reached each of them."""
        assert self._agreement is not None
        stop, park_seq = self._agreement.decide(self._signalled, self._parking.wanted(self.global_step))
        if stop:
            if self.rank == 0:
                append_event(self.files.events, "stop_requested", step=self.global_step)
            self._suspend()
        elif park_seq > self._parking.handled:
            self._park(park_seq)

    def _park(self, seq: int) -> None:
        """Park here (every rank at the same boundary): see job_wrapper.park and the contract. Returns once
        unparked; a suspend signal while parked checkpoints from host memory and exits."""
        if not self._parking.park_ranks(seq, self.global_step, self._objects.values(), agreement=self._agreement,
                                        progress=self._progress, suspend_requested=lambda: self._signalled):
            if self.rank == 0:
                append_event(self.files.events, "stop_requested", step=self.global_step)
            self._suspend()

    def _gather_rng(self) -> list[Any]:
        rng = ckpt.capture_rng()
        if self.world_size == 1:
            return [rng]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, rng)
        return out

    def state(self, rngs: list[Any] | None = None) -> dict[str, Any]:
        """The checkpoint content (world-size independent apart from the per-rank RNG list)."""
        st: dict[str, Any] = {
            "format": FORMAT,
            "step": self.global_step,
            "epoch": self.epoch,
            "position": self.position,
            "samples": self.samples_done,
            "seed": self.seed,
            "world_size": self.world_size,
            "rng": rngs if rngs is not None else [ckpt.capture_rng()],
            "job": self.identity,
            "dataset_size": self._dataset_size if self._dataset_size is not None else self._saved_dataset_size,
        }
        for name, obj in self._objects.items():
            st[name] = _unwrap(obj).state_dict() if name == "model" else obj.state_dict()
        return st

    def save_checkpoint(self, reason: str = "manual") -> ckpt.SavedCheckpoint | None:
        """Checkpoint now (every rank must call it at the same step); returns what rank 0 wrote."""
        rngs = self._gather_rng()
        if self.rank != 0:
            return None
        pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
        events = self.files.events

        def on_pause() -> None:
            append_event(events, "checkpoint_paused", step=self.global_step)

        try:
            saved = ckpt.save(self.files, self.state(rngs), clock=self._clock, pause_s=pause, on_pause=on_pause)
        except ckpt.CheckpointError as exc:
            self._fail(str(exc))
        append_event(
            events,
            "checkpoint",
            reason=reason,
            step=self.global_step,
            bytes=saved.nbytes,
            seconds=round(saved.seconds, 6),
            path=str(saved.path),
        )
        return saved

    def _suspend(self) -> None:
        self.save_checkpoint(reason="suspend")
        self._close("suspended")
        exit_suspended(fast=self._fast_exit)

    def finish(self) -> None:
        """Training is done (for loops of your own; batches() and loader() call it at their end): the final
        progress report says done and the signal is ignored from now on."""
        if not self._closed:
            self._finish()

    def _finish(self) -> None:
        if self.rank == 0:
            append_event(self.files.events, "training_done", step=self.global_step, samples=self.samples_done)
        self._close("done")

    def _fail(self, message: str) -> NoReturn:
        if self.rank == 0 or self.world_size == 1:
            append_event(self.files.events, "error", message=message)
        print(f"gandiva: {message}", file=sys.stderr, flush=True)
        self._close("failed")
        raise SystemExit(int(ExitCode.FAILED))

    def _close(self, state: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_listening()
        for hook in self._on_close:
            hook()
        if getattr(self, "_progress", None) is not None:
            assert self._progress is not None
            self._progress.stop(state)
        if self._agreement is not None:
            self._agreement.close()
            self._agreement = None  # its group is gone; connecting again makes a new one

    # -- resuming -----------------------------------------------------------------------------------

    def _restore(self) -> None:
        try:
            loaded = ckpt.load(self.files)
        except ckpt.CheckpointError as exc:
            self._fail(str(exc))
        if loaded is None:
            self._seed_rngs()
            if self.rank == 0:
                append_event(self.files.events, "fresh_start", world_size=self.world_size)
            return
        st = loaded.state
        try:
            ckpt.check_identity(st, self.identity, str(loaded.path), self.files.root)
        except ckpt.CheckpointError as exc:
            self._fail(str(exc))
        if st.get("format") != FORMAT:
            self._fail(f"{loaded.path} has checkpoint format {st.get('format')!r}, expected {FORMAT}")
        if self.rank == 0 and loaded.fallback_reason:
            print(f"gandiva: warning: {loaded.fallback_reason}; resuming from {loaded.path.name}", file=sys.stderr)
            append_event(self.files.events, "checkpoint_fallback", reason=loaded.fallback_reason,
                         path=str(loaded.path))
            if loaded.path != self.files.checkpoint and self.files.checkpoint.exists():
                # Set the bad file aside: the next save must not rotate it over the good previous one.
                os.replace(self.files.checkpoint, self.files.root / (self.files.checkpoint.name + ".corrupt"))
        for name, obj in self._objects.items():
            if name not in st:
                self._fail(f"{loaded.path} has no {name!r} state: it was written by another program")
            try:
                (_unwrap(obj) if name == "model" else obj).load_state_dict(st[name])
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
                detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
                self._fail(
                    f"{loaded.path} does not fit this {name} ({detail[:300]}): it was written for another "
                    f"{name} shape; restore the matching code, or delete the checkpoint files in "
                    f"{self.files.root} to start from scratch"
                )
        size = st.get("dataset_size")
        self._saved_dataset_size = int(size) if isinstance(size, int) and not isinstance(size, bool) else None
        self.global_step = int(st["step"])
        self.epoch = int(st["epoch"])
        self.position = int(st["position"])
        self.samples_done = int(st["samples"])
        self.seed = int(st["seed"])
        rngs = st["rng"]
        if self.rank < len(rngs) and int(st["world_size"]) == self.world_size:
            ckpt.restore_rng(rngs[self.rank])
        else:  # another world size: streams cannot be carried over, derive fresh ones
            self._seed_rngs(salt=self.global_step)
        if self._checkpoint_every:
            self._next_periodic = self.global_step + self._checkpoint_every
        self.resumed_from = loaded.path
        if self.rank == 0:
            append_event(self.files.events, "resumed", path=str(loaded.path), step=self.global_step,
                         epoch=self.epoch, position=self.position, world_size=self.world_size,
                         saved_world_size=int(st["world_size"]))

    def _seed_rngs(self, salt: int = 0) -> None:
        import torch

        s = (self.seed * 1_000_003 + self.rank * 7919 + salt) % (1 << 31)
        random.seed(s)
        torch.manual_seed(s)
        try:
            import numpy as np
        except ImportError:
            return
        np.random.seed(s)
