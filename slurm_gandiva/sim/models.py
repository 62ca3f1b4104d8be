"""Throughput models of the simulated jobs over the models' scaling profiles (`slurm_gandiva.profiles`).

Within a node, the tables know no PCIe switch or socket, so a placement that spans more switches or
sockets than the GPU count needs is slowed by `locality_penalty` per level, but never below the best
placement of as many GPUs across nodes. A packed (shared) placement is slowed by `interference`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from slurm_gandiva.model import GpuRef, Locality, Placement, RateTable, Topology
from slurm_gandiva.profiles import ModelProfile


def best_locality(count: int, topology: Topology) -> Locality:
    """The best locality `count` GPUs can have on this cluster's first node."""
    node = topology.nodes[0]
    if count > len(node.gpus):
        return Locality.CROSS_NODE
    per_switch: dict[int, int] = {}
    per_socket: dict[int, int] = {}
    for g in node.gpus:
        per_switch[g.switch] = per_switch.get(g.switch, 0) + 1
        per_socket[g.socket] = per_socket.get(g.socket, 0) + 1
    if count <= max(per_switch.values()):
        return Locality.SWITCH
    if count <= max(per_socket.values()):
        return Locality.SOCKET
    return Locality.NODE


@dataclass(frozen=True)
class SpeedModel:
    """A job's true speed on any placement of a given cluster: the simulator's ground truth."""

    profile: ModelProfile
    topology: Topology
    locality_penalty: float = 0.05
    interference: float = 0.3

    # Per-instance memo of base rates by (shape, locality levels lost): placements repeat a lot.
    _memo: dict[tuple[tuple[int, ...], int], float] = field(default_factory=dict, compare=False, repr=False)
    _shapes: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def _best_loc(self) -> dict[int, Locality]:
        return {k: best_locality(k, self.topology) for k in range(1, len(self.topology.nodes[0].gpus) + 1)}

    @cached_property
    def _layout(self) -> dict[str, dict[int, tuple[int, int]]]:
        """node -> GPU index -> (socket, switch); keyed by strings and ints, whose hashes are cheap."""
        return {n.name: {g.ref.index: (g.socket, g.switch) for g in n.gpus} for n in self.topology.nodes}

    def shape(self, gpus: Iterable[GpuRef]) -> tuple[int, ...]:
        per: dict[str, int] = {}
        for g in gpus:
            per[g.node] = per.get(g.node, 0) + 1
        return tuple(sorted(per.values(), reverse=True))

    def base_rate(self, gpus: Sequence[GpuRef]) -> float:
        """Samples per second on these GPUs held whole (within-node locality included)."""
        shape = self.shape(gpus)
        extra = 0
        if len(shape) == 1 and len(gpus) > 1:
            layout = self._layout[gpus[0].node]
            places = [layout[g.index] for g in gpus]
            if len({sw for _, sw in places}) <= 1:
                loc = Locality.SWITCH
            elif len({so for so, _ in places}) <= 1:
                loc = Locality.SOCKET
            else:
                loc = Locality.NODE
            extra = max(0, loc - self._best_loc.get(len(gpus), Locality.NODE))
        key = (shape, extra)
        rate = self._memo.get(key)
        if rate is None:
            rate = self.profile.throughput(shape)
            if extra:
                # Spanning switches or sockets is never worse than going over the network.
                k = len(gpus)
                floor = k * self.profile.local_bsz / self.profile.cross_node_step_time(k)
                rate = max(min(rate, floor), rate / (1.0 + self.locality_penalty * extra))
            self._memo[key] = rate
        return rate

    def rate(self, placement: Placement) -> float:
        """Samples per second on `placement`; a shared placement is taken to have a packing partner."""
        rate = self.base_rate(placement.gpus)
        if placement.shared:
            rate *= 1.0 - self.interference
        return rate

    @cached_property
    def _per_node(self) -> int:
        return len(self.topology.nodes[0].gpus)

    def best_shape(self, gpus: int, min_nodes: int = 1) -> tuple[int, ...]:
        """The fastest shape of `gpus` GPUs over at least `min_nodes` nodes: on as few nodes as that
        allows (fewer nodes are never slower), the fastest split among those."""
        hit = self._shapes.get((gpus, min_nodes))
        if hit is not None:
            return hit
        per = self._per_node
        nodes = max(min_nodes, -(-gpus // per))
        if nodes > gpus:
            raise ValueError(f"{gpus} GPUs cannot span {nodes} nodes")
        out = max(_splits(gpus, nodes, per), key=self.profile.throughput)
        self._shapes[(gpus, min_nodes)] = out
        return out

    def best_rate(self, gpus: int) -> float:
        """Samples per second on `gpus` GPUs at their best placement (no placement is faster)."""
        return self.profile.throughput(self.best_shape(gpus))

    def spread_rate(self, gpus: int) -> float:
        """Samples per second on `gpus` GPUs at their best placement over two or more nodes."""
        return self.profile.throughput(self.best_shape(gpus, 2))

    def max_useful_gpus(self, limit: int) -> int:
        """The GPU count (<= limit, <= the largest measured count) with the highest best-placement
        throughput: where speed-up stops."""
        best_k, best = 1, self.best_rate(1)
        for k in range(2, min(limit, self.profile.max_measured) + 1):
            r = self.best_rate(k)
            if r > best:
                best_k, best = k, r
        return best_k

    def rate_table(self, max_gpus: int) -> RateTable:
        """The prior a policy sees: best-locality rate for 1..max_gpus, and the cross-node rate where
        a count fits in one node (so policies can weigh locality)."""
        per_node = len(self.topology.nodes[0].gpus)
        rates: dict[tuple[int, Locality], float] = {}
        for k in range(1, max_gpus + 1):
            loc = best_locality(k, self.topology)
            rates[(k, loc)] = self.best_rate(k)
            if 1 < k <= per_node:
                rates[(k, Locality.CROSS_NODE)] = self.spread_rate(k)
        return RateTable(rates)


def _splits(k: int, nodes: int, per_node: int) -> list[tuple[int, ...]]:
    """Every shape (descending) of `k` GPUs on exactly `nodes` nodes of `per_node` GPUs.

    Enumerated by the idle GPUs on each node (nodes * per_node - k in all), which are few when `nodes`
    is the fewest that fit `k`."""
    idle = nodes * per_node - k
    if idle < 0:
        return []
    out: list[tuple[int, ...]] = []

    def rec(left: int, slots: int, cap: int, acc: tuple[int, ...]) -> None:
        if left == 0:
            out.append(tuple(sorted((per_node - i for i in (*acc, *(0,) * slots)), reverse=True)))
            return
        for i in range(min(cap, left), 0, -1):
            if slots:
                rec(left - i, slots - 1, i, (*acc, i))

    rec(idle, nodes, per_node - 1, ())
    return out
