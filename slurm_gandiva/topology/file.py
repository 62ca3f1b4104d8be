"""The topology file: JSON written by devcluster and `gandiva topology collect`, read by the controller.

Format: {"version": 1, "nodes": [{"name": "n1", "shards": 2, "up": true,
         "gpus": [{"index": 0, "socket": 0, "switch": 0}, ...]}, ...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import GpuInfo, GpuRef, Node, Topology
from slurm_gandiva.requeue.contract import write_atomic

VERSION = 1


def topology_to_json(topo: Topology) -> dict[str, Any]:
    """The file's JSON document for a topology."""
    return {
        "version": VERSION,
        "nodes": [
            {
                "name": n.name,
                "shards": n.shards,
                "up": n.up,
                "gpus": [{"index": g.ref.index, "socket": g.socket, "switch": g.switch} for g in n.gpus],
            }
            for n in topo.nodes
        ],
    }


def write_topology(topo: Topology, path: str | os.PathLike[str]) -> None:
    """Write the topology file atomically (temp file in the same dir, then rename); mode 0644."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, json.dumps(topology_to_json(topo), indent=2) + "\n", mode=0o644)


def _int(obj: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    val = obj.get(key, default)
    if isinstance(val, bool) or not isinstance(val, int) or val < 0:
        raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {val!r}")
    return val


def topology_from_json(doc: Any) -> Topology:
    """Parse the file's JSON document (ValueError with the offending place on bad content)."""
    if not isinstance(doc, dict):
        raise ValueError("top level must be an object")
    if doc.get("version") != VERSION:
        raise ValueError(f"unsupported version {doc.get('version')!r} (expected {VERSION})")
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        raise ValueError("'nodes' must be a list")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, rn in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(rn, dict):
            raise ValueError(f"{where} must be an object")
        name = rn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        if name in seen:
            raise ValueError(f"{where}: node {name!r} listed twice")
        seen.add(name)
        up = rn.get("up", True)
        if not isinstance(up, bool):
            raise ValueError(f"{where}: 'up' must be true or false")
        shards = _int(rn, "shards", where, 2)
        raw_gpus = rn.get("gpus")
        if not isinstance(raw_gpus, list):
            raise ValueError(f"{where}: 'gpus' must be a list")
        gpus: list[GpuInfo] = []
        for k, rg in enumerate(raw_gpus):
            gw = f"{where}.gpus[{k}]"
            if not isinstance(rg, dict):
                raise ValueError(f"{gw} must be an object")
            gpus.append(GpuInfo(GpuRef(name, _int(rg, "index", gw)), _int(rg, "socket", gw), _int(rg, "switch", gw)))
        if len({g.ref.index for g in gpus}) != len(gpus):
            raise ValueError(f"{where}: a GPU index is listed twice")
        nodes.append(Node(name, tuple(gpus), up=up, shards=shards))
    return Topology(tuple(nodes))


def read_topology(path: str | os.PathLike[str]) -> Topology:
    """Read a topology file; ConfigError naming the path on a missing or malformed file (one line)."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ConfigError(f"topology file {p} is not a regular file: point topology_file at the JSON file")
    try:
        doc = json.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"topology file {p} not found: run `gandiva devcluster up` or `gandiva topology collect`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise ConfigError(f"topology file {p} is not readable JSON ({why}): regenerate it") from None
    try:
        return topology_from_json(doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"topology file {p}: {exc}: fix or regenerate it") from None
