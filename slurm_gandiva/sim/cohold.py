"""The simulator's co-held GPUs (issue 31, `SimConfig.park`): which jobs are parked where, and the checks
that keep a co-held group what the controller may make of it.

A parked job holds a shard of each GPU of its group and its device state in host memory; it computes
nothing. The engine books the computing job of a group whole, as any running job, so at most one job of
a group computes at a time; this module refuses what would break a group: a job booked onto a parked
job's GPUs that are not exactly the group's, a packed job there, more holders than the node's shards, or
parked state beyond a node's host memory for parked jobs.

Host memory is modelled, not traced: the Philly traces carry no memory figures, so every job keeps
`SimConfig.park_state_gb` of device state per GPU parked (model, optimizer, gradients, buffers) and every
node lets its parked jobs use `SimConfig.park_host_gb` of host memory (what their `--mem` would reserve).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from slurm_gandiva.model import CoHold, GpuRef, Placement, Topology

_Key = tuple[str, int]
_GB = 1_000_000_000


class ParkedJobs:
    """The parked jobs of one simulation: job -> its GPU keys, GPU key -> its parked holders."""

    def __init__(self, topology: Topology, state_gb: float, host_gb: float) -> None:
        self.topology = topology
        self.state_bytes = int(state_gb * _GB)
        self.host_bytes = int(host_gb * _GB)
        self.on: dict[str, tuple[_Key, ...]] = {}
        self.at: dict[_Key, set[str]] = {}
        self.parks: dict[str, int] = {}  # job -> parks so far

    def park(self, jid: str, keys: Sequence[_Key]) -> None:
        self.on[jid] = tuple(keys)
        for k in keys:
            self.at.setdefault(k, set()).add(jid)
        self.parks[jid] = self.parks.get(jid, 0) + 1

    def leave(self, jid: str) -> tuple[_Key, ...]:
        """Forget `jid`'s co-held GPUs (it unparks, or is requeued off them) and return them."""
        keys = self.on.pop(jid, ())
        for k in keys:
            holders = self.at[k]
            holders.discard(jid)
            if not holders:
                del self.at[k]
        return keys

    def clash(self, jid: str, keys: Sequence[_Key], shared: bool) -> str | None:
        """Why booking `keys` for `jid` (computing) breaks a co-held group, or None when it does not."""
        mine = set(keys)
        for k in keys:
            holders = self.at.get(k)
            if not holders:
                continue
            if shared:
                return f"packed onto {k[0]}:{k[1]}, which parked job {min(holders)} co-holds"
            if len(holders) + 1 > self.topology.node(k[0]).shards:
                return f"placed on {k[0]}:{k[1]}, which {len(holders)} parked jobs co-hold: more than its shards"
            other = next((p for p in sorted(holders) if set(self.on[p]) != mine), None)
            if other is not None:
                return f"placed on {k[0]}:{k[1]} but not on exactly the GPUs parked job {other} co-holds"
        return None

    def memory_error(self) -> str | None:
        """A node whose parked jobs keep more device state than its host memory for them, or None."""
        use: dict[str, int] = {}
        for keys in self.on.values():
            for node, _ in keys:
                use[node] = use.get(node, 0) + self.state_bytes
        over = sorted(n for n, b in use.items() if b > self.host_bytes)
        if over:
            return f"parked jobs keep {use[over[0]] / _GB:.0f} GB on {over[0]}, over its {self.host_bytes / _GB:.0f} GB"
        return None

    def view(self, may_park: Iterable[str]) -> CoHold:
        """The policies' `ClusterView.co_hold`: the parked jobs, and the state of those that may park."""
        parked = {jid: Placement(tuple(GpuRef(n, i) for n, i in keys)) for jid, keys in self.on.items()}
        state = dict.fromkeys((*self.on, *may_park), self.state_bytes)
        host = dict.fromkeys((n.name for n in self.topology.nodes), self.host_bytes)
        return CoHold(parked, state, host)
