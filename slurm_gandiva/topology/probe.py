"""Local GPU topology discovery with NVML (pynvml): GPUs, PCIe switches, CPU sockets, NVLink peers.

`probe(nvml=None)` returns a `ProbeResult`; the NVML module is injectable so tests can pass a fake.
Grouping rules:
- switch: GPUs whose common PCIe ancestor is on the board or below a PCIe switch (NVML_TOPOLOGY_INTERNAL,
  SINGLE, MULTIPLE) share a switch id; a host bridge or anything farther apart does not.
- socket: the GPU's NUMA node when NVML knows it; else the socket of the first CPU in its CPU affinity
  (from sysfs); else GPUs whose common ancestor is within one NUMA node (NVML_TOPOLOGY_NODE) share one.
Ids are renumbered 0.. in GPU order.
"""

from __future__ import annotations

import contextlib
import socket as _socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gandiva.errors import GandivaError
from slurm_gandiva.model import GpuInfo, GpuRef, Node

# NVML topology levels (nvmlGpuTopologyLevel_t); copied so the module works with a fake NVML.
TOPO_INTERNAL, TOPO_SINGLE, TOPO_MULTIPLE, TOPO_HOSTBRIDGE, TOPO_NODE, TOPO_SYSTEM = 0, 10, 20, 30, 40, 50
NVLINK_MAX_LINKS = 36
FEATURE_ENABLED = 1


class NoGpuDriver(GandivaError):
    """NVML cannot be used on this host (no NVIDIA driver / library, or no GPU)."""

    exit_code = 3


@dataclass(frozen=True)
class GpuDetail:
    """What the probe saw about one GPU beyond its place in the topology."""

    index: int
    name: str
    pci_bus_id: str
    minor: int | None
    nvlink_peers: tuple[int, ...]


@dataclass(frozen=True)
class ProbeResult:
    node: Node
    gpus: tuple[GpuDetail, ...]

    def to_json(self) -> dict[str, Any]:
        """A topology-file document with one node; extra per-GPU keys are ignored by read_topology."""
        by_index = {d.index: d for d in self.gpus}
        return {
            "version": 1,
            "nodes": [
                {
                    "name": self.node.name,
                    "shards": self.node.shards,
                    "up": self.node.up,
                    "gpus": [
                        {
                            "index": g.ref.index,
                            "socket": g.socket,
                            "switch": g.switch,
                            "name": by_index[g.ref.index].name,
                            "pci_bus_id": by_index[g.ref.index].pci_bus_id,
                            "minor": by_index[g.ref.index].minor,
                            "nvlink_peers": list(by_index[g.ref.index].nvlink_peers),
                        }
                        for g in self.node.gpus
                    ],
                }
            ],
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(pci: Any) -> str:
    raw = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", "")
    return _text(raw).lower()


def cpu_socket_from_sysfs(cpu: int, root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """The physical package (socket) of a CPU, from sysfs; None when unknown."""
    try:
        return int((root / f"cpu{cpu}" / "topology" / "physical_package_id").read_text().strip())
    except (OSError, ValueError):
        return None


def _first_cpu(mask: Sequence[int], bits: int = 64) -> int | None:
    for word_i, word in enumerate(mask):
        w = int(word)
        if w:
            return word_i * bits + (w & -w).bit_length() - 1
    return None


def _groups(n: int, together: Callable[[int, int], bool]) -> list[int]:
    """Union-find: a group id per item, numbered by first appearance."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if together(i, j):
                parent[find(j)] = find(i)
    ids: dict[int, int] = {}
    return [ids.setdefault(find(i), len(ids)) for i in range(n)]


def _renumber(values: Sequence[int]) -> list[int]:
    ids: dict[int, int] = {}
    return [ids.setdefault(v, len(ids)) for v in values]


def _load_nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NoGpuDriver("pynvml is not installed: pip install nvidia-ml-py on the GPU node") from None
    return pynvml


def probe(
    nvml: Any = None,
    *,
    node_name: str | None = None,
    shards: int = 2,
    cpu_socket: Callable[[int], int | None] = cpu_socket_from_sysfs,
) -> ProbeResult:
    """Read the local GPUs' topology. Raises NoGpuDriver when NVML cannot start or sees no GPU."""
    nv = nvml if nvml is not None else _load_nvml()
    name = node_name or _socket.gethostname().split(".")[0]
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise NoGpuDriver(
            f"no NVIDIA driver on {name}: NVML failed to start ({exc}); install the driver or probe a GPU node"
        ) from None
    try:
        return _probe(nv, name, shards, cpu_socket)
    except nv.NVMLError as exc:
        raise GandivaError(f"NVML failed while probing {name} ({exc}): check the driver with nvidia-smi") from None
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _probe(nv: Any, name: str, shards: int, cpu_socket: Callable[[int], int | None]) -> ProbeResult:
    count = int(nv.nvmlDeviceGetCount())
    if count == 0:
        raise NoGpuDriver(f"NVML on {name} sees no GPU: check nvidia-smi and the driver")
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus = [_bus_id(nv.nvmlDeviceGetPciInfo(h)) for h in handles]
    levels: dict[tuple[int, int], int] = {}
    for i in range(count):
        for j in range(i + 1, count):
            levels[(i, j)] = int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))

    switches = _groups(count, lambda i, j: levels[(i, j)] <= TOPO_MULTIPLE)
    sockets = _sockets(nv, handles, levels, cpu_socket)

    details = []
    for i, h in enumerate(handles):
        peers = _nvlink_peers(nv, h, bus)
        try:
            minor: int | None = int(nv.nvmlDeviceGetMinorNumber(h))
        except nv.NVMLError:
            minor = None
        details.append(GpuDetail(i, _text(nv.nvmlDeviceGetName(h)), bus[i], minor, peers))
    gpus = tuple(GpuInfo(GpuRef(name, i), socket=sockets[i], switch=switches[i]) for i in range(count))
    return ProbeResult(Node(name, gpus, up=True, shards=shards), tuple(details))


def _sockets(
    nv: Any, handles: Sequence[Any], levels: dict[tuple[int, int], int], cpu_socket: Callable[[int], int | None]
) -> list[int]:
    numa: list[int] = []
    for h in handles:
        try:
            node = int(nv.nvmlDeviceGetNumaNodeId(h))
        except (nv.NVMLError, AttributeError):
            break
        if node < 0:
            break
        numa.append(node)
    if len(numa) == len(handles):
        return _renumber(numa)
    by_affinity: list[int] = []
    for h in handles:
        try:
            mask = nv.nvmlDeviceGetCpuAffinity(h, 64)
        except (nv.NVMLError, AttributeError):
            break
        cpu = _first_cpu(list(mask))
        sock = cpu_socket(cpu) if cpu is not None else None
        if sock is None:
            break
        by_affinity.append(sock)
    if len(by_affinity) == len(handles):
        return _renumber(by_affinity)
    n = len(handles)
    return _groups(n, lambda i, j: levels[(i, j)] <= TOPO_NODE)


def _nvlink_peers(nv: Any, handle: Any, bus: Sequence[str]) -> tuple[int, ...]:
    peers: set[int] = set()
    for link in range(NVLINK_MAX_LINKS):
        try:
            if int(nv.nvmlDeviceGetNvLinkState(handle, link)) != FEATURE_ENABLED:
                continue
            remote = _bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        except nv.NVMLError:
            break  # not supported, or past the last link
        if remote in bus:
            peers.add(bus.index(remote))
    return tuple(sorted(peers))
