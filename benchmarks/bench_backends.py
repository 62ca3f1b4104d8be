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
               slurm/pyslurm_backend.py).
Prints a table (median ms, pyslurm / CLI ratio) under the Slurm release and writes it to
benchmarks/results/backends.txt.

    PATH=/opt/slurm-gandiva/25.11/sbin:/opt/slurm-gandiva/25.11/bin:$PATH \
    LD_LIBRARY_PATH=/opt/slurm-gandiva/25.11/lib .venv/bin/python benchmarks/bench_backends.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.protocol import OpResult, Outcome, RequeueProtocol, Step
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmBackend, SubmitRequest
from slurm_gandiva.slurm.cli_backend import CliBackend

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "backends.txt"
SLEEPER = "#!/bin/bash\nsleep 3600\n"
REQUEUE_SELF = """#!/bin/bash
trap 'scontrol requeuehold $SLURM_JOB_ID' USR2
sleep 3600 & wait
sleep 60
"""


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
                got[key].append(timed(lambda b=backend: op(b)))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=6, help="suspend/resume cycles per backend")
    ap.add_argument("--sizes", default="10,100,1000", help="queue sizes for snapshot()")
    ap.add_argument("--port-base", type=int, default=18800)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    state = Path(tempfile.mkdtemp(prefix="gandiva-bench-backends-"))
    cluster = DevCluster(state, port_base=args.port_base)
    cluster.up()
    try:
        env = cluster.env
        full_env = {**os.environ, **env}
        cli = CliBackend(env)
        ps = make_backend(env, kind="pyslurm")
        import pyslurm

        caps = cli.capabilities()
        header = (
            f"Slurm {caps.release_text} (devcluster: 2 nodes x 4 GPUs), pyslurm {pyslurm.__version__}, "
            f"{type(ps).__name__} vs {type(cli).__name__}\n"
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {platform.node()}, "
            f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
            f"median of {args.repeats} runs per row (suspend/resume: {args.cycles} cycles each)"
        )
        print(header, flush=True)
        job_dir = cluster.jobs_dir / "bench"
        job_dir.mkdir(exist_ok=True)
        job_dir.chmod(0o777)
        bench = Bench(cli, ps, args.repeats)
        sizes = [int(s) for s in args.sizes.split(",")]

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
            bench.row(f"snapshot(), {count} jobs", lambda b: b.snapshot(), repeats=args.repeats if n < 1000 else 5)

        # Suspend / resume cycles (the job requeue-holds itself on USR2, as the wrapper does), full queue.
        runner = cli.submit(SubmitRequest(REQUEUE_SELF, options=[f"--chdir={job_dir}", "-o", "/dev/null",
                                                                 "--gres=gpu:g1:1", "-w", "n1"]))
        wait(lambda: cli.job(runner).running, f"job {runner} to start")
        time.sleep(1.0)
        # Every cycle moves the job to the other node: the CLI backend n1 -> n2, the pyslurm backend n2 -> n1.
        spots = [Placement((GpuRef("n2", 2),)), Placement((GpuRef("n1", 1),))]
        rows: dict[int, dict[str, list[float]]] = {k: {"CLI": [], "pyslurm": []} for k in range(4)}
        i = 0
        for _ in range(args.cycles):
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

        text = bench.table(header)
        text += (
            "\nNotes: snapshot() = all jobs + all nodes. The pyslurm backend submits through sbatch and reads with\n"
            "squeue the jobs pyslurm 25.11 cannot describe (a reason from a state description, e.g. every\n"
            "requeue-held job; GPUs of running jobs without per-GPU typed gres; jobs being torn down): the\n"
            "suspend/resume rows include those reads. The protocol's wall times are dominated by Slurm's own\n"
            "waits (the job's requeue and kill, the 1.5 s credential guard, the next scheduling pass after the\n"
            "release: sched_interval=2 s); 'Slurm calls only' sums the steps that only talk to Slurm (signal,\n"
            "admin hold; set placement, clear begin time, verify). job()/hold/release/update ran with 10 jobs\n"
            "in the queue, the protocol cycles and the last row with the full queue.\n"
        )
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
