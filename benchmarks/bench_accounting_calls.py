"""What Slurm's accounting costs each call the controller makes: two devclusters side by side, one without
accounting (AccountingStorageType=accounting_storage/none, issue 18's cluster) and one with it (slurmdbd over
MariaDB, AccountingStorageEnforce=associations,limits,qos: issue 30's), the same calls timed on each in turn.

Why: at 10,000 jobs, rounds with >= 10 actions took 2.3-2.7 s on the accounting cluster with the fair-share
layer on or off, against 1.53 s on issue 18's cluster (benchmarks/results/controller_scale_shares.txt).

Each cluster gets `--queue` pending jobs first (begin time an hour ahead, one sbatch each, as a site's queue
that slurmctld's scheduler passes over), then, alternating clusters, `--repeats` times:
  hold / release / update   `scontrol hold`, `scontrol release`, `scontrol update TimeLimit=` on one pending job;
  requeuehold               `scontrol requeuehold` on a running job (then cancelled and replaced, not timed);
  12 at once                12 `scontrol update` calls in parallel (a round's actions run in parallel, act.py);
  requeued                  from `scontrol requeuehold` on a running job until squeue shows it PENDING (the
                            requeue done: its batch step ended), polled every 50 ms;
  started                   from `scontrol release` of a held 1-GPU job with a GPU free until it RUNS (a
                            resume's last part), polled every 50 ms.
Calls are answers; "requeued" and "started" are effects, which the requeue protocol waits for.
Prints median ms per call on each cluster and the ratio (accounting / none).

    . scripts/slurm-release.sh && gandiva_slurm_use 24.11 && \
    .venv/bin/python benchmarks/bench_accounting_calls.py [--queue 0,1000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurm_gandiva.devcluster.cluster import DevCluster

PARALLEL = 12


class Side:
    """One devcluster and the jobs the bench acts on."""

    def __init__(self, name: str, cluster: DevCluster) -> None:
        self.name, self.cluster = name, cluster
        self.env = {**os.environ, **cluster.env}
        self.pending: list[str] = []
        self.running: list[str] = []

    def run(self, argv: Sequence[str]) -> str:
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{self.name}: {' '.join(argv)} failed: {out.stderr.strip()}")
        return out.stdout

    def sbatch(self, *opts: str) -> str:
        return self.run(["sbatch", "--parsable", "-o", "/dev/null", f"--chdir={self.cluster.jobs_dir}", *opts,
                        "--wrap", "sleep 3600"]).strip()

    def timed(self, argv: Sequence[str]) -> float:
        t0 = time.perf_counter()
        self.run(argv)
        return time.perf_counter() - t0

    def replace_running(self, job_id: str) -> None:
        """Cancel a requeue-held job and start a new one in its place (restarting a requeued job races its
        requeue's end: a release sent while the batch step ends is lost)."""
        self.run(["scancel", job_id])
        new = self.sbatch("--requeue", "--gres=gpu:1", "-t", "60")
        self.running[self.running.index(job_id)] = new
        self.wait_state(new, "RUNNING")

    def wait_state(self, job_id: str, state: str, timeout: float = 60.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).strip() == state:
                return
            time.sleep(poll)
        raise SystemExit(f"{self.name}: job {job_id} not {state} within {timeout:.0f} s")


def fill(side: Side, n: int) -> None:
    with ThreadPoolExecutor(8) as pool:
        side.pending += pool.map(lambda _: side.sbatch("--begin=now+3600", "-t", "60"), range(n))


def measure(sides: Sequence[Side], repeats: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {s.name: {} for s in sides}

    def note(side: Side, op: str, seconds: float) -> None:
        times[side.name].setdefault(op, []).append(seconds)

    for r in range(repeats):
        for side in sides if r % 2 == 0 else reversed(sides):
            job = side.pending[r % len(side.pending)]
            note(side, "hold", side.timed(["scontrol", "hold", job]))
            note(side, "release", side.timed(["scontrol", "release", job]))
            note(side, "update", side.timed(["scontrol", "update", f"jobid={job}", f"TimeLimit={60 + r}"]))
            run = side.running[r % len(side.running)]
            t0 = time.perf_counter()
            note(side, "requeuehold", side.timed(["scontrol", "requeuehold", run]))
            side.wait_state(run, "PENDING", poll=0.05)
            note(side, "requeued", time.perf_counter() - t0)
            held = side.sbatch("-H", "--gres=gpu:1", "-t", "60")
            t0 = time.perf_counter()
            side.run(["scontrol", "release", held])
            side.wait_state(held, "RUNNING", poll=0.05)
            note(side, "started", time.perf_counter() - t0)
            side.run(["scancel", held])
            targets = [side.pending[(r * PARALLEL + i) % len(side.pending)] for i in range(PARALLEL)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(PARALLEL) as pool:
                argvs = [["scontrol", "update", f"jobid={j}", f"TimeLimit={61 + r}"] for j in targets]
                list(pool.map(side.run, argvs))
            note(side, f"{PARALLEL} at once", time.perf_counter() - t0)
        for side in sides:  # a running job again in the requeued one's place (not timed)
            run = side.running[r % len(side.running)]
            side.replace_running(run)
    return times


def table(queue: int, times: dict[str, dict[str, list[float]]]) -> list[str]:
    none, acct = times["none"], times["accounting"]
    rows = [f"{'queue':>6} {'call or effect':<14} {'none ms':>9} {'accounting ms':>14} {'ratio':>7}"]
    for op in none:
        a, b = statistics.median(none[op]) * 1000, statistics.median(acct[op]) * 1000
        rows.append(f"{queue:>6} {op:<14} {a:>9.1f} {b:>14.1f} {b / a:>6.2f}x")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queue", default="0,1000", help="pending jobs in each cluster's queue, one measure each")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--port-base", type=int, default=23800, help="the plain cluster's; the other's is +1000")
    args = ap.parse_args(argv)
    queues = sorted(int(q) for q in args.queue.split(","))
    state = Path(tempfile.mkdtemp(prefix="gandiva-bench-acct-"))
    state.chmod(0o755)
    sides = [
        Side("none", DevCluster(state / "none", port_base=args.port_base)),
        Side("accounting", DevCluster(state / "acct", port_base=args.port_base + 1000, accounting=True)),
    ]
    rows: list[str] = []
    try:
        for side in sides:
            side.cluster.up()
        sides[1].cluster.add_account("t1")
        sides[1].cluster.add_user("root", "t1")
        for side in sides:
            side.running = [side.sbatch("--requeue", "--gres=gpu:1", "-t", "60") for _ in range(4)]
            side.pending = [side.sbatch("--begin=now+3600", "-t", "60") for _ in range(PARALLEL)]
            for job in side.running:
                side.wait_state(job, "RUNNING")
        have = 0
        for queue in queues:
            for side in sides:
                fill(side, queue - have)
            have = queue
            rows += table(queue, measure(sides, args.repeats))
    finally:
        for side in sides:
            with contextlib.suppress(Exception):
                subprocess.run(["scancel", "--full", "-u", "root"], env=side.env, check=False, timeout=60)
            side.cluster.down()
    release = sides[0].cluster.capabilities.release_text
    print(f"# command: .venv/bin/python benchmarks/bench_accounting_calls.py --queue {args.queue} "
          f"--repeats {args.repeats}")
    print(f"# Slurm {release}; 2 nodes x 4 GPUs each cluster; date {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
