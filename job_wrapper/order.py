"""The global sample order every rank agrees on, shared by `Session.batches()` (api.py) and
`ResumableSampler` (data.py)."""

from __future__ import annotations

from collections.abc import Sequence


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The global sample order of one epoch: depends on (n, seed, epoch) only, never on the world size."""
    import torch

    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (1 << 63))
    order: list[int] = torch.randperm(n, generator=gen).tolist()
    return order


def shard(global_batch: Sequence[int], rank: int, world_size: int) -> Sequence[int]:
    """This rank's part of a global mini-batch (strided, so sizes differ by at most one)."""
    return global_batch[rank::world_size]
