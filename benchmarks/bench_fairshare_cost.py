"""What the fair-share layer (`fairness = shares`) adds to a controller round at 10,000 jobs, CPU only.

Issue 30 asks that the controller with shares on keep issue 18's targets at 10,000 jobs (ordinary round
<= 1 s, a round with 10 actions <= 2 s; bench_controller_scale.py measures them on a real Slurm). Running that
bench with two users in two accounts needs an accounting cluster and jobs submitted as a second user; this
bench measures instead what shares change in the round itself: the controller's policy step as
`Controller` runs it (`run_round`: `decide` and the rules of every round, GPU limits among them) and the
per-tenant table it writes every round for `gandiva sshare` (`tenant_rows` + `write_tenants`), with the
bare policy against `FairShare(policy)` (as controller/service.py builds it), on the same synthetic view of
10,000 managed jobs in 4 tenants (accounts with shares 4:2:1:1, one user each, one tenant owning most jobs
as a search would; one account under a `GrpTRES=gres/gpu` limit), each policy on its own trajectory:

the rounds of the first two quanta on the 5 s tick grid (t = 0: every job queued, the controller's first
round; then 5, 10, 60, 65, 120 s), each table row one of them with its decisions (rounds without any are the
ordinary rounds of issue 18; the policy, not this bench, decides which rounds act).

Two cluster shapes: the devcluster of bench_controller_scale.py (2 nodes x 4 GPUs, 1-GPU jobs: nearly every
job waits) and a large one (1,000 nodes x 8 GPUs, 1-16 GPU elastic jobs: most run). Per round kind: median
and max seconds over `--repeat` trajectories, the ratio shares/bare, decisions, and the peak memory the
round allocates (tracemalloc, a separate pass). Then the projection onto bench_controller_scale.py's measured
10,000-job rounds (results/controller_scale.txt): its figure plus what shares add on the devcluster shape.

    .venv/bin/python benchmarks/bench_fairshare_cost.py [--jobs 10000] [--repeat 5] [--policy gandiva]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gandiva.controller.tenants import tenant_rows, write_tenants
from slurm_gandiva.model import ClusterView, GpuLimit, Job, JobSpec, JobState, Locality, RateTable, Tenants, Topology
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.selector.round import run_round

SHARES = {"physics": 4.0, "bio": 2.0, "chem": 1.0, "astro": 1.0}
WEIGHTS = (0.7, 0.1, 0.1, 0.1)  # of the jobs: one tenant runs a large search
LIMITED = GpuLimit(gpus=2, account="chem")  # GrpTRES=gres/gpu=2 on chem (scaled on the large shape)
TICK_S, QUANTUM_S = 5.0, 60.0
ROUND_TIMES = (0.0, TICK_S, 2 * TICK_S, QUANTUM_S, QUANTUM_S + TICK_S, 2 * QUANTUM_S)
# bench_controller_scale.py at 10,000 jobs (results/controller_scale.txt, Slurm 24.11, issue 18 session 14):
# max ordinary round, max round with actions (24 actions), and issue 18's targets for them.
MEASURED_ORDINARY_S, MEASURED_ACTIONS_S = 0.452, 1.533
TARGET_ORDINARY_S, TARGET_ACTIONS_S = 1.0, 2.0


def _rates(scale: float) -> RateTable:
    return RateTable(
        {
            (1, Locality.SWITCH): 10.0 * scale,
            (2, Locality.SWITCH): 19.0 * scale,
            (4, Locality.NODE): 34.0 * scale,
            (8, Locality.CROSS_NODE): 50.0 * scale,
            (16, Locality.CROSS_NODE): 60.0 * scale,
        }
    )


def make_view(jobs: int, shape: str, seed: int = 1) -> ClusterView:
    """`jobs` queued jobs of 4 tenants on the `shape` cluster ("devcluster" or "large")."""
    rng = random.Random(seed)
    tables = [_rates(s) for s in (0.5, 1.0, 2.0, 3.0)]
    accounts = list(SHARES)
    if shape == "devcluster":
        topo = Topology.uniform(2, 4)
        limit = LIMITED
    else:
        topo = Topology.uniform(1000, 8, gpus_per_switch=2, sockets=2)
        limit = replace(LIMITED, gpus=LIMITED.gpus * 250)
    out = []
    for i in range(jobs):
        acct = rng.choices(accounts, WEIGHTS)[0]
        if shape == "devcluster":
            lo = hi = 1
        else:
            k = rng.choice([1, 1, 1, 1, 2, 4, 8])
            lo, hi = 1, 2 * k
        spec = JobSpec(
            f"{i + 1}", f"u-{acct}", lo, hi, float(i), total_work=rng.uniform(1e3, 1e7), account=acct, qos="normal"
        )
        out.append(Job(spec, rates=rng.choice(tables)))
    return ClusterView(topo, tuple(out), 0.0, tenants=Tenants(shares=SHARES, limits=(limit,)))


def advance(view: ClusterView, now: float) -> ClusterView:
    """`view` at `now`: running jobs served meanwhile (what the store's slices give the controller)."""
    dt = now - view.now
    jobs = tuple(
        j.evolve(attained_service=j.attained_service + dt * j.gpus) if j.state is JobState.RUNNING else j
        for j in view.jobs
    )
    return replace(view, jobs=jobs, now=now)


@dataclass
class Sample:
    seconds: list[float]
    decisions: int = 0
    peak_mb: float = 0.0


def one_round(policy: Policy, view: ClusterView, table: Path) -> tuple[ClusterView, int]:
    """The controller's policy step and tenant table for `view`; the view after the plan, and its size."""
    plan = run_round(policy, view).plan
    after = plan.apply(view)
    write_tenants(table, tenant_rows(after, policy), view.now)
    return after, len(plan.decisions)


def trajectory(
    make: Callable[[], Policy], start: ClusterView, table: Path, trace: bool
) -> list[tuple[float, int, float]]:
    """The rounds at ROUND_TIMES on one fresh policy: (seconds, decisions, peak MB allocated or 0)."""
    policy = make()
    view = start
    out = []
    for at in ROUND_TIMES:
        view = advance(view, at)
        gc.collect()
        if trace:
            tracemalloc.start()
        t = time.perf_counter()
        view, n = one_round(policy, view, table)
        took = time.perf_counter() - t
        peak = 0.0
        if trace:
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        out.append((took, n, peak))
    return out


def measure(make: Callable[[], Policy], start: ClusterView, table: Path, repeat: int) -> list[Sample]:
    samples = [Sample([]) for _ in ROUND_TIMES]
    for _ in range(repeat):
        for s, (took, n, _peak) in zip(samples, trajectory(make, start, table, trace=False), strict=True):
            s.seconds.append(took)
            s.decisions = n
    for s, (_took, _n, peak) in zip(samples, trajectory(make, start, table, trace=True), strict=True):
        s.peak_mb = peak
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5, help="trajectories timed per policy (then one traced)")
    ap.add_argument("--policy", default="gandiva")
    ap.add_argument("--shapes", default="devcluster,large")
    args = ap.parse_args()

    def bare() -> Policy:
        return make_policy(args.policy)

    def shares() -> Policy:
        return FairShare(make_policy(args.policy))  # type: ignore[return-value]  # as controller/service.py

    print(f"policy {args.policy}, {args.jobs} jobs in 4 tenants (shares 4:2:1:1, jobs 70/10/10/10 %), "
          f"tick {TICK_S:g} s, quantum {QUANTUM_S:g} s; seconds over {args.repeat} trajectories")
    head = (f"{'shape':<11}{'gpus':>6} {'round t':<8}{'bare med':>9}{'bare max':>9}{'shares med':>11}"
            f"{'shares max':>11}{'ratio':>7}{'acts b/s':>10}{'MB bare':>9}{'MB shares':>10}")
    print(head)
    print("-" * len(head))
    extra: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "tenants.json"
        for shape in args.shapes.split(","):
            start = make_view(args.jobs, shape)
            b = measure(bare, start, table, args.repeat)
            f = measure(shares, start, table, args.repeat)
            for at, sb, sf in zip(ROUND_TIMES, b, f, strict=True):
                bm, fm = statistics.median(sb.seconds), statistics.median(sf.seconds)
                print(
                    f"{shape:<11}{start.topology.total_gpus:>6} {f'{at:g} s':<8}{bm:>9.3f}{max(sb.seconds):>9.3f}"
                    f"{fm:>11.3f}{max(sf.seconds):>11.3f}{fm / bm:>7.2f}{f'{sb.decisions}/{sf.decisions}':>10}"
                    f"{sb.peak_mb:>9.1f}{sf.peak_mb:>10.1f}"
                )
                if shape == "devcluster":
                    extra[at] = max(sf.seconds) - max(sb.seconds)
    if extra:
        # Conservative: the most shares added to any round of the devcluster shape, to either kind of round.
        add = max(0.0, *extra.values())
        print()
        print("projected onto bench_controller_scale.py at 10,000 jobs (its max + the most shares add to a round")
        print("of the devcluster shape above, max - max):")
        for what, measured, target in (
            ("ordinary round", MEASURED_ORDINARY_S, TARGET_ORDINARY_S),
            ("round with actions", MEASURED_ACTIONS_S, TARGET_ACTIONS_S),
        ):
            got = measured + add
            verdict = "met" if got <= target else "NOT met"
            print(f"  {what}: {measured:.3f} + {add:.3f} = {got:.3f} s (target <= {target:g} s): {verdict}")


if __name__ == "__main__":
    main()
