"""How long the controller's rounds take with 0 / 100 / 1,000 / 10,000 managed jobs on a real Slurm.

Starts its own DevCluster (2 nodes x 4 fake GPUs, default port base 28000) of the Slurm release on PATH
(`scripts/slurm-release.sh`: `gandiva_slurm_use 24.11`), and a Controller in this process with the
production defaults of etc/gandiva.conf (policy gandiva, quantum 60 s, tick 5 s), ticking on the 5 s grid
as `gandiva controller` does. The managed jobs are submitted with `gandiva sbatch --array` as job arrays
(each size adds to the jobs already there) and run benchmarks/scale_job.py under gandiva-wrapper (no
PyTorch: it sleeps until the controller's signal and exits as suspended at once), so that the controller
really time-slices them (every quantum it suspends the running jobs and resumes others through the
requeue protocol) while the bench measures the controller, not 16 interpreters importing torch at once on
the same 2 cores (a real cluster runs the jobs on other machines; bench_requeue.py measures the jobs' side
of a switch).

For each size, once every job is registered, it runs `--rounds` rounds and prints, per round kind (ordinary:
no action; actions: suspends, starts and moves; packs: a round with a pack or unpack, whose job starts again
on the node it left, so Slurm's credential rule holds it back to the first or second of slurmctld's whole-
second passes after the second its old incarnation was killed in: README, "Slurm facts"; where Slurm does not
tie GPU indices (24.11 on) the round ends once such a job is set up, and its start runs on after the round:
the table's "later starts" counts them, and "they ran at" says when they ran, from their round's start,
median/max), the round time (and
the controller process's own CPU time in it, its Slurm commands aside: on a shared machine the steadier
figure) split into Slurm queries (every backend call outside the actions), the store (every database call
outside the actions), the policy's decide, the actions (the actor's execute: protocol steps, their Slurm calls
and store writes) and the rest (the controller's own work: settle, observe, plans); rounds over the tick, the
ticks that then ran late (a tick that falls during a round waits for it) and those dropped (a second one
falling during the same round); the controller process's resident memory; and that nothing was lost (every
submitted task is in Slurm and registered, none failed).

Baseline: the figures issue 18 measured on this devcluster with the controller before it (same defaults,
real `gandiva sbatch` jobs): ordinary round 0.02 / 0.10 / 0.44 / 0.85 s with 0 / 100 / 500 / 1,000 jobs,
rounds with actions up to 7.8 s at 500 and 10.4 s at 1,000 jobs. The targets (issue 18), at 10,000 jobs:
ordinary round <= 1 s, a round with 10 actions <= 2 s, memory <= 500 MB, every tick kept.

With `--fairness shares` (issue 30) the controller runs the fair-share layer over its policy, the devcluster
runs Slurm's accounting (slurmdbd, MariaDB), and each size's tasks are split over `--tenants` accounts
(t1: 2 shares, the others 1; user root in each) submitted with `gandiva sbatch -A`, so that the layer, the
tenants' reads (sacctmgr, every accounting_refresh) and the per-tenant table are in every round.

    sudo .venv/bin/python benchmarks/bench_controller_scale.py [--sizes 0,100,1000,10000] [--rounds 30]
        [--fairness shares [--tenants 4]]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gandiva.config import ControllerConfig
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.model import JobState
from slurm_gandiva.plan import Action
from slurm_gandiva.requeue.namespace import is_marked
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.store import Store
from slurm_gandiva.store.api import Outcome as StoreOutcome

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
JOB = ROOT / "benchmarks" / "scale_job.py"
ACTIVE = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED)
BASELINE_ORDINARY = {0: 0.02, 100: 0.10, 500: 0.44, 1000: 0.85}  # s, issue 18 (the controller before it)
BASELINE_ACTIONS = {500: 7.8, 1000: 10.4}  # s, the longest round with actions
TARGET_ORDINARY_S = 1.0
TARGET_ACTIONS_S = 2.0  # a round with 10 actions
TARGET_RSS_MB = 500.0
PARTS = ("slurm", "store", "decide", "actions", "rest")


class Clock:
    """Seconds spent per part of the round; calls made during the actions count as actions."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.in_actions = False
        self.lock = threading.Lock()

    def add(self, part: str, seconds: float) -> None:
        if self.in_actions and part in ("slurm", "store"):
            return  # inside the actions' wall time (they run on several threads at once)
        with self.lock:
            self.spent[part] = self.spent.get(part, 0.0) + seconds

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part, time.perf_counter() - t)

        return call


class Timed:
    """Every method call of `inner` timed into `part` (attributes pass through)."""

    def __init__(self, inner: Any, clock: Clock, part: str) -> None:
        self._inner, self._clock, self._part = inner, clock, part

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        return self._clock.timed(self._part, attr) if callable(attr) and not name.startswith("_") else attr


@dataclass
class Round:
    jobs: int
    total: float
    parts: dict[str, float]
    actions: int
    failed: int
    rss_mb: float
    error: str = ""
    cpu: float = 0.0  # the controller process's CPU time in the round (the devcluster's processes aside)
    packs: int = 0  # pack / unpack decisions among the actions
    # (job id, decision id, round start) of the starts left to run on after the round (Actor.starting)
    starting: tuple[tuple[str, int, float], ...] = ()

    @property
    def kind(self) -> str:
        return "ordinary" if not self.actions else "packs" if self.packs else "actions"


@dataclass
class SizeResult:
    jobs: int
    rounds: list[Round] = field(default_factory=list)
    skipped_ticks: int = 0
    late_s: list[float] = field(default_factory=list)  # how late each tick that fell during a round ran
    register_s: float = 0.0
    lost: int = 0
    late_failed: int = 0  # starts left to run on after their round that did not succeed
    late_start_s: list[float] = field(default_factory=list)  # when each such job ran, from its round's start


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tenant_accounts(n: int) -> list[tuple[str, int]]:
    """The `--fairness shares` accounts and their shares: t1 has 2, the others 1."""
    return [(f"t{i + 1}", 2 if i == 0 else 1) for i in range(n)]


def submit_array(cluster: DevCluster, n: int, account: str | None = None) -> str:
    """`gandiva sbatch --array=0-(n-1)` of the tiny training job (in `account` if given); the array's id."""
    cmd = [
        str(BIN / "gandiva"), "sbatch", "--parsable", f"--array=0-{n - 1}", "--gpus", "1", "--output=/dev/null",
        *(["-A", account] if account else []), "--", str(BIN / "python"), str(JOB),
    ]
    env = {**os.environ, **cluster.env}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"bench: gandiva sbatch failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


class Bench:
    def __init__(self, cluster: DevCluster, state: Path, tick: float, quantum: float,
                 fairness: str = "none", accounts: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.clock = Clock()
        self.accounts = accounts
        cfg = ControllerConfig(
            state_dir=state, jobs_dir=cluster.jobs_dir, tick=tick, quantum=quantum, partitions=("gpu",),
            topology_file=cluster.topology_path, slurm_conf=cluster.conf_path, fairness=fairness,
        )
        self.cfg = cfg
        backend = make_backend(cluster.env)
        self.backend = backend
        self.store = Store(cfg.db_url)
        self.ctl = Controller(cfg, Timed(backend, self.clock, "slurm"), Timed(self.store, self.clock, "store"))
        if isinstance(self.ctl.policy, FairShare):  # timed in place: the controller's table still sees a FairShare
            self.ctl.policy.decide = self.clock.timed("decide", self.ctl.policy.decide)  # type: ignore[method-assign]
        else:
            self.ctl.policy = Timed(self.ctl.policy, self.clock, "decide")
        execute = self.ctl.actor.execute

        def act(*args: Any, **kwargs: Any) -> Any:
            self.clock.in_actions = True
            t = time.perf_counter()
            try:
                return execute(*args, **kwargs)
            finally:
                self.clock.in_actions = False
                self.clock.add("actions", time.perf_counter() - t)

        self.ctl.actor.execute = act  # type: ignore[method-assign]
        self.next_at = 0.0
        self.late_from: float | None = None  # the tick that fell during the last round (it runs next, late)
        self.late_s: list[float] = []  # how late each such tick ran: when the round it fell in ended, after it
        self.last_introspect = time.time()

    def registered(self) -> int:
        return len(self.store.list_jobs(states=ACTIVE))

    def round(self, jobs: int) -> tuple[Round, int]:
        """Run the next round as `gandiva controller`'s scheduler would: on the next tick of the grid, or at
        once when a tick fell during the round before (that tick waited for it and runs late; any further
        tick that fell during it was dropped). Returns the round and the ticks it dropped."""
        tick = self.cfg.tick
        now = time.time()
        if self.late_from is not None:  # counted in `late_s` when the round before ended
            self.late_from = None
        else:
            self.next_at = max(self.next_at, (now // tick + 1) * tick)
            time.sleep(max(0.0, self.next_at - now))
        started = time.time()
        self.clock.spent = {}
        t, c = time.perf_counter(), time.process_time()
        rep = self.ctl.tick()
        total = time.perf_counter() - t
        cpu = time.process_time() - c
        parts = dict(self.clock.spent)
        parts["rest"] = max(0.0, total - sum(parts.get(p, 0.0) for p in PARTS if p != "rest"))
        ended = time.time()
        self.ctl._collect_before_next_tick()  # as the scheduler's tick job does after the round (not in it)
        fell = int(ended // tick) - int(started // tick)  # ticks that fell while the round ran
        skipped = max(0, fell - 1)
        if fell:
            self.late_from = (started // tick + 1) * tick
            self.late_s.append(ended - self.late_from)
        self.next_at = (ended // tick + 1) * tick
        if ended - self.last_introspect >= self.cfg.introspect:
            self.ctl.introspect()  # the controller's separate introspection job: not part of the round
            self.last_introspect = time.time()
        failed = sum(1 for r in rep.results if not r.ok)
        packs = sum(1 for r in rep.results if r.decision.action in (Action.PACK, Action.UNPACK))
        starting = tuple(
            (r.decision.job_id, r.decision_id, started) for r in rep.results if r.starting and r.decision_id
        )
        rnd = Round(jobs, total, parts, len(rep.results), failed, rss_mb(), rep.error, cpu, packs, starting)
        return rnd, skipped

    def settle_starts(self, rounds: list[Round]) -> tuple[int, list[float]]:
        """Wait for the starts the rounds left to run on; returns how many did not succeed, and when each
        that did ran (its outcome), in seconds from its round's start."""
        self.ctl.actor.wait_started(timeout=120)
        left = [s for r in rounds for s in r.starting]
        found = {d.id: d for d in self.store.decisions(job_ids={jid for jid, _d, _t in left})}
        failed, after = 0, []
        for _jid, did, started in left:
            d = found.get(did)
            if d is None or d.outcome is not StoreOutcome.SUCCEEDED or d.outcome_at is None:
                failed += 1
            else:
                after.append(d.outcome_at - started)
        return failed, after

    def lost(self, submitted: int) -> int:
        """Submitted tasks that are neither waiting, running nor registered (or that failed)."""
        snap = self.ctl.backend.snapshot()
        tasks = [j for j in snap.jobs if is_marked(j.comment)]
        bad = sum(1 for j in tasks if j.finished)
        registered = {r.job_id for r in self.store.list_jobs(states=ACTIVE)}
        missing = sum(1 for j in tasks if not j.finished and j.job_id not in registered)
        return bad + missing + max(0, submitted - len(tasks))


def measure(bench: Bench, size: int, have: int, rounds: int) -> SizeResult:
    res = SizeResult(size)
    if size > have:
        t = time.time()
        new = size - have
        if bench.accounts:  # split over the tenants, the first taking what the division leaves
            k = len(bench.accounts)
            for i, acct in enumerate(bench.accounts):
                part = new // k + (new % k if i == 0 else 0)
                if part:
                    submit_array(bench.cluster, part, acct)
        else:
            submit_array(bench.cluster, new)
        while bench.registered() < size:
            bench.round(size)
            if time.time() - t > 600:
                raise SystemExit(f"bench: only {bench.registered()} of {size} jobs registered in 10 min")
        res.register_s = time.time() - t
    late_before = len(bench.late_s)
    for _ in range(rounds):
        r, skipped = bench.round(size)
        res.rounds.append(r)
        res.skipped_ticks += skipped
        print(f"  {size:>6} jobs: round {r.total:6.3f} s (CPU {r.cpu:.3f} s), {r.actions:2d} actions"
              + (f" ({r.packs} packs)" if r.packs else "")
              + (f" ({len(r.starting)} starting after it)" if r.starting else "")
              + "".join(f", {p} {r.parts.get(p, 0.0):.3f}" for p in PARTS) + f", rss {r.rss_mb:.0f} MB",
              flush=True)
    res.late_s = bench.late_s[late_before:]
    res.late_failed, res.late_start_s = bench.settle_starts(res.rounds)
    res.lost = bench.lost(size)
    return res


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(results: list[SizeResult], tick: float) -> str:
    head = (f"{'jobs':>6} {'kind':<9} {'rounds':>6} {'median s':>9} {'max s':>7} {'CPU med':>8} {'CPU max':>8} "
            + " ".join(f"{p:>8}" for p in PARTS) + f" {'actions':>8} {'baseline':>9} {'target':>7}")
    lines = [head, "-" * len(head)]
    for res in results:
        for kind in ("ordinary", "actions", "packs"):
            rs = [r for r in res.rounds if r.kind == kind]
            if not rs:
                continue
            base = BASELINE_ORDINARY.get(res.jobs) if kind == "ordinary" else BASELINE_ACTIONS.get(res.jobs)
            target = TARGET_ORDINARY_S if kind == "ordinary" else TARGET_ACTIONS_S
            parts = " ".join(f"{_med([r.parts.get(p, 0.0) for r in rs]):8.3f}" for p in PARTS)
            acts = f"{_med([float(r.actions) for r in rs]):.0f}" if kind != "ordinary" else "0"
            lines.append(
                f"{res.jobs:>6} {kind:<9} {len(rs):>6} {_med([r.total for r in rs]):9.3f} "
                f"{max(r.total for r in rs):7.3f} {_med([r.cpu for r in rs]):8.3f} {max(r.cpu for r in rs):8.3f} "
                f"{parts} {acts:>8} "
                f"{(f'{base:.2f}' if base is not None else '-'):>9} {target:7.1f}"
            )
    lines.append("")
    lines.append(f"{'jobs':>6} {'rounds over the tick':>21} {'ticks late':>11} {'max late s':>11} "
                 f"{'ticks skipped':>14} {'max RSS MB':>11} "
                 f"{'failed actions':>15} {'lost':>5} {'registering s':>14} {'later starts':>13} "
                 f"{'they ran at s':>14}")
    for res in results:
        ran = res.late_start_s
        ran_at = f"{_med(ran):.2f}/{max(ran):.2f}" if ran else "-"
        over = sum(1 for r in res.rounds if r.total > tick)
        late = f"{max(res.late_s):11.2f}" if res.late_s else f"{'-':>11}"
        lines.append(f"{res.jobs:>6} {over:>21} {len(res.late_s):>11} {late} "
                     f"{res.skipped_ticks:>14} {max(r.rss_mb for r in res.rounds):11.0f} "
                     f"{sum(r.failed for r in res.rounds) + res.late_failed:>15} {res.lost:>5} "
                     f"{res.register_s:14.0f} {len(res.late_start_s) + res.late_failed:>13} "
                     f"{ran_at:>14}")
    return "\n".join(lines)


def verdict(results: list[SizeResult], tick: float) -> list[str]:
    big = max(results, key=lambda r: r.jobs)
    ordinary = [r.total for r in big.rounds if r.actions == 0]
    tens = [r.total for r in big.rounds if r.actions >= 10 and not r.packs]
    packs = [r.total for r in big.rounds if r.actions >= 10 and r.packs]
    ok_ordinary = bool(ordinary) and max(ordinary) <= TARGET_ORDINARY_S
    ok_tens = bool(tens) and max(tens) <= TARGET_ACTIONS_S
    ok_packs = bool(packs) and max(packs) <= TARGET_ACTIONS_S
    out = [
        f"ordinary round at {big.jobs} jobs: max {max(ordinary, default=float('nan')):.2f} s "
        f"(target <= {TARGET_ORDINARY_S:g} s): {'met' if ok_ordinary else 'NOT met'}",
        f"round with >= 10 actions at {big.jobs} jobs: max {max(tens, default=float('nan')):.2f} s over {len(tens)} "
        f"(target <= {TARGET_ACTIONS_S:g} s): {'met' if ok_tens else 'NOT met'}",
        (f"  ... with packs: max {max(packs):.2f} s over {len(packs)} "
         f"(target <= {TARGET_ACTIONS_S:g} s): {'met' if ok_packs else 'NOT met'}"
         + ("" if ok_packs else " (a packed job starts again on the node it left: in the first or second of "
            "slurmctld's whole-second passes after the second its old credential was revoked in, README, "
            "'Slurm facts')")
         if packs else "  ... with packs: none in this run"),
        (f"  starts left to run on after their round at {big.jobs} jobs: {len(big.late_start_s) + big.late_failed}, "
         f"ran at max {max(big.late_start_s, default=float('nan')):.2f} s from their round's start, "
         f"{big.late_failed} did not start"),
        f"memory: max {max(r.rss_mb for r in big.rounds):.0f} MB (target <= {TARGET_RSS_MB:g} MB)",
        f"every tick kept: {'yes' if all(r.skipped_ticks == 0 for r in results) else 'NO'} "
        f"({sum(len(r.late_s) for r in results)} ran late, after a round past the tick, "
        f"at most {max((x for r in results for x in r.late_s), default=0.0):.2f} s); "
        f"lost jobs: {sum(r.lost for r in results)}",
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0,100,1000,10000")
    ap.add_argument("--rounds", type=int, default=40, help="measured rounds per size (40 = 3.3 quanta)")
    ap.add_argument("--tick", type=float, default=5.0)
    ap.add_argument("--quantum", type=float, default=60.0)
    ap.add_argument("--port-base", type=int, default=28000)
    ap.add_argument("--state-dir", type=Path, default=None)
    ap.add_argument("--fairness", choices=("none", "shares"), default="none",
                    help="shares: the fair-share layer on, Slurm accounting, the tasks split over --tenants accounts")
    ap.add_argument("--tenants", type=int, default=4, help="accounts with --fairness shares (default 4)")
    args = ap.parse_args()
    if args.fairness == "shares" and args.tenants < 1:
        ap.error("--tenants must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still take the cluster down
    sizes = sorted(int(s) for s in args.sizes.split(","))
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="gandiva-bench-scale-"))
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the jobs read the cluster's files
    (state / "controller").mkdir(exist_ok=True)
    shares = args.fairness == "shares"
    cluster = DevCluster(state / "cluster", port_base=args.port_base, accounting=shares)
    cluster.up()
    results: list[SizeResult] = []
    accounts = tenant_accounts(args.tenants) if shares else []
    try:
        for name, share in accounts:
            cluster.add_account(name, fairshare=share)
            cluster.add_user("root", name)
        bench = Bench(cluster, state / "controller", args.tick, args.quantum, args.fairness,
                      tuple(a for a, _ in accounts))
        backend_name = type(bench.backend).__name__
        bench.ctl.reconcile()
        have = 0
        for size in sizes:
            results.append(measure(bench, size, have, args.rounds if size else min(args.rounds, 6)))
            have = size
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "-u", "root"], env={**os.environ, **cluster.env}, check=False)
        cluster.down()
    caps = cluster.capabilities
    print()
    fair = (f" --fairness shares --tenants {args.tenants}" if shares else "")
    print(f"# command: .venv/bin/python benchmarks/bench_controller_scale.py --sizes {args.sizes} "
          f"--rounds {args.rounds}{fair}")
    print(f"# Slurm {caps.release_text}, {backend_name}; 2 nodes x 4 GPUs; "
          f"policy {bench.cfg.policy}{' with fairness shares' if shares else ''}"
          f"{' over ' + ', '.join(f'{a} ({s})' for a, s in accounts) if accounts else ''}, "
          f"tick {args.tick:g} s, quantum {args.quantum:g} s; "
          f"date {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
    print(f"# the jobs: gandiva sbatch --array=... --gpus 1 -- {shlex.join(['python', 'benchmarks/scale_job.py'])}")
    print(table(results, args.tick))
    print()
    for line in verdict(results, args.tick):
        print(line)


if __name__ == "__main__":
    main()
