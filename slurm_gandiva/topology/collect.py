"""Collect the cluster topology by running `gandiva topology probe --json` on each node over SSH.

Host keys are verified against the system and user known_hosts (plus any extra files given); an unknown
host key is refused (paramiko RejectPolicy). Host names only ever go to paramiko's connect() as data; the
remote command is fixed argv joined with shlex quoting and never contains a host name.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slurm_gandiva.errors import BadRequest, GandivaError
from slurm_gandiva.model import GpuInfo, GpuRef, Node, Topology
from slurm_gandiva.topology.file import topology_from_json

DEFAULT_PROBE = ("gandiva", "topology", "probe", "--json")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$|^\[?[0-9A-Fa-f:.]+\]?$")
_NODE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class HostKeyRefused(GandivaError):
    """The SSH host key of a node is unknown or does not match known_hosts."""

    exit_code = 4


@dataclass(frozen=True)
class Target:
    """A node to probe: its Slurm node name and the host to SSH to."""

    node: str
    host: str


def parse_targets(items: Sequence[str]) -> tuple[Target, ...]:
    """Parse `NODE` or `NODE=HOST` items (comma-separated lists allowed); refuses odd characters."""
    out: list[Target] = []
    for item in (x.strip() for arg in items for x in arg.split(",")):
        if not item:
            continue
        node, _, host = item.partition("=")
        host = host or node
        if not _NODE.match(node) or not _HOST.match(host):
            raise BadRequest(f"bad host {item!r}: use NODE or NODE=HOST with letters, digits, '.', '-', '_'")
        out.append(Target(node, host.strip("[]")))
    if not out:
        raise BadRequest("no hosts given: name the nodes to probe, e.g. n1,n2 or n1=gpu-host-1")
    if len({t.node for t in out}) != len(out):
        raise BadRequest("a node is named twice: give each node once")
    return tuple(out)


def _rename(node: Node, name: str) -> Node:
    gpus = tuple(GpuInfo(GpuRef(name, g.ref.index), g.socket, g.switch) for g in node.gpus)
    return replace(node, name=name, gpus=gpus)


def parse_probe_output(text: str, node_name: str) -> Node:
    """The single node in a probe's JSON output, renamed to the Slurm node name."""
    try:
        topo = topology_from_json(json.loads(text))
    except (json.JSONDecodeError, ValueError) as exc:
        raise GandivaError(f"probe on {node_name} printed bad JSON ({exc}): run it there by hand to see why") from None
    if len(topo.nodes) != 1:
        raise GandivaError(f"probe on {node_name} reported {len(topo.nodes)} nodes, expected 1")
    return _rename(topo.nodes[0], node_name)


def _make_client(known_hosts: Sequence[str | os.PathLike[str]], system_known_hosts: bool) -> Any:
    import paramiko

    client = paramiko.SSHClient()
    if system_known_hosts:
        if SYSTEM_KNOWN_HOSTS.is_file():
            client.load_system_host_keys(str(SYSTEM_KNOWN_HOSTS))
        user_file = Path.home() / ".ssh" / "known_hosts"
        if user_file.is_file():
            client.load_system_host_keys(str(user_file))
    for extra in known_hosts:
        client.load_system_host_keys(os.fspath(extra))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def probe_host(
    target: Target,
    *,
    port: int = 22,
    username: str | None = None,
    key_filename: str | None = None,
    pkey: Any = None,
    known_hosts: Sequence[str | os.PathLike[str]] = (),
    system_known_hosts: bool = True,
    command: Sequence[str] = DEFAULT_PROBE,
    timeout: float = 30.0,
) -> Node:
    """Run the probe on one host and return its node (named target.node)."""
    import paramiko

    client = _make_client(known_hosts, system_known_hosts)
    where = target.host if port == 22 else f"[{target.host}]:{port}"
    try:
        client.connect(
            target.host,
            port=port,
            username=username,
            key_filename=key_filename,
            pkey=pkey,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=pkey is None and key_filename is None,
            look_for_keys=pkey is None and key_filename is None,
        )
        _stdin, stdout, stderr = client.exec_command(shlex.join(command), timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        status = stdout.channel.recv_exit_status()
    except paramiko.BadHostKeyException:
        raise HostKeyRefused(
            f"host key of {where} does not match known_hosts: verify the host, then fix known_hosts "
            f"(ssh-keygen -R '{where}')"
        ) from None
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            scan = f"ssh-keyscan -p {port} {target.host}" if port != 22 else f"ssh-keyscan {target.host}"
            raise HostKeyRefused(
                f"host key of {where} is unknown: verify it ({scan}) and add it to known_hosts"
            ) from None
        raise GandivaError(f"ssh to {where} failed ({exc}): check the host, user and key") from None
    except OSError as exc:
        raise GandivaError(f"cannot reach {where} ({exc}): check the host name and that sshd runs") from None
    finally:
        client.close()
    if status != 0:
        first = next((line for line in err.splitlines() if line.strip()), f"exit status {status}")
        raise GandivaError(f"probe on {target.node} ({where}) failed: {first.strip()}")
    return parse_probe_output(out, target.node)


def collect(
    targets: Sequence[Target],
    *,
    probe: Callable[[Target], Node] | None = None,
    parallel: int = 8,
    **ssh: Any,
) -> Topology:
    """Probe the targets (up to `parallel` at once) and assemble the topology, nodes in target order.

    The first failure (unknown host key, unreachable host, failing probe) is raised."""
    run = probe if probe is not None else (lambda t: probe_host(t, **ssh))
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(targets)))) as pool:
        return Topology(tuple(pool.map(run, targets)))
