"""DevCluster against the real daemons: idempotent up, status, topology file, ports, down."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster, DevClusterError
from slurm_gandiva.errors import ConfigError
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest
from slurm_gandiva.topology.file import read_topology
from tests.helpers import wait_for

pytestmark = pytest.mark.slurm


def throwaway_port_base(offset: int) -> int:
    """Ports for extra clusters, away from the session cluster's (which other engineers' runs also use)."""
    return int(os.environ.get("GANDIVA_TEST_PORT_BASE", "16800")) + offset


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie that init has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_up_twice_keeps_the_same_daemons_and_status_shows_2x4(slurm_cluster: DevCluster) -> None:
    before = {d.name: d.pid for d in slurm_cluster.status().daemons}
    status = slurm_cluster.up()
    assert {d.name: d.pid for d in status.daemons} == before
    assert all(before.values()), before
    assert [d.name for d in status.daemons] == ["slurmctld", "slurmd-n1", "slurmd-n2"]
    assert status.reachable
    assert [n.name for n in status.nodes] == ["n1", "n2"]
    assert all(len(n.gpus) == 4 for n in status.nodes)
    assert all(n.state.startswith(("IDLE", "MIXED", "ALLOCATED")) for n in status.nodes)
    text = status.render()
    assert "slurmd-n2" in text and "gpu 3:" in text


def test_cli_status_prints_nodes_gpus_and_daemons(slurm_cluster: DevCluster) -> None:
    gandiva = Path(sys.executable).parent / "gandiva"
    out = subprocess.run(
        [str(gandiva), "devcluster", "status", "--state-dir", str(slurm_cluster.state_dir),
         "--port-base", str(slurm_cluster.port_base)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "slurmctld" in out.stdout and "running pid" in out.stdout
    assert out.stdout.count("gpu ") == 8


def test_topology_file_describes_the_cluster(slurm_cluster: DevCluster) -> None:
    topo = read_topology(slurm_cluster.topology_path)
    assert topo == slurm_cluster.topology
    assert [n.name for n in topo.nodes] == ["n1", "n2"]
    n1 = topo.node("n1")
    assert [(g.ref.index, g.socket, g.switch) for g in n1.gpus] == [(0, 0, 0), (1, 0, 0), (2, 1, 1), (3, 1, 1)]
    assert all(n.shards == 2 for n in topo.nodes)


def test_state_dir_layout(slurm_cluster: DevCluster) -> None:
    jobs = slurm_cluster.jobs_dir.stat()
    assert stat.S_IMODE(jobs.st_mode) == 0o1777
    dev = (slurm_cluster.state_dir / "dev" / "gpu3").lstat()
    assert stat.S_ISCHR(dev.st_mode) and os.major(dev.st_rdev) == 195 and os.minor(dev.st_rdev) == 3
    assert (slurm_cluster.etc / "job_submit.lua").is_file()
    conf = slurm_cluster.conf_path.read_text()
    assert "JobSubmitPlugins=lua" in conf and "MinJobAge=600" in conf
    assert f"SlurmctldPort={slurm_cluster.ctld_port}" in conf


def test_status_shows_which_job_holds_which_gpu(
    slurm_cluster: DevCluster, slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    jid = slurm.submit(SubmitRequest(
        "#!/bin/bash\nsleep 60\n",
        options=["--gres=gpu:g2:1", "-w", "n2", f"--chdir={job_dir}", "-o", "/dev/null", "-J", "holder"],
    ))
    cleanup_jobs.append(jid)
    wait_for(lambda: slurm.job(jid).running, what=f"job {jid} running")
    status = slurm_cluster.status()
    by_gpu = {(g.node, g.index): g.jobs for n in status.nodes for g in n.gpus}
    assert by_gpu[("n2", 2)] == (jid,)
    assert by_gpu[("n2", 1)] == ()
    assert f"job {jid}" in status.render()


def test_taken_port_fails_with_a_one_line_reason(tmp_path: Path) -> None:
    base = throwaway_port_base(600)
    cluster = DevCluster(tmp_path / "c", nodes=1, gpus_per_node=1, port_base=base)
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", cluster.ctld_port))
        blocker.listen()
        with pytest.raises(DevClusterError) as err:
            cluster.up()
    msg = str(err.value)
    assert "\n" not in msg
    assert "slurmctld" in msg and str(cluster.ctld_port) in msg and "--port-base" in msg
    assert cluster.status().daemons[0].pid is None


def test_second_cluster_up_down_stops_only_its_own_daemons(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    other = DevCluster(tmp_path / "other", nodes=1, gpus_per_node=2, port_base=throwaway_port_base(500))
    session_pids = [d.pid for d in slurm_cluster.status().daemons]
    try:
        st = other.up()
        assert [n.name for n in st.nodes] == ["n1"] and len(st.nodes[0].gpus) == 2
        other_pids = [d.pid for d in st.daemons]
        assert all(other_pids) and not set(other_pids) & set(session_pids)
    finally:
        other.down()
    assert all(_gone(p) for p in other_pids)  # type: ignore[arg-type]
    assert not any((other.state_dir / "run").glob("*.pid"))
    assert [d.pid for d in slurm_cluster.status().daemons] == session_pids
    st = other.status()
    assert not st.reachable and not any(d.running for d in st.daemons)
    assert "unreachable" in st.render()
    other.down()  # down again is a no-op


def test_up_with_other_options_on_a_running_cluster_is_refused_and_changes_nothing(
    slurm_cluster: DevCluster,
) -> None:
    conf = slurm_cluster.conf_path.read_text()
    other = DevCluster(slurm_cluster.state_dir, nodes=3, port_base=slurm_cluster.port_base)
    with pytest.raises(ConfigError, match="devcluster down"):
        other.up()
    assert slurm_cluster.conf_path.read_text() == conf
    assert slurm_cluster.status().all_running


def test_up_reinstalls_a_changed_job_submit_lua_on_a_running_cluster(slurm_cluster: DevCluster) -> None:
    lua = slurm_cluster.etc / "job_submit.lua"
    good = lua.read_text()
    lua.write_text(good + "\n-- edited\n")
    slurm_cluster.up()
    assert lua.read_text() == good
    assert "scontrol reconfigure" not in good  # sanity: the file is the template, not a log
