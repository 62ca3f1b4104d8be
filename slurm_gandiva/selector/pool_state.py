"""The states a `placement.GpuPool` starts from, kept per topology in a policy's `Memo`: a fresh pool's
(`PoolTemplate`) and a fresh pool's after booking the running jobs that stay (`Booked`), which rounds
book again and again. Pools share both (`NodeState` is copy-on-write); neither is changed."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gandiva.model import GpuInfo, GpuRef, Placement, Topology

EMPTY = 0  # affinity key of a node with no jobs
MIXED = -1  # affinity key of a node whose jobs have different GPU counts


class NodeState:
    """One node's free GPUs and the GPU counts of the jobs on it. Shared by the pools made from one template
    or cached booking, copy-on-write: a pool copies a node's state before it first changes it."""

    __slots__ = ("free", "sizes")

    def __init__(self, free: dict[GpuRef, GpuInfo], sizes: dict[int, int] | None = None) -> None:
        self.free = free
        self.sizes: dict[int, int] = sizes if sizes is not None else {}  # GPU count of a job here -> how many

    @property
    def key(self) -> int:
        if not self.sizes:
            return EMPTY
        if len(self.sizes) == 1:
            return next(iter(self.sizes))
        return MIXED


@dataclass(frozen=True)
class PoolTemplate:
    """A fresh pool's state for one topology, built once and shared by each `GpuPool` (one a round or more)."""

    states: tuple[tuple[str, NodeState], ...]  # up nodes in topology order: name, all GPUs free (never changed)
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
        states=tuple((name, NodeState(gpus)) for name, gpus in free),
        shard_cap={n.name: n.shards for n in topology.nodes if n.up},
        index=index,
        keys={EMPTY: len(free)} if free else {},
        max_node_gpus=max((len(g) for _, g in free), default=0),
        free_total=sum(len(g) for _, g in free),
    )


def gpu_set(topology: Topology) -> frozenset[GpuRef]:
    """Every GPU of the topology, up or down (`Topology.has_gpu` for many at once)."""
    return frozenset(g.ref for n in topology.nodes for g in n.gpus)


@dataclass(frozen=True)
class Booked:
    """A fresh pool's state after `book_many(placements)`: rounds book the same running jobs again and again."""

    placements: tuple[Placement, ...]
    out: tuple[bool, ...]
    nodes: tuple[tuple[str, NodeState], ...]  # shared with the pools that restore it (never changed)
    whole: frozenset[GpuRef]
    shards: dict[GpuRef, int]
    index: dict[tuple[int, int], dict[str, None]]
    keys: dict[int, int]
    free_total: int


def booked_cache(topology: Topology) -> dict[tuple[int, ...], Booked]:
    """`Booked` states by the ids of their placements, for one topology (kept in the pool's `Memo`)."""
    return {}


BOOKED_LIMIT = 16  # states kept per topology (the cache is emptied past it)
