"""`gandiva devcluster up|down|status`: a real local Slurm cluster with fake GPUs."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `devcluster` command."""
    p = subparsers.add_parser(
        "devcluster",
        help="start/stop/show a local multi-node Slurm cluster with fake GPUs",
        description=(
            "A real slurmctld and one slurmd per node on loopback ports, everything under one state "
            "directory. Needs root. Pass the cluster's SLURM_CONF (printed by `up`) to Slurm commands."
        ),
    )
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument(
        "--state-dir",
        default=None,
        help="state directory (default: ~/.cache/slurm-gandiva/devcluster; root: /var/lib/slurm-gandiva/devcluster)",
    )
    p.add_argument("--nodes", type=int, default=2, help="number of nodes (n1..nN), default 2")
    p.add_argument("--gpus-per-node", type=int, default=4, help="fake GPUs per node, default 4")
    p.add_argument("--gpus-per-switch", type=int, default=2, help="GPUs under one PCIe switch, default 2")
    p.add_argument("--sockets", type=int, default=2, help="CPU sockets per node, default 2")
    p.add_argument(
        "--port-base", type=int, default=16800, help="slurmctld = base+17, slurmd = base+101.., default 16800"
    )
    p.add_argument(
        "--accounting", action="store_true",
        help="also Slurm's own accounting: a MariaDB and a slurmdbd of this cluster's (ports base+19, base+20); "
        "sacct, sshare and sacctmgr then work, and jobs need an account (AccountingStorageEnforce)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from slurm_gandiva.devcluster.cluster import DevCluster, default_state_dir

    cluster = DevCluster(
        args.state_dir or default_state_dir(),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpus_per_switch=args.gpus_per_switch,
        sockets=args.sockets,
        port_base=args.port_base,
        accounting=args.accounting,
    )
    if args.action == "up":
        status = cluster.up()
        print(status.render())
        print(f"export SLURM_CONF={cluster.conf_path}")
        print(f"topology: {cluster.topology_path}")
        return 0
    if args.action == "down":
        cluster.down()
        print(f"devcluster {cluster.state_dir}: stopped")
        return 0
    status = cluster.status()
    print(status.render())
    return 0 if status.all_running and status.reachable else 1
