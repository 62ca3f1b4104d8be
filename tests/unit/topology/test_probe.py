"""The NVML probe with a fake pynvml (pure), and the real pynvml's no-driver message."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.model import Locality, Topology
from slurm_gandiva.topology.file import topology_from_json
from slurm_gandiva.topology.probe import NoGpuDriver, cpu_socket_from_sysfs, probe

# -- a fake pynvml module object ---------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


@dataclass
class Pci:
    busId: bytes


@dataclass
class FakeNvml:
    """GPUs given by bus id, pairwise ancestor levels, NUMA ids (None: unsupported), NVLink links."""

    bus: list[str]
    levels: dict[tuple[int, int], int]
    numa: list[int] | None = None
    affinity: list[list[int]] | None = None
    links: dict[int, list[int]] = field(default_factory=dict)  # gpu -> remote gpu per link
    init_error: Exception | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.bus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> Pci:
        return Pci(self.bus[h].upper().encode())

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.levels[(min(a, b), max(a, b))]

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        if self.numa is None:
            raise NVMLError_NotSupported("Not Supported")
        return self.numa[h]

    def nvmlDeviceGetCpuAffinity(self, h: int, size: int) -> list[int]:
        if self.affinity is None:
            raise NVMLError_NotSupported("Not Supported")
        return self.affinity[h]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 4:
            raise NVMLError("Invalid Argument")
        return 1 if link < len(self.links.get(h, [])) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Pci:
        return Pci(self.bus[self.links[h][link]].encode())


BUS = [f"00000000:{b:02x}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]


def dgx_like() -> FakeNvml:
    """8 GPUs: pairs under 4 PCIe switches, 2 switches per socket; NVLink ring 0-1-2-3."""
    levels = {}
    for i in range(8):
        for j in range(i + 1, 8):
            if i // 2 == j // 2:
                levels[(i, j)] = 10  # SINGLE: same switch
            elif i // 4 == j // 4:
                levels[(i, j)] = 40  # NODE: same NUMA node via host bridges
            else:
                levels[(i, j)] = 50  # SYSTEM: across sockets
    links = {0: [1, 3], 1: [0, 2], 2: [1, 3], 3: [2, 0]}
    return FakeNvml(BUS, levels, numa=[0, 0, 0, 0, 1, 1, 1, 1], links=links)


def test_probe_groups_switches_sockets_and_nvlink() -> None:
    nv = dgx_like()
    res = probe(nv, node_name="gpu7", shards=3)
    assert [(g.ref.index, g.socket, g.switch) for g in res.node.gpus] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 1),
        (3, 0, 1),
        (4, 1, 2),
        (5, 1, 2),
        (6, 1, 3),
        (7, 1, 3),
    ]
    assert (res.node.name, res.node.shards) == ("gpu7", 3)
    assert res.gpus[0].nvlink_peers == (1, 3) and res.gpus[5].nvlink_peers == ()
    assert res.gpus[2].pci_bus_id == BUS[2] and res.gpus[2].name.startswith("NVIDIA")
    assert nv.calls == ["init", "shutdown"]
    topo = Topology((res.node,))
    g = res.node.gpu_refs
    assert topo.locality([g[0], g[1]]) is Locality.SWITCH
    assert topo.locality([g[0], g[2]]) is Locality.SOCKET
    assert topo.locality([g[0], g[4]]) is Locality.NODE


def test_probe_json_is_a_topology_file_document() -> None:
    res = probe(dgx_like(), node_name="gpu7")
    doc = json.loads(json.dumps(res.to_json()))
    assert topology_from_json(doc).nodes == (res.node,)
    assert doc["nodes"][0]["gpus"][0]["nvlink_peers"] == [1, 3]


def test_sockets_from_cpu_affinity_when_numa_unknown() -> None:
    nv = dgx_like()
    nv.numa = None
    # GPUs 0-3 bound to CPUs 0-31, 4-7 to CPUs 64-95 (word 1)
    nv.affinity = [[0xFFFFFFFF, 0]] * 4 + [[0, 0xFFFFFFFF]] * 4
    seen: list[int] = []

    def socket_of(cpu: int) -> int:
        seen.append(cpu)
        return 7 if cpu >= 64 else 3

    res = probe(nv, node_name="x", cpu_socket=socket_of)
    assert [g.socket for g in res.node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert seen[0] == 0 and seen[-1] == 64


def test_sockets_from_ancestors_as_last_resort() -> None:
    nv = dgx_like()
    nv.numa = [-1] * 8  # NVML returns -1 when it does not know
    res = probe(nv, node_name="x")
    assert [g.socket for g in res.node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_single_gpu_and_no_gpu() -> None:
    res = probe(FakeNvml(BUS[:1], {}, numa=[0]), node_name="one")
    assert [(g.socket, g.switch) for g in res.node.gpus] == [(0, 0)]
    with pytest.raises(NoGpuDriver, match="sees no GPU"):
        probe(FakeNvml([], {}), node_name="none")


def test_no_driver_message_with_fake() -> None:
    nv = FakeNvml(BUS, {}, init_error=NVMLError("Driver Not Loaded"))
    with pytest.raises(NoGpuDriver) as err:
        probe(nv, node_name="cpu1")
    msg = str(err.value)
    assert "no NVIDIA driver on cpu1" in msg and "Driver Not Loaded" in msg and "\n" not in msg


def test_real_pynvml_without_driver_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if os.path.exists("/dev/nvidiactl"):
        res = probe(node_name="local")
        assert res.node.gpus
        return
    assert main(["topology", "probe", "--json"]) == NoGpuDriver.exit_code
    err = capsys.readouterr().err
    assert err.startswith("gandiva: error: no NVIDIA driver on ") and err.count("\n") == 1


def test_cpu_socket_from_sysfs(tmp_path: Path) -> None:
    d = tmp_path / "cpu5" / "topology"
    d.mkdir(parents=True)
    (d / "physical_package_id").write_text("1\n")
    assert cpu_socket_from_sysfs(5, tmp_path) == 1
    assert cpu_socket_from_sysfs(6, tmp_path) is None
