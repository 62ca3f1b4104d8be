"""Your own DataLoader under the wrapper: a resumable, deterministic distributed batch sampler.

`ResumableSampler` is a batch sampler for `torch.utils.data.DataLoader(dataset, batch_sampler=...)`. It
yields this rank's share of each global mini-batch of the epoch, in the order `Session.batches()` uses
(`epoch_order`, `shard`), starting at a position counted in global samples. The position is advanced by
whoever consumes the batches (`Session.step()`, or `advance()` when used alone), never by iterating: a
DataLoader's workers prefetch batches ahead of the training loop, and a prefetched batch is not consumed.
`iter()` reads the position when the DataLoader starts an epoch, so the next `for batch in loader` after a
resume (on any world size) continues with the first unconsumed global batch.

`SeededDataset` seeds python, numpy and torch's RNGs inside a worker before each batch from
(seed, epoch, position, rank) of that batch, so random transforms give the same samples whichever worker
fetches the batch, however many workers there are, and across a suspend.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch.utils.data import Dataset, Sampler, get_worker_info

from job_wrapper.order import epoch_order, shard


def epoch_length(size: int, batch_size: int, drop_last: bool) -> int:
    """Samples an epoch consumes: all of them, or without the last partial global batch."""
    return size - size % batch_size if drop_last else size


def batch_seed(seed: int, epoch: int, position: int, rank: int) -> int:
    """The RNG seed of one rank's share of the global batch at `position` of `epoch` (stable across runs)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{position}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Cursor(Protocol):
    """Where the data stands: the epoch, and the global samples of it consumed (a `Session` is one)."""

    epoch: int
    position: int


@dataclass
class _OwnCursor:
    epoch: int = 0
    position: int = 0


class SampleBatch(list[int]):
    """One rank's share of a global mini-batch (a list of dataset indices) and the seed that names it."""

    seed: int = 0


class ResumableSampler(Sampler[SampleBatch]):
    """A batch sampler over `size` samples in global mini-batches of `batch_size`, split over the ranks.

    The order is `epoch_order(size, seed, epoch)` (or 0..size-1 without `shuffle`); `drop_last` drops the
    epoch's last partial global batch. `cursor` holds (epoch, position): a Session's own, when made by
    `Session.sampler()`, so that its checkpoint records it; a private one otherwise, then call `advance()`
    after each batch the loop consumed and keep `state_dict()` in your checkpoint.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        cursor: Cursor | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch_len = epoch_length(size, batch_size, drop_last)
        if self.epoch_len == 0:
            raise ValueError(f"dataset of {size} samples gives no batch of {batch_size}")
        self.cursor: Cursor = cursor if cursor is not None else _OwnCursor()

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @property
    def position(self) -> int:
        """Global samples of the current epoch consumed."""
        return self.cursor.position

    def __iter__(self) -> Iterator[SampleBatch]:
        # Read the cursor now, not at the generator's first next(): the epoch starts where consumption stands.
        return self._batches(self.cursor.epoch, self.cursor.position)

    def _batches(self, epoch: int, start: int) -> Iterator[SampleBatch]:
        order: Sequence[int] = epoch_order(self.size, self.seed, epoch) if self.shuffle else range(self.size)
        for pos in range(start, self.epoch_len, self.batch_size):
            gb = order[pos : min(pos + self.batch_size, self.epoch_len)]
            batch = SampleBatch(gb if self.world_size == 1 else shard(gb, self.rank, self.world_size))
            batch.seed = batch_seed(self.seed, epoch, pos, self.rank)
            yield batch

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        return -(-(self.epoch_len - self.cursor.position) // self.batch_size)

    def next_batch_samples(self) -> int:
        """Global samples in the next unconsumed batch (the last one of an epoch may be partial)."""
        return min(self.batch_size, self.epoch_len - self.cursor.position)

    def advance(self) -> int:
        """Mark the next batch consumed (only when used without a Session); returns its global samples."""
        n = self.next_batch_samples()
        self.cursor.position += n
        if self.cursor.position >= self.epoch_len:
            self.cursor.epoch += 1
            self.cursor.position = 0
        return n

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler's call: starting another epoch than the current one starts it at its beginning."""
        if epoch != self.cursor.epoch:
            self.cursor.epoch, self.cursor.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.cursor.epoch, "position": self.cursor.position, "size": self.size,
                "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int], /) -> None:
        """Continue from `state` (another world size is fine); refused if the data or the order differ."""
        for key in ("size", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(f"sampler state has {key} {state[key]}, this sampler {getattr(self, key)}: "
                                 "resuming would skip or repeat samples")
        self.cursor.epoch, self.cursor.position = int(state["epoch"]), int(state["position"])


def seed_all(seed: int) -> None:
    """Seed python's, torch's CPU and (when imported) numpy's global RNGs."""
    import torch

    random.seed(seed)
    torch.default_generator.manual_seed(seed)  # torch.manual_seed also seeds every accelerator: 0.5 ms, CPU-only
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % (1 << 32))


class SeededDataset(Dataset[Any]):
    """`dataset`, with the RNGs of a DataLoader worker seeded from each `SampleBatch` before it is fetched.

    In the training process itself (num_workers=0) nothing is seeded: the samples are fetched with the
    process's own RNG streams, as `Session.batches()` fetches them.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if isinstance(indices, SampleBatch) and get_worker_info() is not None:
            seed_all(indices.seed)
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]


class TensorsDataset(Dataset[Any]):
    """A tensor, or a tuple/list of tensors of equal length, as a map-style dataset: sample i is `t[i]`
    (or the tuple/list of them)."""

    def __init__(self, data: Any) -> None:
        import torch

        self.single = isinstance(data, torch.Tensor)
        self.tensors: tuple[Any, ...] = (data,) if self.single else tuple(data)
        self.kind: Callable[..., Any] = type(data) if not self.single else tuple

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> Any:
        if self.single:
            return self.tensors[0][index]
        return self.kind(t[index] for t in self.tensors)


class GatheredTensors(TensorsDataset):
    """Tensors whose batches are fetched as `Session.batches()` fetches them, one index per tensor instead of
    one per sample: the DataLoader gets the batch whole, as a list of one, which `collate_fn=only` unwraps."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        import torch

        ix = torch.as_tensor(indices, dtype=torch.long)
        return [self.tensors[0][ix] if self.single else self.kind(t[ix] for t in self.tensors)]


def only(batch: list[Any]) -> Any:
    """The collate_fn of a batch fetched whole (`GatheredTensors`)."""
    return batch[0]


class IgnoreSignalInWorkers:
    """A DataLoader `worker_init_fn`: the worker ignores the suspend signal (the training process acts on
    it), then calls the user's own `worker_init_fn`. Picklable, for the spawn and forkserver start methods."""

    def __init__(self, signum: int, then: Callable[[int], None] | None = None) -> None:
        self.signum, self.then = signum, then

    def __call__(self, worker_id: int) -> None:
        import signal

        signal.signal(self.signum, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)
