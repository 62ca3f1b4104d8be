"""The states a `placement.GpuPool` starts from, kept per topology in a policy's `Memo`: a fresh pool's
(`PoolTemplate`) and a fresh pool's after booking the running jobs that stay (`Booked`), which rounds
book again and again. Both are copied, never changed."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gandiva.model import GpuInfo, GpuRef, Placement, Topology

EMPTY = 0  # affinity key of a node with no jobs


@dataclass(frozen=True)
class PoolTemplate:
    """A fresh pool's state for one topology, built once and copied by each `GpuPool` (one a round or more)."""

    free: tuple[tuple[str, dict[GpuRef, GpuInfo]], ...]  # up nodes in topology order: name, all GPUs free
    shard_cap: dict[str, int]
    index: dict[tuple[int, int], dict[str, None]]  # the node index with no job booked (`placement.GpuPool._add_index`)
    keys: dict[int, int]
    max_node_gpus: int
    free_total: int


def pool_template(topology: Topology) -> PoolTemplate:
    free = tuple((n.name, {g.ref: g for g in n.gpus}) for n in topology.nodes if n.up)
    index: dict[tuple[int, int], dict[str, None]] = {}
    for name, gpus in free:
        index.setdefault((EMPTY, len(gpus)), {})[name] = None
    return PoolTemplate(
        free=free,
        shard_cap={n.name: n.shards for n in topology.nodes if n.up},
        index=index,
        keys={EMPTY: len(free)} if free else {},
        max_node_gpus=max((len(g) for _, g in free), default=0),
        free_total=sum(len(g) for _, g in free),
    )


@dataclass(frozen=True)
class Booked:
    """A fresh pool's state after `book_many(placements)`: rounds book the same running jobs again and again."""

    placements: tuple[Placement, ...]
    out: tuple[bool, ...]
    nodes: tuple[tuple[str, dict[GpuRef, GpuInfo], dict[int, int]], ...]  # name, free GPUs, job sizes
    whole: frozenset[GpuRef]
    shards: dict[GpuRef, int]
    index: dict[tuple[int, int], dict[str, None]]
    keys: dict[int, int]
    free_total: int


def booked_cache(topology: Topology) -> dict[tuple[int, ...], Booked]:
    """`Booked` states by the ids of their placements, for one topology (kept in the pool's `Memo`)."""
    return {}


BOOKED_LIMIT = 16  # states kept per topology (the cache is emptied past it)
