"""Simulator and policy speed (issue 3 and issue 12 acceptance), with how the time grows from 1/8 to full size.

0. Every policy on the whole of Philly virtual cluster 11cb48 (16,091 jobs, 64 GPUs, the simulator's
   defaults), one at a time: target under 60 s each (issue 12, item 5). BEFORE lists what the same runs
   took before the speed-ups, for comparison (measured on the same machine, also under load).
1. Whole-trace simulation: Philly virtual cluster 11cb48 (all its jobs) on 64 GPUs with the `default`
   policy (target: under 60 s), beside FIFO on the same jobs as the baseline (the engine's own cost
   with the cheapest policy), at 1/8, 1/4, 1/2 and all of the jobs.
2. One decision round of AFS-L and AFS-P for 10,000 jobs on 8,000 GPUs (2,000 nodes x 4) (target:
   under 1 s), beside FIFO's round on the same view, at 1/8 .. full size. The view is what the engine
   builds: half of the GPUs busy with running jobs (1 GPU each), the rest of the jobs waiting, elastic
   GPU ranges, rate tables from the Pollux models. A second table runs the AFS heap branch (fewer jobs
   than GPUs: 4,000 jobs, none running, on 8,000 GPUs).

Usage: .venv/bin/python benchmarks/bench_sim_speed.py [--skip-policies] [--skip-trace] [--skip-round]
       [--fractions 8,4,2,1] [--policies fifo,gandiva,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from slurm_gandiva.model import ClusterView, JobState, Placement
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.sim.engine import SimConfig, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob, load_philly


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _simulate(trace: Trace, policy: str) -> None:
    Simulator(trace, make_policy(policy), SimConfig()).run()


TARGET_S = 60.0
# Wall seconds on all of 11cb48 before the speed-ups (code at 1c15290, this 2-core VM, another
# simulation running beside it): what the table's 'before s' column shows.
BEFORE: dict[str, float] = {
    "slurm": 10.9,
    "fifo": 8.7,
    "srtf": 6.1,
    "tiresias": 9.2,
    "gandiva": 16.9,
    "afs-l": 8.3,
    "afs-p": 7.5,
    "default": 14.2,
}


def bench_policies(names: list[str]) -> None:
    full = load_philly(vc="11cb48")
    print(f"0. Every policy on all of Philly 11cb48 ({len(full)} jobs) on 64 GPUs, wall seconds")
    print(f"{'policy':>9} {'jobs':>7} {'decisions':>10} {'seconds':>8} {'before s':>9} {'target':>7} {'result':>7}")
    failed = []
    for name in names:
        t0 = time.perf_counter()
        res = Simulator(full, make_policy(name), SimConfig()).run()
        took = time.perf_counter() - t0
        ok = took < TARGET_S and len(res.finished) == len(full)
        if not ok:
            failed.append(name)
        before = f"{BEFORE[name]:.1f}" if name in BEFORE else "-"
        verdict = "PASS" if ok else "FAIL"
        print(
            f"{name:>9} {len(full):>7} {res.decisions:>10} {took:>8.1f} {before:>9} {TARGET_S:>6.0f}s {verdict:>7}",
            flush=True,
        )
    verdict = "PASS" if not failed else "FAIL (" + ", ".join(failed) + ")"
    print(f"   {verdict}: every policy on all of 11cb48 in < {TARGET_S:.0f} s")


def bench_trace(fractions: list[int]) -> None:
    full = load_philly(vc="11cb48")
    print(f"1. Philly 11cb48 ({len(full)} jobs) on 64 GPUs, whole simulation, wall seconds")
    print(
        f"{'size':>6} {'jobs':>7} {'default s':>10} {'fifo s':>8} {'default/fifo':>13} {'growth':>7} {'decisions':>10}"
    )
    first: float | None = None
    default_full = float("nan")
    for frac in fractions:
        tr = Trace(full.name, full.jobs[: len(full) // frac])
        t0 = time.perf_counter()
        decisions = Simulator(tr, make_policy("default"), SimConfig()).run().decisions
        t_def = time.perf_counter() - t0
        t_fifo = timed(partial(_simulate, tr, "fifo"))
        first = first or t_def
        print(
            f"{'1/' + str(frac):>6} {len(tr):>7} {t_def:>10.2f} {t_fifo:>8.2f} {t_def / t_fifo:>12.1f}x"
            f" {t_def / first:>6.1f}x {decisions:>10}",
            flush=True,
        )
        if frac == 1:
            default_full = t_def
    if 1 in fractions:
        print(
            f"   {'PASS' if default_full < 60 else 'FAIL'}: all of 11cb48 with default in {default_full:.1f} s (< 60 s)"
        )


def round_view(jobs: int, gpus: int, running_share: float) -> ClusterView:
    """A view as the engine builds it: `jobs` elastic Philly jobs on `gpus` GPUs, some running."""
    nodes = gpus // 4
    base = load_philly(vc=None, jobs=jobs)
    tr = Trace("round", tuple(TraceJob(f"j{i}", 0.0, j.duration, j.gpus) for i, j in enumerate(base.jobs)))
    sim = Simulator(tr, make_policy("afs-l"), SimConfig(nodes=nodes, gpus_per_node=4))
    recs = sim.make_jobs()
    free = list(sim.topology.all_gpus())
    n_run = min(int(gpus * running_share), jobs)
    out = []
    for i, r in enumerate(recs):
        job = r.job
        if i < n_run:
            job = replace(
                job,
                state=JobState.RUNNING,
                placement=Placement((free[i],)),
                progress=0.1 * r.total,
                attained_service=100.0,
                times_scheduled=1,
                first_start=0.0,
                slice_start=0.0,
                measured_rate=job.rates.throughput(1),
            )
        out.append(job)
    return ClusterView(sim.topology, tuple(out), 10.0)


def bench_round(fractions: list[int]) -> None:
    for title, jobs, gpus, share, target in (
        ("10,000 jobs on 8,000 GPUs, 4,000 running", 10_000, 8_000, 0.5, True),
        ("4,000 jobs on 8,000 GPUs, none running (AFS heap branch)", 4_000, 8_000, 0.0, False),
    ):
        print(f"\n2. One decision round: {title}; best of 3, seconds")
        print(
            f"{'size':>6} {'jobs':>7} {'gpus':>6} {'view s':>7} {'afs-l s':>8} {'afs-p s':>8} {'fifo s':>7}"
            f" {'afs-l/fifo':>11} {'growth':>7}"
        )
        first: float | None = None
        full: float = float("nan")
        for frac in fractions:
            j, g = jobs // frac, (gpus // frac) // 4 * 4
            t0 = time.perf_counter()
            view = round_view(j, g, share)
            t_view = time.perf_counter() - t0
            afsl, afsp, fifo = make_policy("afs-l"), make_policy("afs-p"), make_policy("fifo")
            t_l = timed(partial(afsl.decide, view, 10.0), 3)
            t_p = timed(partial(afsp.decide, view, 10.0), 3)
            t_f = timed(partial(fifo.decide, view, 10.0), 3)
            first = first or t_l
            print(
                f"{'1/' + str(frac):>6} {j:>7} {g:>6} {t_view:>7.2f} {t_l:>8.3f} {t_p:>8.3f} {t_f:>7.3f}"
                f" {t_l / t_f:>10.1f}x {t_l / first:>6.1f}x",
                flush=True,
            )
            if frac == 1:
                full = max(t_l, t_p)
        if target and 1 in fractions:
            print(f"   {'PASS' if full < 1.0 else 'FAIL'}: one AFS round (slower of AFS-L, AFS-P) {full:.3f} s (< 1 s)")
    print("   (view s: building the jobs and the ClusterView, which the engine does incrementally instead)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-policies", action="store_true")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES), help="policies of table 0 (default: all)")
    ap.add_argument("--skip-trace", action="store_true")
    ap.add_argument("--skip-round", action="store_true")
    ap.add_argument("--fractions", default="8,4,2,1", help="sizes as 1/N, comma-separated (default 8,4,2,1)")
    args = ap.parse_args(argv)
    fractions = [int(x) for x in args.fractions.split(",")]
    if not args.skip_policies:
        bench_policies([n for n in args.policies.split(",") if n])
    if not args.skip_trace:
        bench_trace(fractions)
    if not args.skip_round:
        bench_round(fractions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
