"""The models' scaling profiles, from the Pollux artifact's measured step times: read by the simulator
(its jobs' true speed, `slurm_gandiva.sim.models.SpeedModel`) and by the controller (a model's speed-up).

Each of the six models (bert, cifar10, deepspeech2, imagenet, ncf, yolov3) is run at one fixed local
batch size (`LOCAL_BSZ`: samples per GPU per step). Throughput = replicas * local_bsz / step_time, in
samples per second: a simulated job's work units are samples.

The tables (petuum/adaptdl, branch osdi21-artifact, simulator/traces/<model>/, byte for byte), one row per
measurement at one local batch size:

- `placements.csv`: `placement` is a digit string with one digit per node, the digit being the GPUs
  (replicas) used on that node: `4` = four GPUs on one node, `22` = two on each of two nodes, `1114` = one
  on each of three nodes and four on a fourth. Up to four nodes of four GPUs; Pollux stores each cyclic
  order once, we also merge the orders (averaging them): our key is the digits sorted descending.
- `scalability.csv`: `num_nodes` nodes running `num_replicas` GPUs in all (6 to 16 nodes, 6 to 64 GPUs),
  the per-node split unrecorded.
- `step_time` is the seconds of one whole step (compute and gradient sync); `sync_time` is the sync
  part of it, and is not used here.

The measured data is not monotone in locality: for all six models, the best two-node row is slower than the best
three-node row at the same GPU count and local batch size in 297 of the 315 such pairs (bert, 8 GPUs: 2.53 s
on 4+4, 1.53 s on 3+3+2; the sync part is 1.9 s against 0.9 s). Taken as is, that makes packing onto
fewer nodes a loss and every locality-aware result upside down, so the model does not take it as is:
a placement's step time is the least of its own measurement and of every time measured for the same GPU
count on more nodes (a job can always do at least as well as it would spread wider). Shapes with no row
of their own (e.g. 9 nodes) get a step time interpolated linearly in the GPU count from the best rows on
at least as many nodes as the nearest measured node count below (8), made non-decreasing in the node
count. The one-node rows are trusted as they are: no multi-node placement is taken to be faster than one
node (imagenet's 4 GPUs: 0.434 s on three nodes, 0.449 s on one, is noise). So, for any GPU count, fewer
nodes are never slower, and no placement is faster than `SpeedModel.best_shape`.

Speed-up over the GPU count is not made monotone: where every measured row for more GPUs (on as many
nodes as those GPUs need) is slower per sample, the model is too (bert: 4 GPUs on one node 3.80x the
one-GPU throughput, 5 GPUs over two nodes 2.67x). `SpeedModel.max_useful_gpus` stops elastic jobs there.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from slurm_gandiva.errors import ConfigError

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

    `by_shape` maps a placement shape (GPUs per node, sorted descending, e.g. (2, 2)) to its measured
    step time (placements.csv); `by_scale` maps (nodes, replicas in all) to the measured step time
    (scalability.csv). `step_time` is the model's step time, monotone in the node count (see the
    module docstring); `measured_step_time` is the table's own figure.
    """

    name: str
    local_bsz: int
    by_shape: Mapping[tuple[int, ...], float]
    by_scale: Mapping[tuple[int, int], float] = field(default_factory=dict)
    # Step times by shape and interpolated floors by (nodes, replicas): asked for over and over.
    _memo: dict[tuple[int, ...], float] = field(default_factory=dict, compare=False, repr=False)
    _floors: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def _points(self) -> tuple[tuple[int, int, float], ...]:
        """(nodes, replicas, step time) of every measured placement over two or more nodes."""
        pts = [(len(s), sum(s), st) for s, st in self.by_shape.items() if len(s) > 1]
        pts += [(n, k, st) for (n, k), st in self.by_scale.items() if n > 1 and k >= n]
        return tuple(pts)

    @cached_property
    def _node_counts(self) -> tuple[int, ...]:
        """The node counts measured (2, 3, 4, 6, 8, 12, 16 in the packaged tables)."""
        return tuple(sorted({n for n, _, _ in self._points})) or (2,)

    @cached_property
    def _max_nodes(self) -> int:
        return self._node_counts[-1]

    def _curve(self, nodes: int) -> tuple[tuple[int, float], ...]:
        """Best measured step time by replica count over the rows with at least as many nodes as the
        largest measured node count <= `nodes` (9 nodes: the rows with 8 or more)."""
        lo = max((n for n in self._node_counts if n <= nodes), default=2)
        best: dict[int, float] = {}
        for n, k, st in self._points:
            if n >= lo:
                best[k] = min(best.get(k, math.inf), st)
        return tuple(sorted(best.items()))

    def _floor(self, nodes: int, k: int) -> float:
        """Step time of `k` GPUs on `nodes` (>= 2) nodes where no row says otherwise: the best rows on
        at least as many nodes, interpolated in `k`, and never less than on fewer nodes."""
        key = (min(nodes, self._max_nodes), k)
        out = self._floors.get(key)
        if out is None:
            if key[0] <= 2:
                curve = self._curve(2)
                # No multi-node row at all: spreading is taken to cost nothing.
                out = _interpolate(curve, k) if curve else self._single(k)
            else:
                out = max(self._floor(key[0] - 1, k), _interpolate(self._curve(key[0]), k))
            self._floors[key] = out
        return out

    def _single(self, k: int) -> float:
        if (k,) in self.by_shape:
            return self.by_shape[(k,)]
        # More GPUs on one node than the tables know: same step time as the largest known count.
        known = [s[0] for s in self.by_shape if len(s) == 1 and s[0] <= k]
        if not known:
            raise ValueError(f"model {self.name}: no single-node step time for {k} GPUs or fewer")
        return self.step_time((max(known),))

    def measured_step_time(self, shape: tuple[int, ...]) -> float | None:
        """The tables' own step time for this shape (None when neither table has it)."""
        shape = _norm(shape)
        return self.by_shape.get(shape, self.by_scale.get((len(shape), sum(shape))))

    def step_time(self, shape: tuple[int, ...]) -> float:
        """Step time (s) on a placement with `shape[i]` GPUs on node i; never more than on a placement of
        as many GPUs over more nodes."""
        shape = _norm(shape)
        out = self._memo.get(shape)
        if out is not None:
            return out
        n, k = len(shape), sum(shape)
        own = self.measured_step_time(shape)
        if n == 1:
            out = self._single(k)
        else:
            out = self._floor(n, k) if own is None else min(own, self._floor(n + 1, k))
            # No network beats none: a multi-node row faster than one node is noise (imagenet, 4 GPUs).
            out = max(out, self._single(k))
        self._memo[shape] = out
        return out

    def cross_node_step_time(self, k: int) -> float:
        """The least step time `k` GPUs get over two or more nodes (what no cross-node placement beats)."""
        return max(self._floor(2, k), self._single(k))

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


def _norm(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = tuple(sorted((c for c in shape if c > 0), reverse=True))
    if not out:
        raise ValueError("empty placement shape")
    return out


def _interpolate(curve: tuple[tuple[int, float], ...], k: int) -> float:
    """Linear in k between the curve's points, flat beyond its ends."""
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
