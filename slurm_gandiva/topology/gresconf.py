"""Render per-GPU typed gres.conf lines and slurm.conf NodeName ... Gres= lines from a Topology.

Each GPU K of a node is its own GRES type gK (so the controller can ask for exact GPUs), and each GPU
also offers `node.shards` shards of type gK for packing.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gandiva.model import Node, Topology
from slurm_gandiva.resources import render
from slurm_gandiva.slurm.gres import Gres, write_gres

DEFAULT_DEVICE = "/dev/nvidia{index}"


@dataclass(frozen=True)
class GpuLine:
    index: int
    device: str


@dataclass(frozen=True)
class NodeLines:
    name: str
    shards: int
    gpus: tuple[GpuLine, ...]
    gres: str


def node_gres(node: Node) -> str:
    """The slurm.conf Gres= value of a node: gpu:gK:1 for each GPU, then shard:gK:S."""
    idx = sorted(g.ref.index for g in node.gpus)
    items = [Gres("gpu", f"g{k}", 1) for k in idx]
    if node.shards > 0:
        items += [Gres("shard", f"g{k}", node.shards) for k in idx]
    return write_gres(items)


def _nodes(topo: Topology, device: str) -> list[NodeLines]:
    out = []
    for n in topo.nodes:
        gpus = tuple(GpuLine(k, device.format(index=k, node=n.name)) for k in sorted(g.ref.index for g in n.gpus))
        out.append(NodeLines(n.name, n.shards, gpus, node_gres(n)))
    return out


def render_gres_conf(topo: Topology, device: str = DEFAULT_DEVICE) -> str:
    """gres.conf: per node and GPU, a typed gpu line and a shard line on the same device file."""
    return render("gres.conf.node.j2", {"nodes": _nodes(topo, device)})


def render_slurm_nodes(topo: Topology) -> str:
    """slurm.conf fragment: GresTypes and one NodeName line per node with its Gres= list."""
    return render("slurm.conf.nodes.j2", {"nodes": _nodes(topo, DEFAULT_DEVICE)})
