"""Topology file round trip and validation; devcluster config rendering (no daemons started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gandiva import resources
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import Topology
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.topology.file import read_topology, topology_to_json, write_topology


def test_round_trip_and_format(tmp_path: Path) -> None:
    topo = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)
    path = tmp_path / "sub" / "topology.json"
    write_topology(topo, path)
    assert read_topology(path) == topo
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    assert doc["nodes"][1] == {
        "name": "n2", "shards": 2, "up": True,
        "gpus": [{"index": 0, "socket": 0, "switch": 0}, {"index": 1, "socket": 0, "switch": 0},
                 {"index": 2, "socket": 1, "switch": 1}, {"index": 3, "socket": 1, "switch": 1}],
    }
    assert oct(path.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"version": 2, "nodes": []}, "unsupported version"),
        ({"version": 1}, "'nodes' must be a list"),
        ({"version": 1, "nodes": [{"name": "", "gpus": []}]}, "non-empty string"),
        ({"version": 1, "nodes": [{"name": "a", "gpus": [{"index": -1, "socket": 0, "switch": 0}]}]}, "index"),
        ({"version": 1, "nodes": [{"name": "a", "gpus": [{"index": 0, "socket": 0}]}]}, "switch"),
        ({"version": 1, "nodes": [{"name": "a", "gpus": []}, {"name": "a", "gpus": []}]}, "listed twice"),
        ({"version": 1, "nodes": [{"name": "a", "up": "yes", "gpus": []}]}, "'up'"),
    ],
)
def test_bad_content_is_a_config_error_naming_the_path(tmp_path: Path, doc: object, match: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=match) as err:
        read_topology(path)
    assert str(path) in str(err.value)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_topology(tmp_path / "nope.json")
    (tmp_path / "b.json").write_text("{")
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_topology(tmp_path / "b.json")


def test_json_keeps_down_nodes_and_shards() -> None:
    topo = Topology.uniform(1, 2, shards=4)
    doc = topology_to_json(topo)
    assert doc["nodes"][0]["shards"] == 4


def test_templates_found_and_rendered(tmp_path: Path) -> None:
    assert (resources.templates_dir() / "job_submit.lua").is_file()
    c = DevCluster(tmp_path / "s", nodes=3, gpus_per_node=2, gpus_per_switch=1, sockets=2, port_base=30000,
                   capabilities=SlurmCapabilities.for_release((22, 5, 8)))
    files = c._rendered()
    conf, gres = files["slurm.conf"], files["gres.conf"]
    assert "SlurmctldPort=30017" in conf
    assert "NodeName=n3 NodeHostname=localhost Port=30103 CPUs=8 Sockets=2 CoresPerSocket=4" in conf
    assert "Gres=gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2" in conf
    assert "PartitionName=gpu Nodes=n1,n2,n3 Default=YES" in conf
    assert f"SlurmdSpoolDir={c.state_dir}/spool/%n" in conf
    assert f"NodeName=n2 Name=shard Type=g1 Count=2 File={c.state_dir}/dev/gpu1" in gres
    assert "slurm_job_modify" in files["job_submit.lua"]
    assert c.env == {"SLURM_CONF": str(c.state_dir / "etc" / "slurm.conf")}
    assert "SelectTypeParameters=CR_Core_Memory\n" in conf  # 22.05 knows no MULTIPLE_SHARING_GRES_PJ
    assert "DefMemPerCPU=1000\n" in conf  # 8 CPUs, 8000 MB: a job's CPUs' share of a node
    newer = DevCluster(tmp_path / "t", capabilities=SlurmCapabilities.for_release((24, 11, 5)))
    assert "SelectTypeParameters=CR_Core_Memory,MULTIPLE_SHARING_GRES_PJ\n" in newer._rendered()["slurm.conf"]


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        DevCluster(tmp_path, nodes=0)
    with pytest.raises(ConfigError, match="sockets"):
        DevCluster(tmp_path, sockets=3)
    with pytest.raises(ConfigError, match="port base"):
        DevCluster(tmp_path, port_base=80)


def test_missing_templates_dir_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(resources, "_candidates", lambda: [tmp_path])
    with pytest.raises(ConfigError, match="GANDIVA_TEMPLATES"):
        resources.templates_dir()
