"""`gandiva gres-conf` output against the real local Slurm cluster: the lines we render for the
devcluster's topology are the ones its running slurmd daemons were configured with, and Slurm reports
each node's GRES exactly as our slurm.conf Gres= value."""

from __future__ import annotations

import re
import subprocess

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.topology.file import read_topology
from slurm_gandiva.topology.gresconf import node_gres, render_gres_conf, render_slurm_nodes

pytestmark = pytest.mark.slurm


def _config_lines(text: str) -> list[str]:
    return sorted(" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def test_gres_conf_matches_the_running_cluster(slurm_cluster: DevCluster, slurm_env: dict[str, str]) -> None:
    topo = read_topology(slurm_cluster.topology_path)
    assert topo.total_gpus > 0
    device = str(slurm_cluster.state_dir / "dev" / "gpu{index}")
    assert _config_lines(render_gres_conf(topo, device)) == _config_lines((slurm_cluster.etc / "gres.conf").read_text())
    ours = dict(re.findall(r"^NodeName=(\S+) Gres=(\S+)$", render_slurm_nodes(topo), re.MULTILINE))
    for node in topo.nodes:
        out = subprocess.run(
            ["scontrol", "show", "node", node.name, "-o"], env=slurm_env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        m = re.search(r"\bGres=(\S+)", out.stdout)
        assert m is not None, out.stdout
        assert sorted(m.group(1).split(",")) == sorted(ours[node.name].split(",")) == sorted(node_gres(node).split(","))
