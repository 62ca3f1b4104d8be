"""gres.conf and slurm.conf Gres= rendering, checked line by line, and the `gandiva gres-conf` command."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.model import GpuInfo, GpuRef, Node, Topology
from slurm_gandiva.topology.file import write_topology
from slurm_gandiva.topology.gresconf import node_gres, render_gres_conf, render_slurm_nodes


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_gres_conf_lines() -> None:
    topo = Topology.uniform(2, 2, shards=2)
    assert _lines(render_gres_conf(topo)) == [
        "NodeName=n1 Name=gpu Type=g0 File=/dev/nvidia0",
        "NodeName=n1 Name=shard Type=g0 Count=2 File=/dev/nvidia0",
        "NodeName=n1 Name=gpu Type=g1 File=/dev/nvidia1",
        "NodeName=n1 Name=shard Type=g1 Count=2 File=/dev/nvidia1",
        "NodeName=n2 Name=gpu Type=g0 File=/dev/nvidia0",
        "NodeName=n2 Name=shard Type=g0 Count=2 File=/dev/nvidia0",
        "NodeName=n2 Name=gpu Type=g1 File=/dev/nvidia1",
        "NodeName=n2 Name=shard Type=g1 Count=2 File=/dev/nvidia1",
    ]


def test_device_pattern_and_no_shards_and_gaps() -> None:
    node = Node("gpu9", (GpuInfo(GpuRef("gpu9", 3), 0, 0), GpuInfo(GpuRef("gpu9", 1), 0, 0)), shards=0)
    topo = Topology((node,))
    assert _lines(render_gres_conf(topo, "/srv/{node}/dev/gpu{index}")) == [
        "NodeName=gpu9 Name=gpu Type=g1 File=/srv/gpu9/dev/gpu1",
        "NodeName=gpu9 Name=gpu Type=g3 File=/srv/gpu9/dev/gpu3",
    ]
    assert node_gres(node) == "gpu:g1:1,gpu:g3:1"


def test_slurm_conf_lines() -> None:
    topo = Topology.uniform(2, 3, shards=2)
    assert _lines(render_slurm_nodes(topo)) == [
        "GresTypes=gpu,shard",
        "NodeName=n1 Gres=gpu:g0:1,gpu:g1:1,gpu:g2:1,shard:g0:2,shard:g1:2,shard:g2:2",
        "NodeName=n2 Gres=gpu:g0:1,gpu:g1:1,gpu:g2:1,shard:g0:2,shard:g1:2,shard:g2:2",
    ]


def test_gres_conf_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "topology.json"
    write_topology(Topology.uniform(1, 2), path)
    assert main(["gres-conf", "-t", str(path)]) == 0
    out = _lines(capsys.readouterr().out)
    assert out[0] == "NodeName=n1 Name=gpu Type=g0 File=/dev/nvidia0"
    assert out[-1] == "NodeName=n1 Gres=gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2"
    gres, slurm = tmp_path / "gres.conf", tmp_path / "nodes.conf"
    assert main(["gres-conf", "-t", str(path), "--gres-conf", str(gres), "--slurm-conf", str(slurm)]) == 0
    assert len(_lines(gres.read_text())) == 4 and _lines(slurm.read_text())[0] == "GresTypes=gpu,shard"


@pytest.mark.parametrize("device", ["/dev/gpu", "/dev/{foo}{index}", "/dev/{index"])
def test_bad_device_pattern(tmp_path: Path, device: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    write_topology(Topology.uniform(1, 1), path)
    assert main(["gres-conf", "-t", str(path), "--device", device]) == 2
    assert "--device" in capsys.readouterr().err
