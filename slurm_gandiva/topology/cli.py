"""`gandiva topology probe|collect` and `gandiva gres-conf`."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topo = sub.add_parser("topology", help="discover GPU topology (pynvml locally, SSH for the cluster)")
    tsub = topo.add_subparsers(dest="topology_command", metavar="ACTION", required=True)

    p = tsub.add_parser("probe", help="read this node's GPUs and their PCIe/NVLink relations")
    p.add_argument("--json", action="store_true", help="print a topology-file document (what collect reads)")
    p.add_argument("--name", help="node name to report (default: short host name)")
    p.add_argument("--shards", type=int, default=2, help="packed jobs one GPU can hold (default 2)")
    p.set_defaults(func=cmd_probe)

    c = tsub.add_parser("collect", help="run the probe on each node over SSH and write the topology file")
    c.add_argument("hosts", nargs="+", metavar="HOSTS", help="NODE or NODE=SSHHOST, comma or space separated")
    c.add_argument("-o", "--output", metavar="FILE", help="write the topology file here (default: print it)")
    c.add_argument("-l", "--user", help="SSH user (default: the current user)")
    c.add_argument("-p", "--port", type=int, default=22, help="SSH port (default 22)")
    c.add_argument("-i", "--identity", metavar="KEY", help="private key file (default: agent / ~/.ssh keys)")
    c.add_argument(
        "--known-hosts",
        action="append",
        default=[],
        metavar="FILE",
        help="extra known_hosts file (the system and user files are always read)",
    )
    c.add_argument(
        "--remote-command", default=None, help="probe command on the nodes (default: gandiva topology probe --json)"
    )
    c.add_argument("--timeout", type=float, default=30.0, help="seconds per host (default 30)")
    c.set_defaults(func=cmd_collect)

    g = sub.add_parser("gres-conf", help="render per-GPU typed gres.conf and slurm.conf Gres= lines")
    g.add_argument("-t", "--topology", metavar="FILE", required=True, help="topology file (from collect)")
    g.add_argument(
        "--device",
        default="/dev/nvidia{index}",
        help="device file pattern, {index} and {node} are filled in (default /dev/nvidia{index})",
    )
    g.add_argument("--gres-conf", metavar="FILE", help="write gres.conf here instead of printing it")
    g.add_argument("--slurm-conf", metavar="FILE", help="write the slurm.conf lines here instead of printing them")
    g.set_defaults(func=cmd_gres_conf)


def cmd_probe(args: argparse.Namespace) -> int:
    from slurm_gandiva.topology.probe import probe

    result = probe(node_name=args.name, shards=args.shards)
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        return 0
    print(f"node {result.node.name}: {len(result.node.gpus)} GPUs")
    details = {d.index: d for d in result.gpus}
    for g in result.node.gpus:
        d = details[g.ref.index]
        peers = ",".join(map(str, d.nvlink_peers)) or "-"
        print(f"  gpu {g.ref.index}: {d.name} bus {d.pci_bus_id} socket {g.socket} switch {g.switch} nvlink {peers}")
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    import shlex

    from slurm_gandiva.errors import BadRequest
    from slurm_gandiva.topology.collect import DEFAULT_PROBE, collect, parse_targets
    from slurm_gandiva.topology.file import topology_to_json, write_topology

    command = tuple(shlex.split(args.remote_command)) if args.remote_command else DEFAULT_PROBE
    if not command:
        raise BadRequest("--remote-command is empty: give the probe command to run on the nodes")
    topo = collect(
        parse_targets(args.hosts),
        port=args.port,
        username=args.user,
        key_filename=args.identity,
        known_hosts=tuple(args.known_hosts),
        command=command,
        timeout=args.timeout,
    )
    if args.output:
        write_topology(topo, args.output)
        print(f"wrote {args.output}: {len(topo.nodes)} nodes, {topo.total_gpus} GPUs")
    else:
        sys.stdout.write(json.dumps(topology_to_json(topo), indent=2) + "\n")
    return 0


def cmd_gres_conf(args: argparse.Namespace) -> int:
    from slurm_gandiva.errors import BadRequest
    from slurm_gandiva.topology.file import read_topology
    from slurm_gandiva.topology.gresconf import render_gres_conf, render_slurm_nodes

    try:
        ok = "{index}" in args.device and bool(args.device.format(index=0, node="n"))
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise BadRequest(f"--device {args.device!r}: use a pattern with {{index}} (and optionally {{node}})")
    topo = read_topology(args.topology)
    gres = render_gres_conf(topo, args.device)
    nodes = render_slurm_nodes(topo)
    for text, path in ((gres, args.gres_conf), (nodes, args.slurm_conf)):
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {path}")
        else:
            sys.stdout.write(text)
    return 0
