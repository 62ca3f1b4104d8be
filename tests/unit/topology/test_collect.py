"""`collect` against a real paramiko SSH server started in-process on 127.0.0.1.

The server answers the probe command with a fake probe's JSON; host keys are checked for real.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.errors import BadRequest, GandivaError
from slurm_gandiva.model import Topology
from slurm_gandiva.topology.collect import HostKeyRefused, Target, collect, parse_targets, probe_host
from slurm_gandiva.topology.file import read_topology, topology_to_json

PROBE = ("gandiva", "topology", "probe", "--json")
PROBE_DOC = topology_to_json(Topology.uniform(1, 4, prefix="whatever"))


@dataclass
class SshServer:
    port: int
    host_key: paramiko.PKey
    client_key: paramiko.PKey
    commands: list[str] = field(default_factory=list)

    def known_hosts(self, path: Path) -> Path:
        path.write_text(f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n")
        return path


class _Iface(paramiko.ServerInterface):
    def __init__(self, srv: SshServer) -> None:
        self.srv = srv
        self.event = threading.Event()

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED  # type: ignore[attr-defined,no-any-return]

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = username == "probe" and key.get_base64() == self.srv.client_key.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED  # type: ignore[attr-defined,no-any-return]

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        cmd = command.decode()
        self.srv.commands.append(cmd)

        def answer() -> None:
            # paramiko acknowledges the exec request after this method returns; answering before
            # that makes the client see the channel closed first
            time.sleep(0.1)
            if cmd == " ".join(PROBE):
                channel.sendall(json.dumps(PROBE_DOC).encode())
                channel.send_exit_status(0)
            else:
                channel.sendall_stderr(b"gandiva: error: no NVIDIA driver on box\n")
                channel.send_exit_status(3)
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


@pytest.fixture(scope="module")
def ssh_server() -> Iterator[SshServer]:
    host_key = paramiko.ECDSAKey.generate()
    srv = SshServer(0, host_key, paramiko.ECDSAKey.generate())
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    lsock.settimeout(0.2)
    srv.port = lsock.getsockname()[1]
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def handshake(conn: socket.socket) -> None:
        t = paramiko.Transport(conn)
        t.add_server_key(host_key)
        transports.append(t)
        try:
            t.start_server(server=_Iface(srv))
        except Exception:  # a client that refuses our key hangs up mid-handshake
            t.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=handshake, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv
    stop.set()
    thread.join(timeout=5)
    for t in transports:
        t.close()
    lsock.close()


def _ssh(srv: SshServer, known: Path) -> dict[str, object]:
    return {
        "port": srv.port,
        "username": "probe",
        "pkey": srv.client_key,
        "known_hosts": (known,),
        "system_known_hosts": False,
        "timeout": 10.0,
    }


def test_known_host_is_probed(ssh_server: SshServer, tmp_path: Path) -> None:
    known = ssh_server.known_hosts(tmp_path / "known_hosts")
    topo = collect([Target("n1", "127.0.0.1"), Target("n2", "127.0.0.1")], **_ssh(ssh_server, known))  # type: ignore[arg-type]
    assert [n.name for n in topo.nodes] == ["n1", "n2"]
    assert [g.ref.node for g in topo.nodes[1].gpus] == ["n2"] * 4
    assert [(g.socket, g.switch) for g in topo.nodes[0].gpus] == [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert ssh_server.commands[-1] == "gandiva topology probe --json"


def test_unknown_host_key_is_refused(ssh_server: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    before = len(ssh_server.commands)
    with pytest.raises(HostKeyRefused) as err:
        probe_host(Target("n1", "127.0.0.1"), **_ssh(ssh_server, empty))  # type: ignore[arg-type]
    msg = str(err.value)
    assert "unknown" in msg and f"ssh-keyscan -p {ssh_server.port} 127.0.0.1" in msg and "\n" not in msg
    assert len(ssh_server.commands) == before  # nothing ran


def test_changed_host_key_is_refused(ssh_server: SshServer, tmp_path: Path) -> None:
    other = paramiko.ECDSAKey.generate()
    known = tmp_path / "kh"
    known.write_text(f"[127.0.0.1]:{ssh_server.port} {other.get_name()} {other.get_base64()}\n")
    with pytest.raises(HostKeyRefused, match="does not match"):
        probe_host(Target("n1", "127.0.0.1"), **_ssh(ssh_server, known))  # type: ignore[arg-type]


def test_failing_probe_reports_its_error(ssh_server: SshServer, tmp_path: Path) -> None:
    known = ssh_server.known_hosts(tmp_path / "kh")
    with pytest.raises(GandivaError, match=r"probe on n1 .* failed: gandiva: error: no NVIDIA driver"):
        probe_host(Target("n1", "127.0.0.1"), command=("false", "x;y"), **_ssh(ssh_server, known))  # type: ignore[arg-type]
    assert ssh_server.commands[-1] == "false 'x;y'"  # argv is quoted, never interpolated


def test_collect_command_writes_topology_file(
    ssh_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = ssh_server.known_hosts(tmp_path / "kh")
    key = tmp_path / "id_ecdsa"
    ssh_server.client_key.write_private_key_file(str(key))
    monkeypatch.setenv("HOME", str(tmp_path))  # keep the real user's known_hosts out of it
    out = tmp_path / "topology.json"
    argv = ["topology", "collect", "gpu1=127.0.0.1,gpu2=127.0.0.1", "-p", str(ssh_server.port)]
    argv += ["-l", "probe", "-i", str(key), "--known-hosts", str(known), "-o", str(out)]
    assert main(argv) == 0
    topo = read_topology(out)
    assert [n.name for n in topo.nodes] == ["gpu1", "gpu2"] and topo.total_gpus == 8


def test_parse_targets() -> None:
    assert parse_targets(["n1,n2", "n3=gpu-3.example.org"]) == (
        Target("n1", "n1"),
        Target("n2", "n2"),
        Target("n3", "gpu-3.example.org"),
    )
    assert parse_targets(["n4=[::1]"]) == (Target("n4", "::1"),)
    for bad in (["n1;rm -rf /"], ["$(id)"], ["n1=host name"], ["n1,n1"], [""]):
        with pytest.raises(BadRequest):
            parse_targets(bad)
