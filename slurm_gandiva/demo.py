"""`gandiva demo`: the README's main job, end to end on a local multi-node Slurm cluster.

Brings up a devcluster (2 nodes x 4 fake GPUs) in its own state dir, starts the controller as a
subprocess (config rendered into the state dir), submits 12 real PyTorch jobs (examples/train.py) with
`gandiva sbatch` as a non-root user (1, 2 and 4 GPUs, some elastic: about 2x oversubscribed), shows their
progress live, and ends with every job finished, the sacct-style slice report and a Gantt PNG.
Exits non-zero if any job failed or got lost. Results (per-job JCTs) go to <state>/demo-results.json,
which benchmarks/bench_sim_vs_real.py reads (it runs the one-user workload).

With tenants (the command's default; `--one-user` for the workload above): the cluster runs Slurm's own
accounting (slurmdbd over MariaDB), two accounts with equal shares, a user in each, and the controller
runs with `fairness = shares`. The first user starts a search of eight 1-GPU jobs that fills the
cluster; the second user submits three jobs 20 s later and gets its half of the GPUs within a rotation.
The report ends with each tenant's GPU-time and Slurm's own `sshare`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from slurm_gandiva.errors import ConfigError, GandivaError
from slurm_gandiva.requeue.contract import JobFiles, Progress, read_progress

if TYPE_CHECKING:
    from slurm_gandiva.devcluster.cluster import DevCluster
    from slurm_gandiva.slurm.base import SlurmBackend, SlurmJob

DEMO_USER = "gandiva-demo"
DEMO_USER2 = "gandiva-demo2"
# The two tenants of the two-user demo: (account, user), equal shares.
TENANTS = (("vision", DEMO_USER), ("nlp", DEMO_USER2))
DEFAULT_STATE_DIR = "/tmp/gandiva-demo"
DEFAULT_PORT_BASE = 26000
RESULTS_FILE = "demo-results.json"
ROUND_LOG = "rounds.jsonl"  # in the controller's state dir: what the policy saw and decided, each round
HASH_PREFIX = "final_params_sha256="


@dataclass(frozen=True)
class DemoJob:
    """One job of the demo workload. `steps` mini-batches of `batch` samples, `sleep` s per mini-batch
    standing for GPU time (split over the ranks, so more GPUs run it faster)."""

    name: str
    min_gpus: int
    max_gpus: int
    steps: int
    batch: int = 32
    sleep: float = 0.2
    hidden: int = 16
    tenant: int = 0  # which of TENANTS submits it (the two-user demo)
    delay: float = 0.0  # seconds after the demo starts that it is submitted

    @property
    def gpus_arg(self) -> str:
        return str(self.min_gpus) if self.min_gpus == self.max_gpus else f"{self.min_gpus}:{self.max_gpus}"

    @property
    def total_samples(self) -> int:
        return self.steps * self.batch


# 12 jobs asking for 20 GPUs at their minimum on an 8-GPU cluster: about 2.5x oversubscribed; c1 is wider
# than a node (6 GPUs: 3 on each of n1 and n2, the same three). Each is
# 16-90 s of "GPU time" on its minimum, most longer than a quantum (30 s), so slices really rotate; a
# slice also pays a torch start-up (5-20 s on 2 busy cores). The lengths were picked, among random
# draws, as the least sensitive in the simulator to start-up jitter (a job that would end a few seconds
# after a rotation is suspended or not on a second's difference, which moves its JCT by a whole wait);
# `bench_sim_vs_real.py` prints how far each job moves when the measured costs are off by 25%.
WORKLOAD: tuple[DemoJob, ...] = (
    DemoJob("a1", 1, 1, 100),
    DemoJob("a2", 1, 1, 80),
    DemoJob("e1", 1, 2, 260),
    DemoJob("a3", 1, 1, 350),
    DemoJob("e2", 1, 4, 240),
    DemoJob("a4", 1, 1, 420),
    DemoJob("e3", 1, 2, 440),
    DemoJob("a5", 1, 1, 320),
    DemoJob("b1", 2, 2, 180),
    DemoJob("b3", 2, 2, 350),
    DemoJob("b2", 2, 2, 290),
    DemoJob("c1", 6, 6, 260),
)


# The two-user demo: a search of eight 1-GPU jobs fills the 8 GPUs; 20 s later the other tenant submits
# three jobs (5 GPUs at their minimum) and, with equal shares, gets 4 of the 8 GPUs within a rotation.
TENANT_WORKLOAD: tuple[DemoJob, ...] = (
    *(DemoJob(f"s{i}", 1, 1, steps) for i, steps in enumerate((300, 340, 280, 360, 320, 300, 380, 260), 1)),
    DemoJob("n1", 2, 2, 600, tenant=1, delay=20.0),
    DemoJob("n2", 1, 2, 640, tenant=1, delay=20.0),
    DemoJob("n3", 2, 2, 520, tenant=1, delay=20.0),
)


def tenant_table(results: Sequence[JobResult], tenant_of: Mapping[str, int]) -> str:
    """Each tenant's jobs, GPU-seconds received in all and while contested (every tenant had a job waiting:
    each wanted more than it held), and its share of the contested GPU-time; from the slice history, in
    whole seconds."""
    tenants = sorted(set(tenant_of.values()))
    total: dict[int, float] = {}
    for r in results:
        t = tenant_of.get(r.job_id, 0)
        total[t] = total.get(t, 0.0) + sum(g * max(0.0, (e if e is not None else r.ended or a) - a)
                                           for a, e, g, _ in r.slice_log)
    contested: dict[int, float] = dict.fromkeys(tenants, 0.0)
    ends = [r.ended for r in results if r.ended is not None]
    if ends and len(tenants) > 1:
        for second in range(int(min(r.submitted for r in results)), int(max(ends)) + 1):
            now = second + 0.5
            held = dict.fromkeys(tenants, 0)
            waits = dict.fromkeys(tenants, False)
            for r in results:
                if not r.submitted <= now < (r.ended or now + 1):
                    continue
                t = tenant_of.get(r.job_id, 0)
                gpus = sum(g for a, e, g, _ in r.slice_log if a <= now < (e if e is not None else now + 1))
                held[t] += gpus
                waits[t] = waits[t] or gpus == 0
            if all(waits.values()):
                for t in tenants:
                    contested[t] += held[t]
    both = sum(contested.values()) or 1.0
    lines = [f"{'ACCOUNT':<8} {'USER':<14} {'JOBS':>4} {'GPU-S':>7} {'CONTESTED':>9} {'SHARE':>6} {'AVG JCT':>8}"]
    for t in tenants:
        account, user = TENANTS[t]
        mine = [r for r in results if tenant_of.get(r.job_id) == t]
        jcts = [r.jct for r in mine if r.jct is not None]
        avg = f"{sum(jcts) / len(jcts):7.0f}s" if jcts else f"{'-':>8}"
        lines.append(f"{account:<8} {user:<14} {len(mine):>4} {total.get(t, 0.0):7.0f} "
                     f"{contested[t]:9.0f} {contested[t] / both:6.0%} {avg}")
    return "\n".join(lines)


def slurm_bin_dirs() -> list[str]:
    """Where this process finds Slurm's commands (a release built into its own prefix comes first on PATH):
    jobs must run the same release's scontrol."""
    return list(dict.fromkeys(os.path.dirname(exe) for c in ("scontrol", "slurmctld") if (exe := shutil.which(c))))


def train_command(job: DemoJob, python: str, script: Path) -> list[str]:
    """The training command of one demo job (examples/train.py): exactly `job.steps` mini-batches."""
    dataset = 512
    epochs = -(-job.total_samples // dataset) + 1  # enough epochs that --steps is what stops it
    return [
        python, str(script),
        "--steps", str(job.steps),
        "--epochs", str(epochs),
        "--samples", str(dataset),
        "--batch-size", str(job.batch),
        "--hidden", str(job.hidden),
        "--sleep-per-step", str(job.sleep),
    ]


def controller_config(
    *, state_dir: Path, jobs_dir: Path, topology: Path, slurm_conf: Path, quantum: float, tick: float,
    policy: str, params: Mapping[str, str] | None = None, fairness: str = "none", co_hold: bool = False,
) -> str:
    """The controller's config file for the demo (format: etc/gandiva.conf)."""
    lines = [
        "# written by `gandiva demo`",
        f"state_dir = {state_dir}",
        f"jobs_dir = {jobs_dir}",
        f"topology_file = {topology}",
        f"slurm_conf = {slurm_conf}",
        f"quantum = {quantum:g}",
        f"tick = {tick:g}",
        f"policy = {policy}",
        "metrics_port = 0",
        f"round_log = {state_dir / ROUND_LOG}",
        f"fairness = {fairness}",
        f"co_hold = {'yes' if co_hold else 'no'}",
    ]
    lines += [f"policy.{k} = {v}" for k, v in (params or {}).items()]
    return "\n".join([*lines, ""])


def policy_params(policy: str, quantum: float, extra: Sequence[str] = ()) -> dict[str, str]:
    """The demo's policy parameters: short jobs need slices as short as the quantum to show time-slicing
    (the policies' defaults suit hour-long jobs), no packing trials, then the user's KEY=VALUE overrides."""
    params: dict[str, str] = {}
    if policy == "default":
        params = {"min_slice": f"{quantum:g}", "probe": f"{quantum:g}"}
    elif policy in ("gandiva", "afs-l", "srtf", "tiresias"):
        params = {"min_slice": f"{quantum:g}"}
    if policy in ("default", "gandiva"):
        # Jobs are submitted without gres, so a first placement on shards would work, but Slurm 22.05 can
        # neither take shards away from a job nor switch it back to whole GPUs: a packed job could never be
        # unpacked or moved off its GPUs. Packing stays off in the demo (not verified end to end).
        params["pack"] = "false"
    for item in extra:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--policy-param {item!r}: write it as KEY=VALUE, e.g. min_slice=20")
        params[key.strip()] = value.strip()
    return params


# ----- what the live table and the verdict are built from -----

@dataclass(frozen=True)
class JobRow:
    """One submitted demo job at one instant."""

    job_id: str
    job: DemoJob
    submitted: float
    slurm: SlurmJob | None = None
    progress: Progress | None = None
    outcome: str | None = None  # status.json's outcome, once written


def job_state(row: JobRow) -> str:
    """running / suspended / queued / done / failed / cancelled / lost."""
    sj = row.slurm
    if sj is None:
        return "lost"
    if sj.running:
        return "running"
    if sj.pending:
        return "suspended" if sj.restart_count > 0 or row.progress is not None else "queued"
    if sj.state == "COMPLETED":
        return "done" if row.outcome in (None, "done") else "failed"
    return sj.state.lower()


def slice_count(sj: SlurmJob | None) -> int:
    """Slices a job has had: each requeue ended one; a job that is not pending has one more."""
    if sj is None:
        return 0
    return sj.restart_count + (0 if sj.pending else 1)


def where(sj: SlurmJob | None) -> str:
    if sj is None or not sj.running:
        return "-"
    parts = [f"{n}:{'+'.join(map(str, g))}" for n, g in sorted(sj.gpus.items()) if g]
    parts += [f"{n}:{'+'.join(map(str, g))}(s)" for n, g in sorted(sj.shards.items()) if g]
    return ",".join(parts) or ",".join(sj.nodes) or "?"


def render_table(rows: Sequence[JobRow], now: float, started: float, total_gpus: int) -> str:
    """The compact live table."""
    states = [job_state(r) for r in rows]
    busy = sum(
        sum(len(g) for g in r.slurm.gpus.values()) for r in rows if r.slurm is not None and r.slurm.running
    )
    counts = " ".join(f"{s} {states.count(s)}" for s in ("running", "suspended", "queued", "done")
                      if states.count(s))
    head = f"t={now - started:5.0f}s  {counts}  GPUs busy {busy}/{total_gpus}"
    lines = [head, f"{'JOB':>6} {'NAME':<4} {'GPUS':<4} {'STATE':<9} {'WHERE':<12} {'PROGRESS':<17} "
                   f"{'SAMPLES/S':>9} {'SLICES':>6}"]
    for r, st in zip(rows, states, strict=True):
        done = r.progress.samples if r.progress else 0
        frac = min(1.0, done / r.job.total_samples) if r.job.total_samples else 0.0
        if st == "done":
            frac = 1.0
        bar = "#" * round(frac * 10) + "." * (10 - round(frac * 10))
        rate = f"{r.progress.samples_per_s:9.1f}" if r.progress and st == "running" else f"{'-':>9}"
        slices = slice_count(r.slurm)
        lines.append(
            f"{r.job_id:>6} {r.job.name:<4} {r.job.gpus_arg:<4} {st:<9} {where(r.slurm):<12} "
            f"{bar} {frac * 100:4.0f}% {rate} {slices:>6}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class JobResult:
    """A finished demo job: what benchmarks compare (times are unix seconds)."""

    job_id: str
    name: str
    min_gpus: int
    max_gpus: int
    total_samples: int
    submitted: float
    started: float | None
    ended: float | None
    state: str
    slices: int
    final_hash: str | None
    rates: tuple[tuple[int, float], ...] = ()  # (GPUs, median samples/s measured at that count)
    slice_log: tuple[tuple[float, float | None, int, str], ...] = ()  # (start, end, GPUs, end reason)

    @property
    def jct(self) -> float | None:
        return None if self.ended is None else self.ended - self.submitted


@dataclass(frozen=True)
class DemoResult:
    """The whole run: per-job results, settings, wall times."""

    jobs: tuple[JobResult, ...]
    started: float
    finished: float
    quantum: float
    policy: str
    failures: tuple[str, ...] = field(default_factory=tuple)
    params: tuple[tuple[str, str], ...] = ()  # the policy's parameters as written in the config
    tick: float = 3.0  # the controller's tick
    slurm: str = "22.05.8"  # the Slurm release it ran on (runs before it was recorded: 22.05)
    requeue_ties: bool = True  # that Slurm tied requeued jobs to their old GPU indices

    def to_json(self) -> str:
        d = asdict(self)
        for j, r in zip(d["jobs"], self.jobs, strict=True):
            j["jct"] = r.jct
        return json.dumps(d, indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> DemoResult:
        d = json.loads(text)
        jobs = tuple(
            JobResult(**{
                **{k: v for k, v in j.items() if k != "jct"},
                "rates": tuple((int(k), float(r)) for k, r in j.get("rates", ())),
                "slice_log": tuple(
                    (float(a), None if b is None else float(b), int(k), str(why))
                    for a, b, k, why in j.get("slice_log", ())
                ),
            })
            for j in d["jobs"]
        )
        return DemoResult(jobs, d["started"], d["finished"], d["quantum"], d["policy"],
                          tuple(d.get("failures", ())), tuple((str(k), str(v)) for k, v in d.get("params", ())),
                          float(d.get("tick", 3.0)), str(d.get("slurm", "22.05.8")),
                          bool(d.get("requeue_ties", True)))


def measured_rate(row: JobRow, now: float, fresh: float) -> tuple[int, float] | None:
    """(GPUs, samples/s) from a running job's progress report, when it is recent and matches the GPUs held."""
    p, sj = row.progress, row.slurm
    if p is None or sj is None or not sj.running or p.samples_per_s <= 0:
        return None
    held = sum(len(g) for g in sj.gpus.values()) + sum(len(g) for g in sj.shards.values())
    if p.world_size != held or now - p.updated > 2 * fresh or p.updated < sj.start_time + 2 * fresh:
        return None  # stale, from an earlier slice, or still warming up
    return held, p.samples_per_s


def failures(rows: Sequence[JobRow], hashes: Mapping[str, str | None]) -> list[str]:
    """Why the demo failed (empty: every job finished cleanly with a final hash)."""
    out = []
    for r in rows:
        st = job_state(r)
        if st != "done":
            out.append(f"job {r.job_id} ({r.job.name}) ended {st}")
        elif not hashes.get(r.job_id):
            out.append(f"job {r.job_id} ({r.job.name}) finished without printing {HASH_PREFIX}")
    return out


def final_hash(output: Path) -> str | None:
    """The last final_params_sha256 the job printed, if any."""
    try:
        text = output.read_text(errors="replace")
    except OSError:
        return None
    found = [ln.split(HASH_PREFIX, 1)[1].strip() for ln in text.splitlines() if HASH_PREFIX in ln]
    return found[-1] if found else None


def read_outcome(files: JobFiles) -> str | None:
    try:
        d = json.loads(files.status.read_text())
    except (OSError, ValueError):
        return None
    out = d.get("outcome") if isinstance(d, dict) else None
    return out if isinstance(out, str) else None


# ----- the run -----

def ensure_user(name: str) -> None:
    """Create a non-root user for the jobs if it does not exist."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    proc = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name],
                          capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 9):  # 9: already exists (a concurrent creator)
        raise ConfigError(f"could not create user {name}: {proc.stderr.strip()}: create it with useradd")


class Demo:
    """One demo run; `run()` returns the exit code."""

    def __init__(
        self,
        state_dir: Path,
        *,
        port_base: int = DEFAULT_PORT_BASE,
        quantum: float = 30.0,
        tick: float = 3.0,
        policy: str = "gandiva",
        params: Sequence[str] = (),
        user: str = DEMO_USER,
        workload: Sequence[DemoJob] = WORKLOAD,
        timeout: float = 900.0,
        refresh: float = 3.0,
        keep_cluster: bool = False,
        tenants: bool = False,
        co_hold: bool = False,
        out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.state_dir = state_dir.absolute()
        self.port_base = port_base
        self.quantum = quantum
        self.tick = tick
        self.policy = policy
        self.params = policy_params(policy, quantum, params)
        self.user = user
        self.tenants = tenants
        self.co_hold = co_hold
        self.workload = tuple(workload)
        self.timeout = timeout
        self.refresh = refresh
        self.keep_cluster = keep_cluster
        self.out = out
        self.clock = clock
        self.sleep = sleep
        self.bin = Path(sys.executable).parent
        self.repo = Path(__file__).resolve().parent.parent

    def say(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)

    @property
    def config_path(self) -> Path:
        return self.state_dir / "gandiva.conf"

    @property
    def results_path(self) -> Path:
        return self.state_dir / RESULTS_FILE

    @property
    def gantt_path(self) -> Path:
        return self.state_dir / "gantt.png"

    def run(self) -> int:
        from slurm_gandiva.devcluster.cluster import DevCluster

        if os.geteuid() != 0:
            raise ConfigError("gandiva demo needs root (it starts Slurm daemons): run it with sudo")
        script = self.repo / "examples" / "train.py"
        if not script.is_file():
            raise ConfigError(f"{script} is missing: run the demo from a source checkout")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cluster = DevCluster(self.state_dir / "cluster", nodes=2, gpus_per_node=4, port_base=self.port_base,
                             accounting=self.tenants)
        caps = cluster.capabilities
        where = os.path.dirname(os.path.dirname(shutil.which("slurmctld") or "/usr/sbin/slurmctld"))
        self.say(f"demo: Slurm {caps.release_text} ({where}): bringing up a 2-node x 4-GPU cluster in "
                 f"{cluster.state_dir} ...")
        previous = signal.signal(signal.SIGTERM, _terminate)  # so `finally` stops what we started
        try:
            return self._run_on(cluster, script)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run_on(self, cluster: DevCluster, script: Path) -> int:
        # A fresh Slurm state each run: job ids from 1, no jobs of an earlier run for the controller to adopt.
        cluster.down()
        if cluster.state_dir.exists():
            shutil.rmtree(cluster.state_dir)
        cluster.up()
        controller: subprocess.Popen[bytes] | None = None
        try:
            ensure_user(self.user)
            if self.tenants:
                for account, user in TENANTS:
                    ensure_user(user)
                    cluster.add_account(account, fairshare=1)
                    cluster.add_user(user, account)
                self.say("demo: accounts " + ", ".join(f"{a} (user {u}, 1 share)" for a, u in TENANTS))
            controller = self._start_controller(cluster)
            return self._drive(cluster, controller, script)
        finally:
            if controller is not None:
                self._stop_controller(controller)
            if self.keep_cluster:
                self.say(f"demo: cluster left up (SLURM_CONF={cluster.conf_path}); stop it with "
                         f"`gandiva devcluster down --state-dir {cluster.state_dir}`")
            else:
                cluster.down()
                self.say("demo: cluster stopped")

    def _gandiva(self) -> str:
        exe = self.bin / "gandiva"
        return str(exe) if exe.exists() else "gandiva"

    def _start_controller(self, cluster: DevCluster) -> subprocess.Popen[bytes]:
        ctl_state = self.state_dir / "controller"
        if ctl_state.exists():
            shutil.rmtree(ctl_state)  # a fresh history for each demo run
        ctl_state.mkdir(parents=True)
        self.config_path.write_text(controller_config(
            state_dir=ctl_state, jobs_dir=cluster.jobs_dir, topology=cluster.topology_path,
            slurm_conf=cluster.conf_path, quantum=self.quantum, tick=self.tick, policy=self.policy,
            params=self.params, fairness="shares" if self.tenants else "none", co_hold=self.co_hold,
        ))
        log = (self.state_dir / "controller.log").open("wb")
        self.say(f"demo: starting the controller (policy {self.policy}, quantum {self.quantum:g} s"
                 f"{', fair shares' if self.tenants else ''}; "
                 f"log {self.state_dir / 'controller.log'})")
        env = {**os.environ, **cluster.env}
        proc = subprocess.Popen(
            [self._gandiva(), "-v", "controller", "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        log.close()
        self.sleep(1.0)
        if proc.poll() is not None:
            raise GandivaError(f"the controller exited at start ({proc.returncode}): see "
                               f"{self.state_dir / 'controller.log'}")
        return proc

    def _stop_controller(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.say(f"demo: controller stopped (exit {proc.returncode})")

    def _user(self, job: DemoJob) -> str:
        return TENANTS[job.tenant][1] if self.tenants else self.user

    def _submit(self, cluster: DevCluster, job: DemoJob, script: Path) -> str:
        jobs = cluster.jobs_dir
        argv = [
            "runuser", "-u", self._user(job), "--",
            self._gandiva(), "sbatch", "--parsable", "--gpus", job.gpus_arg, "--model", "demo",
            "--total-samples", str(job.total_samples), "-J", job.name, "-o", f"{jobs}/%j.out",
            f"--chdir={jobs}", "--", *train_command(job, str(self.bin / "python"), script),
        ]
        env = {
            "PATH": ":".join(dict.fromkeys([str(self.bin), *slurm_bin_dirs(), "/usr/sbin", "/usr/bin", "/bin"])),
            "SLURM_CONF": str(cluster.conf_path),
            "GANDIVA_JOBS_ROOT": str(jobs),
            "GANDIVA_TOPOLOGY": str(cluster.topology_path),
            "LANG": "C.UTF-8",
        }
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=jobs, check=False,
                              timeout=60)
        if proc.returncode != 0:
            raise GandivaError(f"gandiva sbatch for {job.name} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def _drive(self, cluster: DevCluster, controller: subprocess.Popen[bytes], script: Path) -> int:
        from slurm_gandiva.slurm import make_backend

        backend = make_backend(cluster.env)
        started = self.clock()
        users = sorted({self._user(j) for j in self.workload})
        self.say(f"demo: submitting {len(self.workload)} jobs as {', '.join(users)} "
                 f"({sum(j.min_gpus for j in self.workload)} GPUs asked at minimum, 8 GPUs in the cluster)")
        submitted: list[tuple[str, DemoJob, float]] = []
        later = list(self.workload)

        def submit_due(now: float) -> None:
            due = [j for j in later if now >= started + j.delay]
            for job in due:
                later.remove(job)
                submitted.append((self._submit(cluster, job, script), job, self.clock()))
            if due:
                self.say(f"demo: {self._user(due[0])} submitted "
                         + " ".join(f"{jid}({j.name}:{j.gpus_arg})" for jid, j, _ in submitted[-len(due):]))

        submit_due(started)
        tty = self.out.isatty()
        last_print = 0.0
        ended: dict[str, float] = {}
        first_run: dict[str, float] = {}
        seen_rates: dict[str, dict[int, list[float]]] = {}
        rows: list[JobRow] = []
        deadline = started + self.timeout
        while True:
            submit_due(self.clock())
            rows = self._observe(backend, cluster, submitted)
            now = self.clock()
            for r in rows:
                st = job_state(r)
                if st == "running":
                    first_run.setdefault(r.job_id, now)
                    rate = measured_rate(r, now, self.refresh)
                    if rate is not None:
                        seen_rates.setdefault(r.job_id, {}).setdefault(rate[0], []).append(rate[1])
                if st not in ("running", "suspended", "queued"):
                    end = r.slurm.end_time if r.slurm is not None and r.slurm.end_time > 0 else now
                    ended.setdefault(r.job_id, end)
            all_over = len(ended) == len(rows) and not later
            if tty or now - last_print >= max(self.refresh, 15.0) or all_over:
                table = render_table(rows, now, started, cluster.nodes * cluster.gpus_per_node)
                self.say(("\x1b[H\x1b[J" if tty else "\n") + table)
                last_print = now
            if all_over:
                break
            if controller.poll() is not None:
                self.say(f"demo: FAILED: the controller exited ({controller.returncode}); see "
                         f"{self.state_dir / 'controller.log'}")
                return 1
            if now > deadline:
                self.say(f"demo: FAILED: jobs still unfinished after {self.timeout:g} s")
                break
            self.sleep(self.refresh)
        finished = self.clock()
        hashes = {r.job_id: final_hash(cluster.jobs_dir / f"{r.job_id}.out") for r in rows}
        slices = self._slices(cluster, [r.job_id for r in rows])
        bad = failures(rows, hashes)
        per_node = cluster.gpus_per_node
        for r in rows:
            if r.job.min_gpus > per_node and not any(n > per_node for _, _, n, _ in slices.get(r.job_id, ())):
                bad.append(f"job {r.job_id} ({r.job.name}) is wider than a node but no slice of it spans nodes")
        result = DemoResult(
            tuple(
                JobResult(
                    r.job_id, r.job.name, r.job.min_gpus, r.job.max_gpus, r.job.total_samples, r.submitted,
                    first_run.get(r.job_id), ended.get(r.job_id), job_state(r),
                    slice_count(r.slurm), hashes.get(r.job_id),
                    tuple((k, statistics.median(v)) for k, v in sorted(seen_rates.get(r.job_id, {}).items())),
                    slices.get(r.job_id, ()),
                )
                for r in rows
            ),
            started, finished, self.quantum, self.policy, tuple(bad), tuple(self.params.items()), self.tick,
            cluster.capabilities.release_text, cluster.capabilities.requeue_keeps_gpu_indices,
        )
        self.results_path.write_text(result.to_json())
        self._reports(cluster, [r.job_id for r in rows])
        self._switches()
        if self.tenants:
            self.say("\ndemo: GPU-time per tenant (CONTESTED: GPU-seconds while both tenants had a job waiting; "
                     "equal shares: 50% each)")
            self.say(tenant_table(result.jobs, {jid: j.tenant for jid, j, _ in submitted}))
            self._sshare(cluster)
        jcts = [j.jct for j in result.jobs if j.jct is not None]
        if jcts:
            self.say(f"demo: {len(jcts)} jobs finished; average JCT {sum(jcts) / len(jcts):.0f} s, makespan "
                     f"{finished - started:.0f} s; results in {self.results_path}")
        if bad:
            for b in bad:
                self.say(f"demo: FAILED: {b}")
            return 1
        self.say("demo: OK: every job finished")
        return 0

    def _observe(self, backend: SlurmBackend, cluster: DevCluster,
                 submitted: Sequence[tuple[str, DemoJob, float]]) -> list[JobRow]:
        from slurm_gandiva.requeue.namespace import job_paths

        by_id = {j.job_id: j for j in backend.jobs()}
        rows = []
        for jid, job, t in submitted:
            sj = by_id.get(jid)
            state = cluster.jobs_dir / jid
            if sj is not None:  # in the submission's private directory (issue 29)
                with contextlib.suppress(GandivaError):
                    state = job_paths(cluster.jobs_dir, jid, sj.comment, sj.user).state_dir
            files = JobFiles(state)
            rows.append(JobRow(jid, job, t, sj, read_progress(files.progress), read_outcome(files)))
        return rows

    def _slices(
        self, cluster: DevCluster, job_ids: Sequence[str]
    ) -> dict[str, tuple[tuple[float, float | None, int, str], ...]]:
        """Each job's slices from the controller's history (`gandiva sacct --json`); empty if unreadable."""
        env = {**os.environ, **cluster.env}
        proc = subprocess.run(
            [self._gandiva(), "sacct", "--config", str(self.config_path), "-j", ",".join(job_ids), "--json"],
            capture_output=True, text=True, env=env, check=False, timeout=120,
        )
        out: dict[str, list[tuple[float, float | None, int, str]]] = {}
        try:
            for s in json.loads(proc.stdout)["slices"]:
                out.setdefault(str(s["job_id"]), []).append(
                    (float(s["start_unix"]), None if s["end_unix"] is None else float(s["end_unix"]),
                     len(s["gpus"]), str(s["reason"] or ""))
                )
        except (ValueError, KeyError, TypeError):
            self.say(f"demo: could not read the slice history: {proc.stderr.strip()}")
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def _reports(self, cluster: DevCluster, job_ids: Sequence[str]) -> None:
        env = {**os.environ, **cluster.env}
        jobs = ",".join(job_ids)
        self.say("\ndemo: slice history (gandiva sacct):")
        sacct = subprocess.run([self._gandiva(), "sacct", "--config", str(self.config_path), "-j", jobs],
                               capture_output=True, text=True, env=env, check=False, timeout=120)
        self.say(sacct.stdout.rstrip() or sacct.stderr.strip())
        gantt = subprocess.run(
            [self._gandiva(), "report", "--config", str(self.config_path), "-j", jobs, "--topology",
             str(cluster.topology_path), "--gantt", str(self.gantt_path)],
            capture_output=True, text=True, env=env, check=False, timeout=120,
        )
        if gantt.returncode == 0 and self.gantt_path.exists():
            if gantt.stdout.strip():
                self.say(gantt.stdout.rstrip())
            self.say(f"demo: Gantt chart: {self.gantt_path}")
        else:
            self.say(f"demo: could not draw the Gantt chart: {gantt.stderr.strip()}")


    def _switches(self) -> None:
        """How the controller switched jobs: in place (park / unpark on co-held GPUs) or through the requeue
        protocol (suspend, then a resume in a new process), from its store."""
        from slurm_gandiva.plan import Action
        from slurm_gandiva.store import Outcome, Store

        try:
            store = Store(f"sqlite:///{self.state_dir / 'controller' / 'gandiva.db'}")
        except Exception as exc:  # the report is informative; the verdict does not depend on it
            self.say(f"demo: could not read the controller's decisions: {exc}")
            return
        try:
            done = [d.action for d in store.decisions() if d.outcome is Outcome.SUCCEEDED]
        finally:
            store.close()
        n = {a: done.count(a) for a in Action}
        self.say(f"demo: switches: {n[Action.PARK]} parks and {n[Action.UNPARK]} unparks in place (co-held GPUs, "
                 f"co_hold = {'yes' if self.co_hold else 'no'}), {n[Action.SUSPEND]} suspends through the requeue "
                 f"path; {n[Action.MIGRATE] + n[Action.RESIZE]} moves and resizes")

    def _sshare(self, cluster: DevCluster) -> None:
        out = subprocess.run(["sshare", "-a", "-o", "Account,User%14,RawShares,NormShares,RawUsage,FairShare"],
                             capture_output=True, text=True, env={**os.environ, **cluster.env}, check=False,
                             timeout=60)
        self.say("\ndemo: Slurm's own sshare (usage in CPU-seconds, as slurmdbd accounted the jobs):")
        self.say(out.stdout.rstrip() or out.stderr.strip())


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("demo", help="run the end-to-end demo on a local Slurm cluster",
                              description=__doc__)
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="where the cluster, controller and results go")
    p.add_argument("--port-base", type=int, default=DEFAULT_PORT_BASE, help="Slurm ports start here")
    p.add_argument("--quantum", type=float, default=30.0,
                   help="time-slice length in seconds (a slice pays a torch start-up of 5-20 s here)")
    p.add_argument("--tick", type=float, default=3.0, help="controller tick in seconds")
    p.add_argument("--policy", default="gandiva", help="the controller's policy (gandiva: time-slices)")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a policy parameter (repeatable); the demo sets min_slice to the quantum")
    p.add_argument("--user", default=DEMO_USER, help="the non-root user that submits the jobs")
    p.add_argument("--timeout", type=float, default=900.0, help="give up if jobs are unfinished after this")
    p.add_argument("--keep-cluster", action="store_true", help="leave the Slurm cluster up at the end")
    p.add_argument("--one-user", action="store_true",
                   help="one user's 12-job workload without accounting (the sim-vs-real benchmark's), "
                        "instead of two tenants with fair shares")
    p.add_argument("--no-co-hold", dest="co_hold", action="store_false",
                   help="switch jobs only through the requeue protocol (default: co_hold = yes, jobs taking "
                        "turns on the same GPUs park and unpark in place where Slurm allows)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return Demo(
        Path(args.state_dir), port_base=args.port_base, quantum=args.quantum, tick=args.tick,
        policy=args.policy, params=args.policy_param, user=args.user, timeout=args.timeout,
        keep_cluster=args.keep_cluster, tenants=not args.one_user, co_hold=args.co_hold,
        workload=WORKLOAD if args.one_user else TENANT_WORKLOAD,
    ).run()
