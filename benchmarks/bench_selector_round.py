"""How long one decision round of each policy takes, from 1/8 of the size to 10,000 jobs on 8,000 GPUs.

Two tables:
1. a full `decide` round (allocation + affinity placement + plan) of every policy on a cold cluster
   (every job queued: the worst case, every job gets placed) and on the next round (nothing changes);
2. the AFS spare-GPU hand-out with the heap against the quadratic scan (one pass over all jobs for
   every spare GPU) as the baseline, on an undersubscribed cluster (jobs = GPUs / 4), with the ratio.

Run: .venv/bin/python benchmarks/bench_selector_round.py [--full-only] [--policies afs-l,default]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from slurm_gandiva.model import ClusterView, Job, JobSpec, Locality, RateTable, Topology
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.selector.afs import _Entry, afs_counts, tie_rank
from slurm_gandiva.selector.common import Speeds

FULL_JOBS, FULL_GPUS = 10_000, 8_000
FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1.0)


def _tables() -> list[RateTable]:
    out = []
    for scale in (0.5, 1.0, 2.0, 3.0):
        out.append(
            RateTable(
                {
                    (1, Locality.SWITCH): 10.0 * scale,
                    (2, Locality.SWITCH): 19.0 * scale,
                    (4, Locality.NODE): 34.0 * scale,
                    (8, Locality.CROSS_NODE): 50.0 * scale,
                    (16, Locality.CROSS_NODE): 60.0 * scale,
                }
            )
        )
    return out


def make_view(jobs: int, gpus: int, seed: int = 1) -> ClusterView:
    rng = random.Random(seed)
    tables = _tables()
    topo = Topology.uniform(gpus // 8, 8, gpus_per_switch=2, sockets=2)
    out = []
    for i in range(jobs):
        k = rng.choice([1, 1, 1, 1, 2, 4, 8])
        spec = JobSpec(f"j{i}", "u", 1, 2 * k, float(i), total_work=rng.uniform(1e3, 1e7))
        out.append(Job(spec, rates=rng.choice(tables)))
    return ClusterView(topo, tuple(out), 0.0)


def timed(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    res = fn()
    return time.perf_counter() - t, res


def naive_afs(jobs: Sequence[Job], cap: int) -> dict[str, int]:
    """The baseline: every job its minimum, then for each spare GPU one pass over all jobs."""
    speeds = Speeds()
    counts = {j.job_id: j.spec.min_gpus for j in jobs}
    free = cap - sum(counts.values())
    while free > 0:
        best: _Entry | None = None
        for j in jobs:
            a = counts[j.job_id]
            if a >= j.spec.max_gpus:
                continue
            e = _Entry(j, a, speeds, False, tie_rank(0, j.job_id))
            if e.g <= 1.0 + 1e-6:
                continue
            if best is None or e < best:
                best = e
        if best is None:
            break
        counts[best.job.job_id] += 1
        free -= 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--skip-naive-above", type=int, default=4000, help="GPUs above which the baseline is skipped")
    args = ap.parse_args()
    names = args.policies.split(",")

    print("1. one decide() round, every job queued (cold) and the next round (warm); seconds")
    print(f"{'policy':<10}{'jobs':>7}{'gpus':>7}{'cold':>9}{'warm':>9}{'x vs 1/8':>10}")
    for name in names:
        pol = make_policy(name)
        first = None
        for frac in FRACTIONS:
            view = make_view(int(FULL_JOBS * frac), int(FULL_GPUS * frac))
            cold, plan = timed(lambda: pol.decide(view, 0.0))  # noqa: B023
            after = plan.apply(view, 0.0)  # type: ignore[attr-defined]
            warm, _ = timed(lambda: pol.decide(after, 1.0))  # noqa: B023
            first = first or cold
            size = f"{name:<10}{len(view.jobs):>7}{view.topology.total_gpus:>7}"
            print(f"{size}{cold:>9.3f}{warm:>9.3f}{cold / first:>10.1f}")

    print()
    print("2. AFS spare-GPU hand-out: heap vs quadratic scan (baseline), jobs = GPUs / 4; seconds")
    print(f"{'jobs':>7}{'gpus':>7}{'heap':>9}{'scan':>9}{'scan/heap':>11}{'same':>6}")
    for frac in FRACTIONS:
        gpus = int(FULL_GPUS * frac)
        view = make_view(gpus // 4, gpus)
        jobs = list(view.jobs)
        heap_s, heap_counts = timed(lambda: afs_counts(jobs, gpus, Speeds(), pessimistic=False))  # noqa: B023
        if gpus <= args.skip_naive_above:
            scan_s, scan_counts = timed(lambda: naive_afs(jobs, gpus))  # noqa: B023
            same = "yes" if sum(scan_counts.values()) == sum(heap_counts.values()) else "no"  # type: ignore[attr-defined]
            print(f"{len(jobs):>7}{gpus:>7}{heap_s:>9.3f}{scan_s:>9.3f}{scan_s / heap_s:>11.1f}{same:>6}")
        else:
            print(f"{len(jobs):>7}{gpus:>7}{heap_s:>9.3f}{'skipped':>9}{'':>11}{'':>6}")


if __name__ == "__main__":
    main()
