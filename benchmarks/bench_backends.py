"""The pyslurm backend against the CLI backend, side by side on one Slurm 25.11 devcluster.

Starts its own DevCluster (port base 18800 unless --port-base) and times, alternating the two backends:
  snapshot()   with 10 / 100 / 1,000 jobs in the queue (held `sleep` jobs, one sbatch each: a pending
               `--array` is one record in slurmctld until its tasks split, so it would not fill the queue);
  job()        one held job;
  hold, release, update(gres)   on a held job that cannot start (begin time an hour ahead);
  suspend, resume              RequeueProtocol on a running job that requeue-holds itself on USR2, moved
                               between GPUs each cycle (wall time of each operation, Slurm's waits included,
                               and the time in the steps that only talk to Slurm);
  snapshot() once more with that job suspended (a job whose reason pyslurm cannot tell: see
               slurm/pyslurm_backend.py);
  controller rounds   then, on the same cluster restarted with an empty queue, `Controller.tick()` with
               10 / 100 / 1,000 managed jobs (one-GPU, submitted as `gandiva sbatch` does, 8 of them
               running on the 8 GPUs): one Controller per backend over one shared store, the two ticking
               in turn; the timed rounds are steady ones (the policy runs and decides nothing).
Prints a table (median ms, pyslurm / CLI ratio) under the Slurm release and writes it to
benchmarks/results/backends.txt. The devcluster is stopped on any exit (error, Ctrl-C, SIGTERM).

    PATH=/opt/slurm-gandiva/25.11/sbin:/opt/slurm-gandiva/25.11/bin:$PATH \
    LD_LIBRARY_PATH=/opt/slurm-gandiva/25.11/lib .venv/bin/python benchmarks/bench_backends.py \
        --port-base 21800 [--repeats 10] [--parts ops,rounds]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from slurm_gandiva.config import load_config
from slurm_gandiva.controller.service import Controller, TickReport
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.model import ClusterView, GpuRef, JobState, Placement
from slurm_gandiva.requeue.contract import JobFiles, Progress, write_progress
from slurm_gandiva.requeue.operations import OpResult, Outcome, Step
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmBackend, Snapshot, SubmitRequest
from slurm_gandiva.slurm.cli_backend import CliBackend
from slurm_gandiva.store import Store

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "backends.txt"
SLEEPER = "#!/bin/bash\nsleep 3600\n"
REQUEUE_SELF = """#!/bin/bash
trap 'scontrol requeuehold $SLURM_JOB_ID' USR2
sleep 3600 & wait
sleep 60
"""


NOTES = (
    "snapshot() = all jobs + all nodes. The pyslurm backend submits through sbatch and reads with\n"
    "squeue the jobs pyslurm 25.11 cannot describe (a reason from a state description, e.g. every\n"
    "requeue-held job; GPUs of running jobs without per-GPU typed gres; jobs being torn down): the\n"
    "suspend/resume rows include those reads. The protocol's wall times are dominated by Slurm's own\n"
    "waits (the job's requeue and kill, the 1.5 s credential guard, the next scheduling pass after the\n"
    "release: sched_interval=2 s); 'Slurm calls only' sums the steps that only talk to Slurm (signal,\n"
    "admin hold; set placement, clear begin time, verify). job()/hold/release/update ran with 10 jobs\n"
    "in the queue, the protocol cycles and the snapshot with 1 suspended with the full queue.\n"
)
ROUND_NOTES = (
    "Controller rounds ran on the same devcluster restarted with an empty queue (slurmctld's saved\n"
    "state dropped: the cancelled fill jobs would stay in every snapshot for MinJobAge = 600 s). N\n"
    "one-GPU jobs submitted through `gandiva sbatch`'s submit() (held, marked, state dir, spec file),\n"
    "policy gandiva with quantum 3600 s and pack / migrate / grow off; 8 of them run (`sleep` under\n"
    "gandiva-wrapper) on the 8 GPUs, the others wait admin-held. One Controller per backend over one\n"
    "shared SQLite store (the same rows for both; a steady round writes nothing), ticking in turn.\n"
    "A timed round is one Controller.tick(): snapshot() (all jobs + all nodes); reconcile's settle (per\n"
    "managed job its store record and current slice, plus the store's active jobs); observe (per job\n"
    "its store record, rates and progress.json, written for every job as its wrapper leaves it, one\n"
    "slices query for all); the gandiva policy's decide; the plan check and the metrics update. No act:\n"
    "every timed round was checked to settle nothing and decide nothing (untimed rounds before them\n"
    "registered and admin-held the jobs and started the first 8). 'of which snapshot()' is the time in\n"
    "backend.snapshot() within those rounds; the rest is the same code for both backends, mostly the\n"
    "store's 4 queries per job (one SQLAlchemy session each). 2 cores shared with other work: absolute\n"
    "times are noisy, compare the ratios within one run.\n"
)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def fill_queue(env: dict[str, str], job_dir: Path, target: int, backend: SlurmBackend) -> None:
    """Held sleep jobs, one sbatch each, until `target` jobs are in the queue."""
    have = len(backend.jobs())
    for _ in range(target - have):
        subprocess.run(
            ["sbatch", "--parsable", "--hold", f"--chdir={job_dir}", "-o", "/dev/null", "--job-name=bench-fill"],
            input=SLEEPER, env=env, capture_output=True, text=True, check=True,
        )


class Bench:
    def __init__(self, cli: SlurmBackend, ps: SlurmBackend, repeats: int) -> None:
        self.backends = {"CLI": cli, "pyslurm": ps}
        self.repeats = repeats
        self.rows: list[tuple[str, float, float]] = []

    def row(self, name: str, op: Callable[[SlurmBackend], object], repeats: int | None = None) -> None:
        """Median wall time of `op` per backend, the backends alternating run by run."""
        got: dict[str, list[float]] = {"CLI": [], "pyslurm": []}
        for _ in range(repeats or self.repeats):
            for key, backend in self.backends.items():
                got[key].append(timed(functools.partial(op, backend)))
        cli_ms, ps_ms = statistics.median(got["CLI"]), statistics.median(got["pyslurm"])
        self.rows.append((name, cli_ms, ps_ms))
        print(f"  {name:<36} CLI {cli_ms:9.1f} ms   pyslurm {ps_ms:9.1f} ms   ratio {ps_ms / cli_ms:5.2f}", flush=True)

    def add(self, name: str, cli_ms: list[float], ps_ms: list[float]) -> None:
        c, p = statistics.median(cli_ms), statistics.median(ps_ms)
        self.rows.append((name, c, p))
        print(f"  {name:<36} CLI {c:9.1f} ms   pyslurm {p:9.1f} ms   ratio {p / c:5.2f}", flush=True)

    def table(self, header: str) -> str:
        lines = [header, "", f"{'operation':<36}{'CLI ms':>10}{'pyslurm ms':>12}{'pyslurm/CLI':>13}"]
        lines.append("-" * len(lines[-1]))
        for name, c, p in self.rows:
            lines.append(f"{name:<36}{c:>10.1f}{p:>12.1f}{p / c:>13.2f}")
        return "\n".join(lines) + "\n"


WAITS = (Step.WAIT_REQUEUE, Step.WAIT_CHECKPOINT, Step.ESCALATE, Step.RELEASE, Step.WAIT_RUNNING)


def cycle(proto: RequeueProtocol, jid: str, placement: Placement) -> tuple[float, float, float, float]:
    """One suspend + resume of `jid` onto `placement`: (suspend ms, resume ms, and of each the ms spent in
    the steps that only talk to Slurm: signal + admin hold; set placement + clear begin + verify). RELEASE
    is counted as a wait: it includes the credential guard's sleep."""
    t0 = time.perf_counter()
    sus = proto.suspend(jid)
    t1 = time.perf_counter()
    if sus.outcome is not Outcome.SUSPENDED:
        raise SystemExit(f"suspend of {jid} ended {sus.outcome.value}:\n{sus.describe()}")
    res = proto.resume(jid, placement)
    t2 = time.perf_counter()
    if res.outcome is not Outcome.RUNNING:
        raise SystemExit(f"resume of {jid} ended {res.outcome.value}:\n{res.describe()}")
    time.sleep(1.0)  # let the new incarnation set its USR2 trap

    def calls(r: OpResult) -> float:
        return 1000.0 * sum(s.seconds for s in r.steps if s.step not in WAITS and not s.skipped)

    return (t1 - t0) * 1000.0, (t2 - t1) * 1000.0, calls(sus), calls(res)


def wait(probe: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def backend_ops(cluster: DevCluster, bench: Bench, repeats: int, cycles: int, sizes: list[int],
                full_env: dict[str, str]) -> None:
    """The per-operation rows, snapshot() with each queue size, the suspend / resume cycles."""
    cli = bench.backends["CLI"]
    job_dir = cluster.jobs_dir / "bench"
    job_dir.mkdir(exist_ok=True)
    job_dir.chmod(0o777)

    # Per-operation rows with the smallest queue.
    fill_queue(full_env, job_dir, sizes[0] - 2, cli)
    target = cli.submit(SubmitRequest(SLEEPER, options=[f"--chdir={job_dir}", "-o", "/dev/null", "--hold",
                                                        "--begin=now+1hour", "--gres=gpu:g0:1"]))
    bench.row("job()", lambda b: b.job(target))
    bench.row("hold", lambda b: b.hold(target))
    bench.row("release", lambda b: b.release(target))
    flip = {"n": 0}

    def update_gres(b: SlurmBackend) -> None:
        flip["n"] += 1
        b.update(target, gres=f"gpu:g{flip['n'] % 2}:1")

    cli.hold(target)
    bench.row("update(gres), read back", update_gres)

    for n in sizes:
        fill_queue(full_env, job_dir, n, cli)
        count = len(cli.jobs())
        bench.row(f"snapshot(), {count} jobs", lambda b: b.snapshot(), repeats=repeats if n < 1000 else 5)

    # Suspend / resume cycles (the job requeue-holds itself on USR2, as the wrapper does), full queue.
    runner = cli.submit(SubmitRequest(REQUEUE_SELF, options=[f"--chdir={job_dir}", "-o", "/dev/null",
                                                             "--gres=gpu:g1:1", "-w", "n1"]))
    wait(lambda: cli.job(runner).running, f"job {runner} to start")
    time.sleep(1.0)
    # Every cycle moves the job to the other node: the CLI backend n1 -> n2, the pyslurm backend n2 -> n1.
    spots = [Placement((GpuRef("n2", 2),)), Placement((GpuRef("n1", 1),))]
    rows: dict[int, dict[str, list[float]]] = {k: {"CLI": [], "pyslurm": []} for k in range(4)}
    i = 0
    for _ in range(cycles):
        for key, backend in bench.backends.items():
            got = cycle(RequeueProtocol(backend, suspend_timeout=60, start_timeout=90), runner, spots[i % 2])
            i += 1
            for k, v in enumerate(got):
                rows[k][key].append(v)
            print(f"    cycle {key}: suspend {got[0]:.0f} ms ({got[2]:.0f} in calls), "
                  f"resume {got[1]:.0f} ms ({got[3]:.0f} in calls)", flush=True)
    bench.add("suspend (protocol, wall)", rows[0]["CLI"], rows[0]["pyslurm"])
    bench.add("resume (protocol, wall)", rows[1]["CLI"], rows[1]["pyslurm"])
    bench.add("suspend: Slurm calls only", rows[2]["CLI"], rows[2]["pyslurm"])
    bench.add("resume: Slurm calls only", rows[3]["CLI"], rows[3]["pyslurm"])

    # Suspended once more and left held: its reason ("job requeued in held state" under an admin hold)
    # is one pyslurm cannot tell, so the pyslurm backend also asks squeue about it.
    proto = RequeueProtocol(cli, suspend_timeout=60)
    if proto.suspend(runner).outcome is not Outcome.SUSPENDED:
        raise SystemExit(f"job {runner} did not suspend")
    count = len(cli.jobs())
    bench.row(f"snapshot(), {count} jobs, 1 suspended", lambda b: b.snapshot(), repeats=5)
    cli.cancel(runner)


# -- controller rounds -------------------------------------------------------------------------------------

# A long quantum (Gandiva's hysteresis is one quantum of service) and no packing, migration or growth: once
# the first jobs run, the steady rounds observe and decide but have nothing to do.
ROUND_CONF = """\
state_dir = {state}
jobs_dir = {jobs}
tick = 5
quantum = 3600
introspect = 30
policy = gandiva
signal = USR2
suspend_timeout = 60
partitions = gpu
topology_file = {topology}
slurm_conf = {slurm_conf}
metrics_port = 0
[policy]
pack = no
migrate = no
grow = no
"""
MANAGED_ARGV = ["--gpus", "1", "-p", "gpu", "--job-name=bench-managed", "-o", "/dev/null", "--parsable",
                "--", "sleep", "3600"]


class SnapshotTimer:
    """Stands in for a backend's snapshot() and times each call (Slurm's share of a round)."""

    def __init__(self, backend: SlurmBackend) -> None:
        self.inner = backend.snapshot
        self.ms: list[float] = []

    def __call__(self) -> Snapshot:
        t0 = time.perf_counter()
        try:
            return self.inner()
        finally:
            self.ms.append((time.perf_counter() - t0) * 1000.0)


def restart_empty(cluster: DevCluster) -> None:
    """Stop the cluster, drop slurmctld's saved state and the jobs' files, start it again with an empty
    queue: cancelled jobs would stay listed (and in every snapshot) for MinJobAge = 600 s."""
    cluster.down()
    shutil.rmtree(cluster.state_dir / "spool", ignore_errors=True)
    for p in cluster.jobs_dir.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    cluster.up()


def submit_managed(env: dict[str, str], backend: SlurmBackend, count: int, workers: int = 4) -> list[str]:
    """`count` one-GPU managed jobs through `gandiva sbatch`'s own submit() (validate, render, held marked
    sbatch, state dir, spec file) without its process start, `workers` submissions at a time."""
    from slurm_gandiva.submit.cli import submit
    from slurm_gandiva.submit.request import parse_request

    req = parse_request(MANAGED_ARGV)
    user = pwd.getpwuid(os.getuid()).pw_name

    def one(_: int) -> str:
        return submit(req, backend=backend, env=env, user=user, now=time.time)

    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(one, range(count)))
    finally:
        pool.shutdown(cancel_futures=True)  # on an error or a signal, submit no more


def quiet(rep: TickReport) -> bool:
    """A steady round: nothing settled, decided or failed."""
    return not rep.error and not rep.findings and not rep.plan


def describe(key: str, rep: TickReport) -> str:
    return (f"{key}: error {rep.error!r}, findings {[f.kind for f in rep.findings][:5]}, "
            f"plan {[(d.action.value, d.job_id) for d in rep.plan.decisions][:5]}")


def settle_rounds(ctls: dict[str, Controller], passes: int = 8) -> None:
    """Untimed rounds, the controllers in turn, until a round of each is quiet (registration, admin holds,
    the first starts happen here)."""
    for _ in range(passes):
        reps = {key: ctl.tick() for key, ctl in ctls.items()}
        if all(quiet(r) for r in reps.values()):
            return
        for key, rep in reps.items():
            if not quiet(rep):
                print(f"    settling: {describe(key, rep)}", flush=True)
    raise SystemExit(f"the controllers did not settle in {passes} rounds")


def write_progress_files(view: ClusterView, jobs_root: Path) -> None:
    """A progress.json for every managed job, as its wrapper leaves it (a running one measured, the others
    suspended): each round then reads one file per job, as it would once every job has had a slice."""
    now = time.time()
    for job in view.jobs:
        running = job.state is JobState.RUNNING
        write_progress(JobFiles(jobs_root / job.job_id).progress, Progress(
            step=100, epoch=0, samples=3200, total_samples=None, batch_time_avg=0.64, samples_per_s=50.0,
            world_size=1, updated=now, state="running" if running else "suspended",
            started=now - 30.0 if running else None,
        ))


def controller_rounds(cluster: DevCluster, backends: dict[str, SlurmBackend], bench: Bench, sizes: list[int],
                      repeats: int, env: dict[str, str]) -> None:
    """Steady controller rounds with each number of managed jobs in `sizes`, the backends in turn."""
    ctl_dir = cluster.state_dir / "bench-controller"
    (ctl_dir / "state").mkdir(parents=True, exist_ok=True)
    conf = ctl_dir / "gandiva.conf"
    conf.write_text(ROUND_CONF.format(state=ctl_dir / "state", jobs=cluster.jobs_dir, topology=cluster.topology_path,
                                      slurm_conf=cluster.conf_path))
    cfg = load_config(conf)
    store = Store(cfg.db_url)
    timers = {key: SnapshotTimer(b) for key, b in backends.items()}
    for key, b in backends.items():
        b.snapshot = timers[key]  # type: ignore[method-assign]
    try:
        ctls = {key: Controller(cfg, b, store, config_path=conf) for key, b in backends.items()}
        for ctl in ctls.values():
            ctl.reconcile()
        submitter = backends["CLI"]
        have = 0
        for n in sizes:
            t0 = time.monotonic()
            have += len(submit_managed(env, submitter, n - have))
            print(f"    {have} managed jobs submitted ({time.monotonic() - t0:.0f} s)", flush=True)
            settle_rounds(ctls)
            last = ctls["CLI"].last_report
            assert last is not None and last.view is not None
            write_progress_files(last.view, cfg.job_root)
            settle_rounds(ctls)
            rounds: dict[str, list[float]] = {"CLI": [], "pyslurm": []}
            snaps: dict[str, list[float]] = {"CLI": [], "pyslurm": []}
            for _ in range(repeats):
                for key, ctl in ctls.items():
                    timers[key].ms.clear()
                    t1 = time.perf_counter()
                    rep = ctl.tick()
                    rounds[key].append((time.perf_counter() - t1) * 1000.0)
                    snaps[key].append(sum(timers[key].ms))
                    if not quiet(rep):
                        raise SystemExit(f"a timed round was not steady: {describe(key, rep)}")
                    if rep.view is None or len(rep.view.jobs) != n or len(rep.view.running) != min(n, 8):
                        raise SystemExit(f"{key}'s round saw {rep.view and len(rep.view.jobs)} jobs, wanted {n}")
            bench.add(f"controller round, {n} managed jobs", rounds["CLI"], rounds["pyslurm"])
            bench.add("  of which snapshot()", snaps["CLI"], snaps["pyslurm"])
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=6, help="suspend/resume cycles per backend")
    ap.add_argument("--sizes", default="10,100,1000", help="queue sizes for snapshot()")
    ap.add_argument("--round-sizes", default="10,100,1000", help="managed jobs for the controller rounds")
    ap.add_argument("--parts", default="ops,rounds", help="ops (the backend's operations), rounds, or both")
    ap.add_argument("--port-base", type=int, default=18800)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"ops", "rounds"}:
        ap.error("--parts takes ops, rounds or ops,rounds")

    def on_term(signum: int, _frame: FrameType | None) -> None:
        print(f"{signal.Signals(signum).name}: stopping the devcluster", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)  # unwinds through the finally that stops the cluster

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    state = Path(tempfile.mkdtemp(prefix="gandiva-bench-backends-"))
    cluster = DevCluster(state, port_base=args.port_base)
    try:
        cluster.up()
        env = cluster.env
        full_env = {**os.environ, **env}
        cli = CliBackend(env)
        ps = make_backend(env, kind="pyslurm")
        import pyslurm  # type: ignore[import-untyped]

        caps = cli.capabilities()
        round_sizes = [int(s) for s in args.round_sizes.split(",")]
        header = (
            f"Slurm {caps.release_text} (devcluster: 2 nodes x 4 GPUs), pyslurm {pyslurm.__version__}, "
            f"{type(ps).__name__} vs {type(cli).__name__}\n"
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {platform.node()}, "
            f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), "
            f"Python {platform.python_version()}; median of {args.repeats} runs per row "
            f"(snapshot with 1,000 jobs: 5; suspend/resume: {args.cycles} cycles each)"
        )
        print(header, flush=True)
        bench = Bench(cli, ps, args.repeats)
        if "ops" in parts:
            backend_ops(cluster, bench, args.repeats, args.cycles, [int(s) for s in args.sizes.split(",")],
                        full_env)
        if "rounds" in parts:
            if "ops" in parts:
                print("  restarting the cluster with an empty queue", flush=True)
                restart_empty(cluster)
            controller_rounds(cluster, bench.backends, bench, round_sizes, args.repeats, full_env)

        notes = ([NOTES] if "ops" in parts else []) + ([ROUND_NOTES] if "rounds" in parts else [])
        text = bench.table(header) + "\nNotes: " + "\n".join(notes)
        print("\n" + text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"written to {args.out}")
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
