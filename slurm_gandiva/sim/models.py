"""Throughput models of the simulated jobs, from the Pollux artifact's measured step times.

Each of the six models (bert, cifar10, deepspeech2, imagenet, ncf, yolov3) is run at one fixed local
batch size (`LOCAL_BSZ`). Its step time on a placement comes from `placements.csv` (keyed by the GPUs
used on each node, e.g. `4` = four GPUs on one node, `22` = two on each of two nodes) for up to four
nodes of four GPUs, and from `scalability.csv` (keyed by nodes and replicas) beyond; other shapes are
interpolated. Throughput = replicas * local_bsz / step_time, in samples per second: a simulated job's
work units are samples.

Within a node, the tables know no PCIe switch or socket, so a placement that spans more switches or
sockets than the GPU count needs is slowed by `locality_penalty` per level. A packed (shared) placement
is slowed by `interference`.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import GpuRef, Locality, Placement, RateTable, Topology

MODEL_NAMES = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

# One local batch size per model, each measured on every placement and at every scale in the tables.
LOCAL_BSZ: Mapping[str, int] = {
    "bert": 8,
    "cifar10": 129,
    "deepspeech2": 20,
    "imagenet": 81,
    "ncf": 513,
    "yolov3": 8,
}


def data_dir() -> Path:
    """The packaged data directory (slurm_gandiva/data)."""
    return Path(str(resources.files("slurm_gandiva"))) / "data"


@dataclass(frozen=True)
class ModelProfile:
    """Step times of one model at its local batch size.

    `by_shape` maps a placement shape (GPUs per node, sorted descending, e.g. (2, 2)) to the step time;
    `by_scale` maps (nodes, replicas) to the step time for the large-scale rows.
    """

    name: str
    local_bsz: int
    by_shape: Mapping[tuple[int, ...], float]
    by_scale: Mapping[tuple[int, int], float] = field(default_factory=dict)

    @cached_property
    def _cross_curve(self) -> tuple[tuple[int, float], ...]:
        """Best known multi-node step time by replica count, for interpolation."""
        best: dict[int, float] = {}
        for shape, st in self.by_shape.items():
            if len(shape) > 1:
                k = sum(shape)
                best[k] = min(best.get(k, math.inf), st)
        for (nodes, k), st in self.by_scale.items():
            if nodes > 1:
                best[k] = min(best.get(k, math.inf), st)
        return tuple(sorted(best.items()))

    def step_time(self, shape: tuple[int, ...]) -> float:
        """Step time (s) on a placement with `shape[i]` GPUs on node i."""
        shape = tuple(sorted((c for c in shape if c > 0), reverse=True))
        if not shape:
            raise ValueError("empty placement shape")
        if shape in self.by_shape:
            return self.by_shape[shape]
        k = sum(shape)
        if len(shape) == 1:
            # More GPUs on one node than the tables know: same step time as the largest known one.
            known = sorted(s[0] for s in self.by_shape if len(s) == 1 and s[0] <= k)
            return self.by_shape[(known[-1],)]
        if (len(shape), k) in self.by_scale:
            return self.by_scale[(len(shape), k)]
        return _interpolate(self._cross_curve, k)

    def throughput(self, shape: tuple[int, ...]) -> float:
        """Samples per second on a placement shape."""
        return sum(shape) * self.local_bsz / self.step_time(shape)

    @property
    def max_measured(self) -> int:
        """The largest GPU count the tables measured (speed-ups beyond it are not extrapolated)."""
        return max([sum(s) for s in self.by_shape] + [k for _, k in self.by_scale])

    def batch_size(self, gpus: int) -> int:
        """Samples in one mini-batch on `gpus` replicas."""
        return gpus * self.local_bsz


def _interpolate(curve: tuple[tuple[int, float], ...], k: int) -> float:
    xs = [x for x, _ in curve]
    if k <= xs[0]:
        return curve[0][1]
    if k >= xs[-1]:
        return curve[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x0 <= k <= x1:
            return y0 + (k - x0) / (x1 - x0) * (y1 - y0)
    raise AssertionError("unreachable")


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read model table {path}: {exc.strerror}; reinstall slurm-gandiva") from exc


def load_profile(name: str, root: Path | None = None, local_bsz: int | None = None) -> ModelProfile:
    """Read one model's tables (averaging repeated measurements) at its local batch size."""
    if name not in LOCAL_BSZ and local_bsz is None:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")
    bsz = local_bsz if local_bsz is not None else LOCAL_BSZ[name]
    base = (root or data_dir() / "pollux-models") / name
    shapes: dict[tuple[int, ...], list[float]] = {}
    for row in _read_rows(base / "placements.csv"):
        if int(row["local_bsz"]) != bsz:
            continue
        shape = tuple(sorted((int(c) for c in row["placement"]), reverse=True))
        shapes.setdefault(shape, []).append(float(row["step_time"]))
    scale: dict[tuple[int, int], list[float]] = {}
    for row in _read_rows(base / "scalability.csv"):
        if int(row["local_bsz"]) != bsz:
            continue
        key = (int(row["num_nodes"]), int(row["num_replicas"]))
        scale.setdefault(key, []).append(float(row["step_time"]))
    if (1,) not in shapes:
        raise ConfigError(f"model {name}: no single-GPU step time at local batch size {bsz} in {base}")
    return ModelProfile(
        name,
        bsz,
        {s: sum(v) / len(v) for s, v in shapes.items()},
        {s: sum(v) / len(v) for s, v in scale.items()},
    )


def load_profiles(root: Path | None = None) -> dict[str, ModelProfile]:
    """All six packaged models."""
    return {n: load_profile(n, root) for n in MODEL_NAMES}


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
            rate = self.profile.throughput(shape) / (1.0 + self.locality_penalty * extra)
            self._memo[key] = rate
        return rate

    def rate(self, placement: Placement) -> float:
        """Samples per second on `placement`; a shared placement is taken to have a packing partner."""
        rate = self.base_rate(placement.gpus)
        if placement.shared:
            rate *= 1.0 - self.interference
        return rate

    def best_rate(self, gpus: int) -> float:
        """Samples per second on `gpus` GPUs packed onto as few nodes as possible, best locality."""
        per_node = len(self.topology.nodes[0].gpus)
        full, rest = divmod(gpus, per_node)
        shape = (per_node,) * full + ((rest,) if rest else ())
        return self.profile.throughput(shape)

    def spread_rate(self, gpus: int) -> float:
        """Samples per second on `gpus` GPUs over two or more nodes, packed as tightly as that allows."""
        per_node = len(self.topology.nodes[0].gpus)
        nodes = max(2, -(-gpus // per_node))
        base, extra = divmod(gpus, nodes)
        shape = tuple([base + 1] * extra + [base] * (nodes - extra))
        return self.profile.throughput(shape)

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
