"""`DevCluster`: one slurmctld and N slurmd on loopback ports, everything under one state directory.

Layout of the state directory:
  etc/      slurm.conf, gres.conf, job_submit.lua (rendered from templates/)
  spool/    ctld/ (StateSaveLocation), <node>/ (slurmd spool)
  run/      pid files;  log/  daemon logs;  dev/  fake GPU device nodes (char 195:K)
  jobs/     world-writable sticky dir for per-job state dirs
  topology.json
With `accounting=True` also a MariaDB and a slurmdbd of its own (devcluster/accounting.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_gandiva.devcluster.accounting import (
    DB_START_TIMEOUT_S,
    DBD_START_TIMEOUT_S,
    Accounting,
    run_checked,
    sacctmgr_args,
)
from slurm_gandiva.errors import ConfigError, GandivaError, SlurmUnreachable
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.contract import write_atomic
from slurm_gandiva.slurm.capabilities import SlurmCapabilities, installed_release
from slurm_gandiva.slurm.gres import Gres, write_gres

log = logging.getLogger(__name__)

PARTITION = "gpu"
NVIDIA_MAJOR = 195  # the major number of /dev/nvidiaK
CPUS_PER_NODE = 8
MEMORY_MB = 8000
CTLD_PORT_OFFSET = 17
SLURMD_PORT_OFFSET = 101
# Scheduling passes every 2 s (Slurm's defaults: 60 s, 30 s), and the pass a release asks for at slurmctld's
# next 1 s tick instead of up to 3 s after the previous pass (batch_sched_delay; README "Switch cost").
SCHEDULER_PARAMETERS = "sched_interval=2,bf_interval=2,batch_sched_delay=0"
SLURMD_RESTART_GRACE_S = 3.0  # a daemon re-executing itself has no live pid (file) for this long at most


class DevClusterError(GandivaError):
    """A devcluster daemon would not start or a port is taken."""

    exit_code = 3


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon this cluster starts: name ("slurmctld" or "slurmd-n1"), pid (None: not running), log."""

    name: str
    pid: int | None
    port: int
    log: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


@dataclass(frozen=True)
class GpuStatus:
    """One GPU: who holds it whole (job ids) and who holds one of its shards."""

    node: str
    index: int
    jobs: tuple[str, ...]
    shard_jobs: tuple[str, ...]


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str
    gpus: tuple[GpuStatus, ...]


@dataclass(frozen=True)
class ClusterStatus:
    """What `gandiva devcluster status` shows. `nodes` is empty when slurmctld is unreachable."""

    state_dir: Path
    daemons: tuple[DaemonStatus, ...]
    nodes: tuple[NodeStatus, ...]
    reachable: bool

    @property
    def all_running(self) -> bool:
        return all(d.running for d in self.daemons)

    def render(self) -> str:
        """Human-readable text."""
        lines = [f"devcluster {self.state_dir}"]
        lines.append("daemons:")
        for d in self.daemons:
            st = f"running pid {d.pid}" if d.running else "stopped"
            lines.append(f"  {d.name:<12} port {d.port:<6} {st:<20} log {d.log}")
        if not self.reachable:
            lines.append("slurmctld unreachable: run `gandiva devcluster up`")
            return "\n".join(lines)
        lines.append("nodes:")
        for n in self.nodes:
            lines.append(f"  {n.name:<6} {n.state}")
            for g in n.gpus:
                holders = [f"job {j}" for j in g.jobs] + [f"job {j} (shard)" for j in g.shard_jobs]
                lines.append(f"    gpu {g.index}: {', '.join(holders) if holders else 'free'}")
        return "\n".join(lines)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (a.decode(errors="replace").partition("=") for a in raw.split(b"\0") if a)
    return {k: v for k, _, v in pairs}


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - the daemons bind the wildcard address too
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _last_log_line(log: Path, pattern: str = "") -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if "pmix" not in ln.lower() and "mpi/" not in ln.lower()]  # harmless noise
    errs = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()]
    if pattern:
        errs = [ln for ln in errs if pattern in ln] or errs
    return (errs or lines or [""])[-1]


def ensure_munge(timeout: float = 10.0) -> None:
    """Start munged (machine-wide, shared) unless it already answers; DevClusterError if it won't."""
    if _munge_ok():
        return
    for d in ("/run/munge", "/var/lib/munge", "/var/log/munge", "/etc/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    for f in Path("/etc/munge").iterdir():
        shutil.chown(f, "munge", "munge")
    # Another process may be starting munged right now: a failure here is fine if munge then answers.
    subprocess.run(
        ["runuser", "-u", "munge", "--", "/usr/sbin/munged"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _munge_ok():
            return
        time.sleep(0.2)
    raise DevClusterError("munged would not start: see /var/log/munge/munged.log")


def _munge_ok() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=False)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return dec.returncode == 0


class DevCluster:
    """A local multi-node Slurm cluster with fake GPUs, rooted at `state_dir`.

    Needs root (slurmd launches jobs as their users). `up()` is idempotent; `down()` stops exactly
    the daemons whose pid files are under `state_dir`.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        nodes: int = 2,
        gpus_per_node: int = 4,
        gpus_per_switch: int = 2,
        sockets: int = 2,
        port_base: int = 16800,
        *,
        shards_per_gpu: int = 2,
        start_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        capabilities: SlurmCapabilities | None = None,
        scheduler_parameters: str = SCHEDULER_PARAMETERS,
        accounting: bool = False,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1 or gpus_per_switch < 1 or sockets < 1:
            raise ConfigError("devcluster: nodes, GPUs per node, GPUs per switch and sockets must be >= 1")
        if CPUS_PER_NODE % sockets:
            raise ConfigError(f"devcluster: --sockets must divide {CPUS_PER_NODE} (the CPUs per node)")
        if not 1024 <= port_base <= 65000 - SLURMD_PORT_OFFSET - nodes:
            raise ConfigError(f"devcluster: port base {port_base} out of range: pick one in 1024..60000")
        self.state_dir = Path(state_dir).absolute()
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.gpus_per_switch = gpus_per_switch
        self.sockets = sockets
        self.port_base = port_base
        self.shards_per_gpu = shards_per_gpu
        self.start_timeout = start_timeout
        self._clock = clock
        self._sleep = sleep
        self._caps = capabilities
        if any(c.isspace() for c in scheduler_parameters):
            raise ConfigError(f"devcluster: SchedulerParameters {scheduler_parameters!r} must not contain spaces")
        self.scheduler_parameters = scheduler_parameters
        self.accounting = accounting
        self._acct = Accounting(self.state_dir, port_base)

    # ----- paths and names -----
    @property
    def etc(self) -> Path:
        return self.state_dir / "etc"

    @property
    def conf_path(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def topology_path(self) -> Path:
        return self.state_dir / "topology.json"

    @property
    def jobs_dir(self) -> Path:
        """World-writable sticky directory for per-job state dirs."""
        return self.state_dir / "jobs"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def ctld_port(self) -> int:
        return self.port_base + CTLD_PORT_OFFSET

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    def slurmd_port(self, node: str) -> int:
        return self.port_base + SLURMD_PORT_OFFSET + self.node_names.index(node)

    @property
    def env(self) -> dict[str, str]:
        """Environment to add to every Slurm command run against this cluster."""
        return {"SLURM_CONF": str(self.conf_path)}

    @property
    def capabilities(self) -> SlurmCapabilities:
        """What the installed Slurm (the slurmctld on PATH) can do: its configuration depends on it."""
        if self._caps is None:
            self._caps = SlurmCapabilities.for_release(installed_release())
        return self._caps

    @property
    def topology(self) -> Topology:
        return Topology.uniform(
            self.nodes, self.gpus_per_node, gpus_per_switch=self.gpus_per_switch, sockets=self.sockets,
            shards=self.shards_per_gpu,
        )

    def _pid_file(self, daemon: str) -> Path:
        return self.state_dir / "run" / f"{daemon}.pid"

    def _log(self, daemon: str) -> Path:
        return self.log_dir / f"{daemon}.log"

    def _daemons(self) -> list[tuple[str, int]]:
        slurm = [("slurmctld", self.ctld_port)] + [(f"slurmd-{n}", self.slurmd_port(n)) for n in self.node_names]
        acct = [("slurmdbd", self._acct.dbd_port), ("mariadb", self._acct.db_port)]
        # Also when started by an earlier `up --accounting`: `down` without the flag stops them too.
        if self.accounting or any(self._pid_file(d).exists() for d, _ in acct):
            return slurm + acct
        return slurm

    def _pid(self, daemon: str) -> int | None:
        """The daemon's pid if its pid file names a live process that is that daemon of this cluster."""
        try:
            pid = int(self._pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if self._is_ours(pid, daemon) else None

    def _is_ours(self, pid: int, daemon: str) -> bool:
        """pid is alive and runs this cluster's `daemon` (not a reused pid, not a zombie)."""
        if not _pid_alive(pid):
            return False
        argv = _cmdline(pid)
        if daemon == "mariadb":
            return bool(argv) and Path(argv[0]).name == "mariadbd" and f"--datadir={self._acct.datadir}" in argv
        if daemon == "slurmdbd":  # it reads slurmdbd.conf beside SLURM_CONF: no path on its command line
            return bool(argv) and Path(argv[0]).name == "slurmdbd" and _environ(pid).get("SLURM_CONF") == str(
                self.conf_path)
        exe = "slurmctld" if daemon == "slurmctld" else "slurmd"
        return bool(argv) and Path(argv[0]).name == exe and str(self.conf_path) in argv

    # ----- configuration -----
    def _context(self) -> dict[str, object]:
        topo = self.topology
        node_ctx = []
        for node in topo.nodes:
            idx = [g.ref.index for g in node.gpus]
            gres = [Gres("gpu", f"g{k}", 1) for k in idx] + [Gres("shard", f"g{k}", node.shards) for k in idx]
            node_ctx.append({
                "name": node.name,
                "port": self.slurmd_port(node.name),
                "gres": write_gres(gres),
                "shards": node.shards,
                "gpus": [{"index": k, "device": str(self.state_dir / "dev" / f"gpu{k}")} for k in idx],
            })
        return {
            "cluster_name": "gandiva",
            "state_dir": str(self.state_dir),
            "ctld_port": self.ctld_port,
            "nodes": node_ctx,
            "cpus": CPUS_PER_NODE,
            "sockets": self.sockets,
            "cores_per_socket": CPUS_PER_NODE // self.sockets,
            "memory_mb": MEMORY_MB,
            "partition": PARTITION,
            "min_job_age": 600,
            "scheduler_parameters": self.scheduler_parameters,
            "kill_wait": 2,
            # One job's shards on several GPUs of a node (a packed multi-GPU job) need this since 23.11.1.
            "multiple_sharing_gres": self.capabilities.multiple_sharing_gres_param,
            "accounting": False,
            **(self._acct.context() if self.accounting else {}),
        }

    def _rendered(self) -> dict[str, str]:
        from slurm_gandiva import resources

        ctx = self._context()
        return {
            "slurm.conf": resources.render("slurm.conf.j2", ctx),
            "gres.conf": resources.render("gres.conf.j2", ctx),
            "job_submit.lua": resources.template_path("job_submit.lua").read_text(),
            **({"slurmdbd.conf": resources.render("slurmdbd.conf.j2", ctx)} if self.accounting else {}),
        }

    def _prepare(self, *, running: bool) -> bool:
        """Create dirs, devices and configs; True if slurm.conf / gres.conf changed.

        On a running cluster a changed job_submit.lua is installed and loaded (scontrol reconfigure);
        changed daemon configs are refused (ConfigError) and left untouched.
        """
        for d in ("etc", "spool/ctld", "run", "log", "dev"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)
        for n in self.node_names:
            (self.state_dir / "spool" / n).mkdir(exist_ok=True)
        # Jobs run as other users: they must reach etc/ (SLURM_CONF) and jobs/.
        for path in (self.state_dir, self.etc):
            path.chmod(0o755)
        self.jobs_dir.mkdir(exist_ok=True)
        self.jobs_dir.chmod(0o1777)
        for k in range(self.gpus_per_node):
            dev = self.state_dir / "dev" / f"gpu{k}"
            try:
                st = dev.lstat()
                ok = stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR and os.minor(st.st_rdev) == k
            except FileNotFoundError:
                ok = False
            if not ok:
                dev.unlink(missing_ok=True)
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, k))
        rendered = self._rendered()
        changed = [name for name, text in rendered.items()
                   if not (self.etc / name).exists() or (self.etc / name).read_text() != text]
        daemon_conf_changed = any(name != "job_submit.lua" for name in changed)
        if running and daemon_conf_changed:
            raise ConfigError(
                f"devcluster in {self.state_dir} is running with another configuration: "
                f"run `gandiva devcluster down --state-dir {self.state_dir}` first"
            )
        for name in changed:
            # slurmdbd.conf holds the database password; slurmdbd wants it 0600 and its SlurmUser's (root).
            write_atomic(self.etc / name, rendered[name], mode=0o600 if name == "slurmdbd.conf" else 0o644)
        if running and "job_submit.lua" in changed:
            self._slurm(["scontrol", "reconfigure"])
            # Newer daemons (measured on 25.11) re-execute themselves on reconfigure: new pids, the pid files
            # rewritten. Wait for them, or up() would take the restart for stopped daemons.
            self._wait_ctld(restarting=True)
        from slurm_gandiva.topology.file import read_topology, write_topology

        try:
            same = read_topology(self.topology_path) == self.topology
        except ConfigError:
            same = False
        if not same:
            write_topology(self.topology, self.topology_path)
        return daemon_conf_changed

    # ----- lifecycle -----
    def up(self) -> ClusterStatus:
        """Start munge (if needed), slurmctld and every slurmd; return once all nodes are IDLE."""
        if os.geteuid() != 0:
            raise ConfigError("devcluster needs root (slurmd launches jobs as their users): run it with sudo")
        running = [d for d, _ in self._daemons() if self._pid(d) is not None]
        changed = self._prepare(running=bool(running))
        _warn_if_hidden(self.state_dir)
        if changed:
            # A different node set would confuse the saved controller state of an earlier run.
            shutil.rmtree(self.state_dir / "spool" / "ctld", ignore_errors=True)
            (self.state_dir / "spool" / "ctld").mkdir()
        ensure_munge()
        if self.accounting:
            self._start_accounting()
        self._start("slurmctld", self.ctld_port, ["slurmctld", "-f", str(self.conf_path)])
        self._wait_ctld()
        for n in self.node_names:
            self._start(f"slurmd-{n}", self.slurmd_port(n), ["slurmd", "-f", str(self.conf_path), "-N", n])
        self._wait_nodes_idle()
        return self.status()

    def _start_accounting(self) -> None:
        """MariaDB (initialised once), slurmdbd's database user, slurmdbd, and this cluster registered in it."""
        self._acct.initialise()
        self._start("mariadb", self._acct.db_port, self._acct.mariadbd_argv(), foreground=True)
        self._wait_for("mariadb", lambda: self._acct.sql("SELECT 1").returncode == 0, DB_START_TIMEOUT_S)
        grant = self._acct.sql(self._acct.grant_statements())
        if grant.returncode != 0:
            raise DevClusterError(f"cannot create slurmdbd's database user ({grant.stderr.strip()})")
        self._register_cluster()

    def _register_cluster(self, attempts: int = 3) -> None:
        """`sacctmgr add cluster gandiva` unless slurmdbd knows it. Tried again (slurmdbd restarted if it died)
        when it fails: it failed once in CI with "Unspecified error", a query of slurmdbd's that failed while
        it created the cluster's tables on a loaded machine. Adding the cluster is idempotent in slurmdbd."""
        failure: ConfigError | None = None
        for attempt in range(attempts):
            if "gandiva" in self.start_slurmdbd():
                return
            try:
                self.sacctmgr(["add", "cluster", "gandiva"])
                return
            except ConfigError as exc:
                failure = exc
                if attempt + 1 < attempts:
                    self._sleep(1.0 + attempt)
        log = self._log("slurmdbd")
        raise DevClusterError(f"{failure} (slurmdbd: {_last_log_line(log)}): see {log}")

    def start_slurmdbd(self) -> list[str]:
        """Start slurmdbd (if it is not running) and wait until it answers; the clusters it knows. A slurmdbd
        that exits while it starts is started once more: it stops for good on a database query that fails at
        its start (25.11's collation check, seen with three accounting clusters starting at once on 2 cores)."""
        clusters: list[str] = []

        def dbd_answers() -> bool:
            out = self._slurm(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"])
            clusters[:] = out.stdout.split()
            return out.returncode == 0

        for attempt in range(2):
            self._start("slurmdbd", self._acct.dbd_port, ["slurmdbd"])
            try:
                self._wait_for("slurmdbd", dbd_answers, DBD_START_TIMEOUT_S)
                return clusters
            except DevClusterError:
                if attempt or self._pid("slurmdbd") is not None:
                    raise
        return clusters

    def stop_slurmdbd(self, *, timeout: float = 15.0) -> None:
        """Stop slurmdbd alone (slurmctld goes on without it, as when a site's slurmdbd fails)."""
        self._stop("slurmdbd", timeout)

    def _wait_for(self, daemon: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = self._clock() + timeout
        while self._clock() < deadline:
            if ready():
                return
            if self._pid(daemon) is None:
                break
            self._sleep(0.3)
        log = self._log(daemon)
        raise DevClusterError(f"{daemon} did not come up ({_last_log_line(log)}): see {log}")

    def sacctmgr(self, args: list[str]) -> str:
        """`sacctmgr -i ARGS` against this cluster's slurmdbd; its output. ConfigError when it fails."""
        return run_checked(lambda argv: self._slurm(argv, timeout=60), ["sacctmgr", "-i", *args])

    def add_account(self, name: str, *, parent: str = "root", fairshare: int = 1, **limits: str | int) -> None:
        """An account under `parent` with `fairshare` shares (RawShares) and sacctmgr limits (GrpTRES=...)."""
        self.sacctmgr(sacctmgr_args("account", name, Parent=parent, Fairshare=fairshare, **limits))

    def add_user(self, name: str, account: str, *, fairshare: int = 1, **limits: str | int) -> None:
        """An association of user `name` in `account` (its default account if it is the user's first)."""
        self.sacctmgr(sacctmgr_args("user", name, Account=account, Fairshare=fairshare, **limits))

    def add_qos(self, name: str, **limits: str | int) -> None:
        """A QOS with sacctmgr limits (e.g. GrpTRES="gres/gpu=2", MaxTRESPerUser="gres/gpu=1")."""
        self.sacctmgr(sacctmgr_args("qos", name, **limits))

    def _start(self, daemon: str, port: int, argv: list[str], *, foreground: bool = False) -> None:
        if self._pid(daemon) is not None:
            return
        log = self._log(daemon)
        # A daemon of ours that re-executes itself (after `scontrol reconfigure`: 24.11 on) keeps its port while
        # its pid file names the old pid for a moment: wait for it before calling the port someone else's.
        grace = self._clock() + SLURMD_RESTART_GRACE_S
        while not _port_free(port) and self._clock() < grace:
            if self._pid(daemon) is not None:
                return
            self._sleep(0.1)
        if not _port_free(port):
            raise DevClusterError(
                f"cannot start {daemon}: port {port} is taken by another process; "
                f"pick another --port-base (see `ss -ltnp 'sport = :{port}'`)"
            )
        self._pid_file(daemon).unlink(missing_ok=True)
        env = {**os.environ, **self.env}
        if foreground:  # a server that does not daemonise itself (mariadbd): setsid -f detaches it
            with log.open("ab") as out:
                proc = subprocess.run(["setsid", "-f", *argv], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, text=True, timeout=30, check=False)
        else:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            why = ((proc.stderr or "").strip().splitlines() or [_last_log_line(log)])[-1]
            raise DevClusterError(f"{daemon} would not start ({why}): see {log}")
        deadline = self._clock() + self.start_timeout
        while self._clock() < deadline:
            if self._pid(daemon) is not None:
                return
            self._sleep(0.1)
        raise DevClusterError(f"{daemon} exited after start ({_last_log_line(log)}): see {log}")

    def _slurm(self, argv: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def _wait_ctld(self, *, restarting: bool = False) -> None:
        """Until slurmctld answers and its pid file names it; `restarting`: its pid may vanish meanwhile."""
        deadline = self._clock() + self.start_timeout
        while self._clock() < deadline:
            out = self._slurm(["scontrol", "ping"])
            daemons = [d for d, _ in self._daemons()] if restarting else ["slurmctld"]
            if out.returncode == 0 and "UP" in out.stdout and all(self._pid(d) is not None for d in daemons):
                return
            if not restarting and self._pid("slurmctld") is None:
                break
            self._sleep(0.2)
        log = self._log("slurmctld")
        raise DevClusterError(f"slurmctld did not come up ({_last_log_line(log)}): see {log}")

    def _node_states(self) -> dict[str, str]:
        out = self._slurm(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N|%T"])
        if out.returncode != 0:
            raise SlurmUnreachable(
                f"sinfo failed ({out.stderr.strip()}): is slurmctld running? try `gandiva devcluster status`"
            )
        states = {}
        for line in out.stdout.splitlines():
            if "|" in line:
                name, st = line.split("|", 1)
                states[name.strip()] = st.strip().upper()
        return states

    def _wait_nodes_idle(self) -> None:
        deadline = self._clock() + self.start_timeout
        resumed = False
        states: dict[str, str] = {}
        gone: dict[str, float] = {}  # node -> since when its slurmd has had no live pid
        while self._clock() < deadline:
            states = self._node_states()
            bad = [n for n in self.node_names if not states.get(n, "").startswith(("IDLE", "MIXED", "ALLOCATED"))]
            if not bad:
                return
            for n in bad:
                if self._pid(f"slurmd-{n}") is not None:
                    gone.pop(n, None)
                # A slurmd that re-executes itself (reconfigure, 25.11 on) has no pid for a moment.
                elif self._clock() - gone.setdefault(n, self._clock()) >= SLURMD_RESTART_GRACE_S:
                    log = self._log(f"slurmd-{n}")
                    raise DevClusterError(f"slurmd for {n} exited ({_last_log_line(log)}): see {log}")
            down = [n for n in bad if any(s in states.get(n, "") for s in ("DOWN", "DRAIN", "FAIL"))]
            if down and not resumed:
                self._slurm(["scontrol", "update", f"nodename={','.join(down)}", "state=resume"])
                resumed = True
            self._sleep(0.3)
        n = next((n for n in self.node_names if not states.get(n, "").startswith("IDLE")), self.node_names[0])
        log = self._log(f"slurmd-{n}")
        raise DevClusterError(f"node {n} is {states.get(n, 'missing')}, not IDLE ({_last_log_line(log)}): see {log}")

    def down(self, *, timeout: float = 15.0) -> None:
        """Cancel this cluster's jobs, then stop the daemons named by its pid files (and nothing else)."""
        if self._pid("slurmctld") is not None:
            self._cancel_all_jobs()
        daemons = self._daemons()
        slurm = 1 + self.nodes
        # The nodes, then the controller, then slurmdbd (the controller's last records), then MariaDB.
        for daemon, _ in [*reversed(daemons[:slurm]), *daemons[slurm:]]:
            self._stop(daemon, timeout)

    def _stop(self, daemon: str, timeout: float) -> None:
        """SIGTERM `daemon` of this cluster (SIGKILL after `timeout`) and wait until it is gone."""
        pid = self._pid(daemon)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = self._clock() + timeout
        # The daemon removes its pid file before it has exited: watch the process itself.
        while self._clock() < deadline and self._is_ours(pid, daemon):
            self._sleep(0.1)
        if self._is_ours(pid, daemon):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self._is_ours(pid, daemon):
                self._sleep(0.05)
        self._pid_file(daemon).unlink(missing_ok=True)

    def _cancel_all_jobs(self) -> None:
        out = self._slurm(["squeue", "-h", "-o", "%i", "-t", "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING"])
        ids = [i.strip() for i in out.stdout.split() if i.strip()]
        if out.returncode == 0 and ids:
            self._slurm(["scancel", *ids])
            deadline = self._clock() + 10
            while self._clock() < deadline:
                out = self._slurm(["squeue", "-h", "-o", "%i", "-t", "RUNNING,COMPLETING"])
                if out.returncode != 0 or not out.stdout.strip():
                    break
                self._sleep(0.2)

    def status(self) -> ClusterStatus:
        """Daemons (from pid files) and, if slurmctld answers, nodes and which job holds each GPU."""
        daemons = tuple(DaemonStatus(d, self._pid(d), port, self._log(d)) for d, port in self._daemons())
        if daemons[0].pid is None:
            return ClusterStatus(self.state_dir, daemons, (), reachable=False)
        from slurm_gandiva.slurm import make_backend

        try:
            # The CLI backend: one process may look after several clusters (tests do), where libslurm
            # (pyslurm) holds one per process.
            snap = make_backend(self.env, kind="cli").snapshot()
        except SlurmUnreachable:
            return ClusterStatus(self.state_dir, daemons, (), reachable=False)
        holders: dict[tuple[str, int], list[str]] = {}
        shard_holders: dict[tuple[str, int], list[str]] = {}
        for job in snap.jobs:
            if not job.running:
                continue
            for node, idxs in job.gpus.items():
                for k in idxs:
                    holders.setdefault((node, k), []).append(job.job_id)
            for node, idxs in job.shards.items():
                for k in idxs:
                    shard_holders.setdefault((node, k), []).append(job.job_id)
        topo = self.topology
        node_state = {n.name: n.state for n in snap.nodes}
        nodes = tuple(
            NodeStatus(
                n.name,
                node_state.get(n.name, "MISSING"),
                tuple(
                    GpuStatus(n.name, g.ref.index, tuple(holders.get((n.name, g.ref.index), ())),
                              tuple(shard_holders.get((n.name, g.ref.index), ())))
                    for g in n.gpus
                ),
            )
            for n in topo.nodes
        )
        return ClusterStatus(self.state_dir, daemons, nodes, reachable=True)


def default_state_dir() -> Path:
    """The user's cache dir (e.g. ~/.cache/slurm-gandiva/devcluster); for root, whose home other users
    cannot enter, /var/lib/slurm-gandiva/devcluster, since jobs run as other users read SLURM_CONF there."""
    if os.geteuid() == 0:
        return Path("/var/lib/slurm-gandiva/devcluster")
    import platformdirs

    return Path(platformdirs.user_cache_dir("slurm-gandiva")) / "devcluster"


def _warn_if_hidden(path: Path) -> None:
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return
        if not mode & stat.S_IXOTH:
            log.warning(
                "%s is not searchable by other users: jobs of non-root users cannot read %s's SLURM_CONF "
                "or jobs/ dir; pick a --state-dir under /tmp or /var/lib", parent, path,
            )
            return


def cluster_env(cluster: DevCluster, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) plus the cluster's SLURM_CONF."""
    return {**(os.environ if base is None else base), **cluster.env}
