"""The wrapper process: one training child per allocated GPU, signal forwarding, outcome -> exit code.

It runs as the batch shell (the job script `exec`s it), so it is the process the controller signals.
It imports no torch: start-up stays fast and the children do the training.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from job_wrapper.progress import append_event
from slurm_gandiva.requeue.contract import (
    PARK_SIGNAL,
    PROGRESS_INTERVAL_ENV,
    SIGNAL_ENV,
    STATE_DIR_ENV,
    ExitCode,
    JobFiles,
    ensure_state_dir,
    read_progress,
    write_atomic,
)

GPU_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# Tells the Session it runs under the wrapper: after a suspend checkpoint it may end with os._exit, skipping
# torch's interpreter teardown (seconds) that would otherwise delay freeing the GPUs.
FAST_EXIT_ENV = "GANDIVA_FAST_EXIT"
_TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The rendezvous of a job on several nodes: the batch wrapper picks it and hands it to every node's launcher.
# A site (or user) may set GANDIVA_MASTER_ADDR to the first node's address on the training network.
MASTER_ADDR_ENV = "GANDIVA_MASTER_ADDR"
MASTER_PORT_ENV = "GANDIVA_MASTER_PORT"


class UsageError(Exception):
    """The wrapper was called wrongly (exit ExitCode.USAGE)."""


@dataclass(frozen=True)
class WrapperConfig:
    """What `gandiva-wrapper` was asked to do."""

    command: tuple[str, ...]
    state_dir: Path
    signal: signal.Signals = signal.SIGUSR2
    nprocs: int | None = None
    progress_interval: float = 5.0
    grace_s: float = 60.0  # after one rank exits, how long the others get before SIGKILL
    requeue_wait_s: float = 60.0  # after requeuehold, how long to wait for Slurm to end the job
    scontrol: str = "scontrol"
    srun: str = "srun"
    node: bool = False  # run this node's ranks of a job on several nodes (started by the batch wrapper's srun)


def allocated_gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """The GPUs of the allocation, from the first of CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS."""
    var = gpu_env_var(env)
    return tuple(g.strip() for g in env[var].split(",") if g.strip()) if var else ()


def gpu_env_var(env: Mapping[str, str]) -> str | None:
    """Which of GPU_ENV_VARS `allocated_gpus` reads (the first that lists GPUs), or None."""
    for var in GPU_ENV_VARS:
        value = env.get(var, "").strip()
        if value and value != "NoDevFiles" and any(g.strip() for g in value.split(",")):
            return var
    return None


def plan_ranks(nprocs: int | None, gpus: Sequence[str]) -> tuple[int, tuple[str | None, ...]]:
    """(number of processes, GPU of each rank or None when no GPUs are listed)."""
    if nprocs is not None and nprocs < 1:
        raise UsageError(f"--nprocs must be at least 1, got {nprocs}")
    if not gpus:
        n = nprocs or 1
        return n, (None,) * n
    n = nprocs or len(gpus)
    if n > len(gpus):
        raise UsageError(f"--nprocs {n} exceeds the {len(gpus)} GPUs allocated ({','.join(gpus)})")
    return n, tuple(gpus[:n])


def process_started(pid: int | str = "self") -> float | None:
    """Wall time at which process `pid` started (10 ms resolution, from /proc), None where unknown.

    The job script `exec`s the wrapper, so for the wrapper this is when slurmstepd started the batch shell:
    the "start" event carries it, and the gap to the event is the wrapper's own start-up.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the "(comm)" field
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` ("" for every address) that the kernel gave nobody else right now (MASTER_PORT):
    a port another job on the node holds is never chosen."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Layout:
    """Where this launcher's processes sit among the job's ranks: node `node` of `nodes`, `local` processes
    on each node (Slurm gives every node of a job the same GPUs: per-node gres)."""

    node: int = 0
    nodes: int = 1
    local: int = 1
    addr: str = "127.0.0.1"  # MASTER_ADDR: the first node's

    @property
    def world(self) -> int:
        return self.nodes * self.local

    def rank(self, local_rank: int) -> int:
        return self.node * self.local + local_rank


def job_nodes(env: Mapping[str, str]) -> int:
    """How many nodes the Slurm job has (1 outside Slurm)."""
    try:
        return max(1, int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"))
    except ValueError:
        return 1


def master_addr(env: Mapping[str, str], scontrol: str = "scontrol") -> str:
    """The first node's address for the rendezvous: $GANDIVA_MASTER_ADDR, else the address Slurm reaches the
    batch node at (its NodeAddr; the batch script runs on the job's first node), else its host name."""
    chosen = env.get(MASTER_ADDR_ENV, "").strip()
    if chosen:
        return chosen
    name = env.get("SLURMD_NODENAME", "")
    if name:
        exe = shutil.which(scontrol, path=env.get("PATH")) or scontrol
        try:
            res = subprocess.run([exe, "show", "node", name, "--oneliner"], env=dict(env), capture_output=True,
                                 text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            res = None
        if res is not None and res.returncode == 0:
            for word in res.stdout.split():
                if word.startswith("NodeAddr=") and len(word) > len("NodeAddr="):
                    return word.removeprefix("NodeAddr=")
    return socket.gethostname()


def child_env(
    base: Mapping[str, str],
    rank: int,
    world_size: int,
    gpu: str | None,
    port: int,
    config: WrapperConfig,
    layout: Layout | None = None,
) -> dict[str, str]:
    """The environment of one training process (torch.distributed env:// variables, its one GPU). `rank` is
    the process's rank on its node; `layout` places the node among the job's (default: one node)."""
    lay = layout or Layout(local=world_size)
    env = dict(base)
    env.update(
        MASTER_ADDR=lay.addr,
        MASTER_PORT=str(port),
        RANK=str(lay.rank(rank)),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(lay.world),
        LOCAL_WORLD_SIZE=str(lay.local),
        GROUP_RANK=str(lay.node),
        **{
            STATE_DIR_ENV: str(config.state_dir),
            SIGNAL_ENV: config.signal.name,
            PROGRESS_INTERVAL_ENV: str(config.progress_interval),
            FAST_EXIT_ENV: "1",
        },
    )
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # A parked job is frozen (SIGSTOP, slurm_gandiva.requeue.parking): PyTorch's NCCL heartbeat monitor, on
    # waking after a long freeze, can find its watchdog's heartbeat stale before the watchdog ticks and abort
    # the process. It only watches for a hung watchdog; collective timeouts still apply (none is in flight
    # while parked). A user's own setting stands.
    env.setdefault("TORCH_NCCL_ENABLE_MONITORING", "0")
    return env


def decide_outcome(codes: Sequence[int | None]) -> tuple[ExitCode, str]:
    """Map the children's exit codes (None: killed by the wrapper) to the wrapper's outcome."""
    if all(c == ExitCode.DONE for c in codes):
        return ExitCode.DONE, "training finished"
    if all(c == ExitCode.SUSPENDED for c in codes):
        return ExitCode.SUSPENDED, "checkpointed at a mini-batch boundary"
    bad = [f"rank {r}: {_describe(c)}" for r, c in enumerate(codes) if c not in (ExitCode.DONE, ExitCode.SUSPENDED)]
    if not bad:
        return ExitCode.FAILED, "ranks disagree: " + ", ".join(f"rank {r}: {_describe(c)}" for r, c in enumerate(codes))
    return ExitCode.FAILED, "; ".join(bad)


def _describe(code: int | None) -> str:
    if code is None:
        return "killed by the wrapper"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    write_atomic(path, json.dumps(data, sort_keys=True) + "\n")  # 0600: the user's (and root's) alone


@dataclass
class _State:
    """The wrapper's mutable run state (local to one run(), touched by its signal handlers)."""

    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    suspend_signals: int = 0
    stop_pending: bool = False  # a suspend signal was forwarded: later ones are ignored
    terminated_by: str | None = None


def suspend_action(st: _State, training_done: Callable[[], bool]) -> str | None:
    """What to do with a suspend signal: None to forward it to the children, else why it is ignored.

    The controller may re-signal a job that is slow to stop, and a signal may come after training ended:
    forwarding again would at best do nothing, at worst hit a child in its interpreter teardown (Python then
    no longer handles the signal, so its default action kills the child and a finished run reads FAILED).
    """
    if st.stop_pending:
        return "a stop is already pending"
    if any(c.returncode == ExitCode.DONE for c in st.children) or training_done():
        return "training is done"
    if all(c.poll() is not None for c in st.children):
        return "no training process is running"
    return None


def run(
    config: WrapperConfig,
    env: Mapping[str, str] | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run the training command to its outcome; returns the wrapper's exit code.

    The state directory is created (0700) or checked first: one that another user owns, that others can
    write, or that this user cannot write raises contract.StateDirError (one line) before anything runs.
    """
    env = dict(os.environ if env is None else env)
    if not config.state_dir.parent.exists():  # outside a cluster's jobs root: a new tree of the user's
        config.state_dir.parent.mkdir(parents=True, exist_ok=True)
    files = JobFiles(ensure_state_dir(config.state_dir))
    gpus = allocated_gpus(env)
    nprocs, rank_gpus = plan_ranks(config.nprocs, gpus)
    job_id = slurm_job_ref(env)
    nodes = job_nodes(env)
    if nodes > 1 and not config.node:
        return _run_across_nodes(config, env, files, gpus, nprocs, nodes, clock=clock, sleep=sleep)
    if config.node:
        try:
            layout = Layout(node=int(env.get("SLURM_NODEID", "")), nodes=nodes, local=nprocs,
                            addr=env[MASTER_ADDR_ENV])
            port = int(env[MASTER_PORT_ENV])
        except (KeyError, ValueError):
            raise UsageError(f"--node runs under the batch wrapper's srun (SLURM_NODEID, {MASTER_ADDR_ENV} and "
                             f"{MASTER_PORT_ENV} set): submit the job with gandiva sbatch") from None
    else:
        layout, port = Layout(local=nprocs), free_port()
    st = _State()

    started = time.time()

    def training_done() -> bool:
        prog = read_progress(files.progress)
        return prog is not None and prog.state == "done" and prog.updated >= started

    def on_suspend(signum: int, frame: FrameType | None) -> None:
        st.suspend_signals += 1
        ignored = suspend_action(st, training_done)
        if ignored is None:
            st.stop_pending = True
            for child in st.children:
                if child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(config.signal)
        append_event(files.events, "signal", signal=config.signal.name, count=st.suspend_signals,
                     forwarded_to=[] if ignored else [c.pid for c in st.children if c.returncode is None],
                     **({"ignored": ignored} if ignored else {}))

    def on_terminate(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        st.terminated_by = st.terminated_by or name
        for child in st.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)
        append_event(files.events, "terminate", signal=name)

    def on_park(signum: int, frame: FrameType | None) -> None:
        # Only a wake-up: each rank reads and checks the controller's park-request.json itself.
        live = [c for c in st.children if c.poll() is None]
        for child in live:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(PARK_SIGNAL)
        append_event(files.events, "park_signal", forwarded_to=[c.pid for c in live])

    # Children start with the suspend and park signals blocked (the mask survives exec) and unblock them once
    # their handlers are installed, so a signal that comes while they import torch is held, not fatal or lost.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {config.signal, PARK_SIGNAL})
    signal.signal(config.signal, on_suspend)
    signal.signal(PARK_SIGNAL, on_park)
    for sig in _TERMINATING:
        signal.signal(sig, on_terminate)
    try:
        for rank, gpu in enumerate(rank_gpus):
            st.children.append(
                subprocess.Popen(list(config.command), env=child_env(env, rank, nprocs, gpu, port, config, layout),
                                 stdin=subprocess.DEVNULL if config.node else None)
            )
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for child in st.children:
            child.kill()
        _log(f"cannot start {config.command[0]!r}: {exc.strerror or exc}")
        if config.node:
            return _node_result(files, layout, [], f"cannot start the command: {exc}")
        return _finish(files, ExitCode.FAILED, f"cannot start the command: {exc}", [], env, gpus, nprocs, config)
    where = {"node": layout.node, "host": env.get("SLURMD_NODENAME", "")} if config.node else {}
    append_event(files.events, "node_start" if config.node else "start", job_id=job_id,
                 restart=env.get("SLURM_RESTART_COUNT", "0"),
                 shell_started=process_started(), nprocs=nprocs, gpus=[g for g in rank_gpus if g is not None],
                 gpu_env=gpu_env_var(env),
                 command=list(config.command),
                 children=[c.pid for c in st.children], **where)
    if config.node:
        _write_json_atomic(_node_file(files, layout.node), {"node": layout.node, "state": "ready"})
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # a signal that came meanwhile is handled here

    codes: list[int | None] = [None] * nprocs
    first_exit: float | None = None
    relay = _ParkRelay(sys.stdin.fileno()) if config.node else None
    while any(c.returncode is None for c in st.children):
        if relay is not None and relay.woken():
            on_park(PARK_SIGNAL, None)
        for i, child in enumerate(st.children):
            if child.returncode is None and child.poll() is not None:
                codes[i] = child.returncode
                append_event(files.events, "child_exit", rank=layout.rank(i), code=child.returncode)
                if first_exit is None:
                    first_exit = clock()
                if child.returncode not in (ExitCode.DONE, ExitCode.SUSPENDED):
                    _stop_children(st.children, sleep)  # one rank failed: the others would hang in collectives
        if first_exit is not None and clock() - first_exit > config.grace_s:
            _log(f"ranks still running {config.grace_s:.0f}s after the first exited: killing them")
            _stop_children(st.children, sleep, grace_s=0.0)
        sleep(0.02)
    for i, child in enumerate(st.children):
        if codes[i] is None:
            codes[i] = child.returncode

    if config.node:
        return _node_result(files, layout, codes, f"terminated by {st.terminated_by}" if st.terminated_by else "")
    outcome, reason = decide_outcome(codes)
    if outcome == ExitCode.SUSPENDED and st.terminated_by:
        reason += f" (after {st.terminated_by})"
    elif outcome != ExitCode.DONE and st.terminated_by:
        reason = f"terminated by {st.terminated_by}: {reason}"
    return _finish(files, outcome, reason, codes, env, gpus, nprocs, config, sleep=sleep, clock=clock,
                   terminated=lambda: st.terminated_by is not None)


def _node_file(files: JobFiles, node: int) -> Path:
    return files.root / f"node-{node}.json"


def _node_result(files: JobFiles, layout: Layout, codes: Sequence[int | None], note: str) -> int:
    """A node launcher's end: its ranks' exit codes for the batch wrapper, and an exit code for srun: 0 when
    every rank finished or suspended, else 1 (srun's --kill-on-bad-exit then ends the other nodes' ranks, which
    would otherwise wait in their next collective for ever)."""
    _write_json_atomic(_node_file(files, layout.node), {
        "node": layout.node, "state": "exited", "codes": list(codes), "note": note,
    })
    ok = bool(codes) and all(c in (ExitCode.DONE, ExitCode.SUSPENDED) for c in codes)
    return 0 if ok else int(ExitCode.FAILED)


def _read_node(files: JobFiles, node: int) -> Mapping[str, object] | None:
    try:
        data = json.loads(_node_file(files, node).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def node_codes(files: JobFiles, nodes: int, local: int) -> tuple[list[int | None], list[str]]:
    """Every rank's exit code from the node launchers' files, in rank order, and what is missing (a node whose
    launcher left no result: its ranks count as killed)."""
    codes: list[int | None] = []
    missing: list[str] = []
    for node in range(nodes):
        data = _read_node(files, node)
        got = data.get("codes") if data and data.get("state") == "exited" else None
        if isinstance(got, list) and len(got) == local and all(c is None or isinstance(c, int) for c in got):
            codes.extend(got)
        else:
            codes.extend([None] * local)
            missing.append(f"node {node}: no result from its launcher")
    return codes, missing


def _run_across_nodes(
    config: WrapperConfig,
    env: Mapping[str, str],
    files: JobFiles,
    gpus: Sequence[str],
    nprocs: int,
    nodes: int,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int:
    """The batch wrapper of a job on several nodes: srun starts one launcher per node (`--node`, each runs its
    node's ranks); the suspend signal is forwarded through srun to every launcher once all are ready (before
    that it would kill a launcher that has not installed its handler yet); the park signal goes to every
    launcher as a byte on srun's standard input (`_ParkRelay`); the ranks' outcomes come back in the state
    directory, and the batch wrapper ends the job as on one node (status, held requeue)."""
    for node in range(nodes):
        _node_file(files, node).unlink(missing_ok=True)
    addr = master_addr(env, config.scontrol)
    port = free_port("")
    argv = [shutil.which(config.srun, path=env.get("PATH")) or config.srun, f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--export=ALL",
            sys.executable, "-m", "job_wrapper.cli", "--node", "--signal", config.signal.name,
            "--state-dir", str(config.state_dir), "--progress-interval", str(config.progress_interval),
            "--grace", str(config.grace_s), *(["--nprocs", str(config.nprocs)] if config.nprocs else []),
            "--", *config.command]
    srun_env = {**env, MASTER_ADDR_ENV: addr, MASTER_PORT_ENV: str(port)}
    st = _State()
    forward_pending = False

    def ready() -> bool:
        return all((d := _read_node(files, n)) is not None and d.get("state") in ("ready", "exited")
                   for n in range(nodes))

    def forward() -> None:
        for child in st.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(config.signal)

    def on_suspend(signum: int, frame: FrameType | None) -> None:
        nonlocal forward_pending
        st.suspend_signals += 1
        ignored = suspend_action(st, lambda: False)
        if ignored is None:
            st.stop_pending = True
            if ready():
                forward()
            else:
                forward_pending = True
        append_event(files.events, "signal", signal=config.signal.name, count=st.suspend_signals,
                     forwarded_to=[] if ignored else [c.pid for c in st.children if c.returncode is None],
                     **({"ignored": ignored} if ignored else {"deferred": True} if forward_pending else {}))

    def on_terminate(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        st.terminated_by = st.terminated_by or name
        for child in st.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)
        append_event(files.events, "terminate", signal=name)

    def on_park(signum: int, frame: FrameType | None) -> None:
        # srun forwards no SIGURG (only USR1 and USR2 of the signals a task could take as a wake-up, and
        # Slurm delivers those to every process of the step: a rank without a handler would die), but it
        # copies its standard input to every task: one byte wakes every node's launcher, whenever it reads it.
        sent = _ParkRelay.send(st.children[0].stdin) if st.children else False
        append_event(files.events, "park_signal", relayed=sent)

    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {config.signal, PARK_SIGNAL, *_TERMINATING})
    signal.signal(config.signal, on_suspend)
    signal.signal(PARK_SIGNAL, on_park)
    for sig in _TERMINATING:
        signal.signal(sig, on_terminate)
    try:
        # srun must not inherit the blocked signals: 26.05's srun keeps the mask and then forwards nothing.
        st.children.append(subprocess.Popen(argv, env=srun_env, stdin=subprocess.PIPE, preexec_fn=lambda: (
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {config.signal, PARK_SIGNAL, *_TERMINATING}))))
        assert st.children[0].stdin is not None
        os.set_blocking(st.children[0].stdin.fileno(), False)
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        _log(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        return _finish(files, ExitCode.FAILED, f"cannot start srun: {exc}", [], env, gpus, nprocs * nodes, config)
    append_event(files.events, "start", job_id=env.get("SLURM_JOB_ID"), restart=env.get("SLURM_RESTART_COUNT", "0"),
                 shell_started=process_started(), nprocs=nprocs * nodes, nodes=nodes, master=f"{addr}:{port}",
                 gpus=list(gpus), gpu_env=gpu_env_var(env), command=list(config.command),
                 children=[c.pid for c in st.children])
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    srun = st.children[0]
    while srun.poll() is None:
        if forward_pending and ready():
            forward_pending = False
            forward()
        sleep(0.05)
    codes, missing = node_codes(files, nodes, nprocs)
    append_event(files.events, "child_exit", srun=srun.returncode, codes=codes)
    if missing:
        bad = [f"rank {r}: {_describe(c)}" for r, c in enumerate(codes)
               if c is not None and c not in (ExitCode.DONE, ExitCode.SUSPENDED)]
        outcome, reason = ExitCode.FAILED, "; ".join(bad + missing) + f" (srun {_describe(srun.returncode)})"
    else:
        outcome, reason = decide_outcome(codes)
    if outcome == ExitCode.SUSPENDED and st.terminated_by:
        reason += f" (after {st.terminated_by})"
    elif outcome != ExitCode.DONE and st.terminated_by:
        reason = f"terminated by {st.terminated_by}: {reason}"
    return _finish(files, outcome, reason, codes, env, gpus, nprocs * nodes, config, sleep=sleep, clock=clock,
                   terminated=lambda: st.terminated_by is not None)


class _ParkRelay:
    """The park signal's path to the launchers of a job on several nodes: the batch wrapper writes one byte to
    srun's standard input per signal, srun copies it to every node's launcher (its tasks), and each launcher
    forwards the park signal to its ranks when it reads one (`woken`, polled in its wait loop). Only a wake-up,
    like the signal: the ranks read the request file themselves."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def woken(self) -> bool:
        """Whether a byte (or several: one wake-up) came since the last call; never blocks. At end of file
        (srun closed our standard input, or there is none) it stops looking."""
        if self._fd is None:
            return False
        try:
            readable, _, _ = select.select([self._fd], [], [], 0)
            data = os.read(self._fd, 4096) if readable else None
        except (OSError, ValueError):
            data = b""
        if data == b"":
            self._fd = None
            return False
        return bool(data)

    @staticmethod
    def send(pipe: IO[bytes] | None) -> bool:
        """One wake-up byte into srun's standard input (non-blocking: a full pipe already holds one)."""
        if pipe is None:
            return False
        try:
            os.write(pipe.fileno(), b"p")
        except BlockingIOError:
            return True
        except (OSError, ValueError):
            return False
        return True


def _stop_children(
    children: Sequence[subprocess.Popen[bytes]], sleep: Callable[[float], None], grace_s: float = 5.0
) -> None:
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
    waited = 0.0
    while waited < grace_s and any(c.poll() is None for c in children):
        sleep(0.05)
        waited += 0.05
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait()


def _finish(
    files: JobFiles,
    outcome: ExitCode,
    reason: str,
    codes: Sequence[int | None],
    env: Mapping[str, str],
    gpus: Sequence[str],
    nprocs: int,
    config: WrapperConfig,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    terminated: Callable[[], bool] = lambda: False,
) -> int:
    """Write status.json and the exit event; on a suspend inside Slurm, requeue-hold the job."""
    name = {ExitCode.DONE: "done", ExitCode.SUSPENDED: "suspended"}.get(outcome, "failed")
    prog = read_progress(files.progress)
    job_id = slurm_job_ref(env)
    status: dict[str, object] = {
        "outcome": name,
        "exit_code": int(outcome),
        "reason": reason,
        "time": time.time(),
        "job_id": job_id,
        "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "nprocs": nprocs,
        "gpus": list(gpus),
        "child_exit_codes": list(codes),
        "step": prog.step if prog else None,
        "checkpoint": str(files.checkpoint) if files.checkpoint.exists() else None,
    }
    _write_json_atomic(files.status, status)
    append_event(files.events, "exit", outcome=name, code=int(outcome), reason=reason)
    _log(f"{name}: {reason}")
    if outcome != ExitCode.SUSPENDED or not job_id:
        return int(outcome)
    scontrol = shutil.which(config.scontrol, path=env.get("PATH")) or config.scontrol
    append_event(files.events, "requeuehold", job_id=job_id)
    try:
        res = subprocess.run([scontrol, "requeuehold", job_id], env=dict(env), capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"cannot run {scontrol} requeuehold {job_id}: {exc}"
    else:
        if res.returncode == 0:
            append_event(files.events, "requeuehold_done", job_id=job_id)
            # Slurm now ends this instance of the job; wait to be killed so the record shows a requeue.
            deadline = clock() + config.requeue_wait_s
            while clock() < deadline and not terminated():
                sleep(0.1)
            return int(ExitCode.SUSPENDED)
        why = f"scontrol requeuehold {job_id} failed (exit {res.returncode}): {res.stderr.strip()}"
    append_event(files.events, "requeuehold_failed", job_id=job_id, reason=why)
    _log(f"{why}; exiting {int(ExitCode.SUSPENDED)} (suspended) instead")
    return int(ExitCode.SUSPENDED)


def slurm_job_ref(env: Mapping[str, str]) -> str | None:
    """This job as Slurm's commands must name it (None outside Slurm): ARRAY_TASK for a job array's task,
    else $SLURM_JOB_ID. A task's own numeric id can be the array's id (the array's record ends as one of its
    tasks), and `scontrol requeuehold ARRAY_ID` requeues every task of the array, finished ones too: a
    cancelled or completed task would run again."""
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def _log(message: str) -> None:
    print(f"gandiva-wrapper: {message}", file=sys.stderr, flush=True)
