"""Acceptance table of the policies on the Philly trace (issue 3), from one run.

64 GPUs (16 nodes x 4), virtual clusters 2869ce, 0e4a51, 7f04ca, ee9e8c, first 500 jobs each, load 1.0
and 1.5; every policy runs the same jobs (same seeded models). Prints, per trace, average JCT and time
to the first 100 mini-batches with ratios to `slurm` (plain Slurm: FIFO with backfill, what a site's
users have without us; strict `fifo` is a column beside it), then PASS/FAIL for each criterion:

  1. average JCT orders Slurm > Tiresias >= SRTF > AFS-P >= AFS-L (on the mean over the traces of each
     policy's JCT / AFS-L's JCT; the per-trace count is shown too)
  2. AFS-L >= 1.5x better than Tiresias on average over the traces
  3. AFS-L >= 1.8x better than Slurm on average over the traces
  4. AFS-L >= 1.8x better than strict FIFO on average over the traces (for comparison with issue 3)
  5. Gandiva cuts time to first 100 mini-batches >= 4x against Slurm at load >= 1.0 (mean over traces)
  6. default within 5% of AFS-L on average JCT (mean over traces)
  7. default within 10% of Gandiva on time to first feedback (mean over traces)
  8. (issue 31) Gandiva's average JCT ratio to Slurm <= 0.45 (geo-mean), keeping its early-feedback lead
     (criterion 5); Gandiva no worse than Slurm in average JCT on any trace; its p99 JCT within 1.2x of
     Slurm's (geo-mean); for each Gandiva column run (`gandiva`, and `gandiva+park` with --park gandiva)

`--park P1,P2` also runs those policies with the co-held switch (`SimConfig.park`: a switch between two jobs
on the same GPUs parks and unparks in place, at requeue.json's park/unpark costs) as columns `P+park`.

Usage: .venv/bin/python benchmarks/bench_policies.py [--procs 2] [--jobs 500] [--vcs ...] [--loads ...]
       [--policies ...] [--park gandiva] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict

from slurm_gandiva.plan import Action
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.sim.engine import Overheads, SimConfig, Simulator
from slurm_gandiva.sim.metrics import Summary
from slurm_gandiva.sim.trace import load_philly

VCS = ("2869ce", "0e4a51", "7f04ca", "ee9e8c")
LOADS = (1.0, 1.5)


PARK = "+park"  # column suffix of a policy run with the co-held switch


def run_one(
    vc: str, load: float, jobs: int, policy: str, seed: int, overheads: Overheads
) -> tuple[str, float, str, dict[str, float], float]:
    trace = load_philly(vc=vc, jobs=jobs, load=load)
    pol = make_policy(policy.removesuffix(PARK))
    t0 = time.perf_counter()
    res = Simulator(trace, pol, SimConfig(seed=seed, overheads=overheads, park=policy.endswith(PARK))).run()
    wall = time.perf_counter() - t0
    s = Summary.of(res)
    return vc, load, policy, asdict(s), wall


def geo(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--vcs", default=",".join(VCS))
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS))
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--park", default="", help="also run these policies with the co-held switch (columns P+park)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write every run's summary to this file")
    ap.add_argument(
        "--guess-overheads",
        action="store_true",
        help="charge the documented guesses instead of benchmarks/results/requeue.json",
    )
    ap.add_argument("--overheads", help="overheads JSON (default: benchmarks/results/requeue.json, else guesses)")
    ap.add_argument("--resume", action="store_true", help="skip the runs already in --json")
    ap.add_argument("--report-only", action="store_true", help="print the tables from --json, run nothing")
    args = ap.parse_args(argv)
    vcs = args.vcs.split(",")
    loads = [float(x) for x in args.loads.split(",")]
    policies = args.policies.split(",")
    policies += [p + PARK for p in args.park.split(",") if p]
    if args.guess_overheads:
        overheads = Overheads()
    elif args.overheads:
        overheads = Overheads.from_file(args.overheads)
    else:
        overheads = Overheads.default()
    print(
        f"overheads from {overheads.source}: start {overheads.start:.1f} s, suspend {overheads.suspend:.1f} s,"
        f" resume {overheads.resume:.1f} s, migrate/resize/pack {overheads.cost(Action.MIGRATE):.1f} s,"
        f" park {overheads.park:.3f} s, unpark {overheads.unpark:.3f} s"
    )
    tasks = [(vc, load, args.jobs, p, args.seed, overheads) for vc in vcs for load in loads for p in policies]
    results: dict[tuple[str, float, str], dict[str, float]] = {}
    walls: dict[tuple[str, float, str], float] = {}
    if args.json and (args.resume or args.report_only) and os.path.exists(args.json):
        with open(args.json) as fh:
            for row in json.load(fh):
                key = (row["vc"], float(row["load"]), row["policy"])
                walls[key] = row.pop("wall_s")
                results[key] = {k: v for k, v in row.items() if k not in ("vc", "load", "policy")}
        print(f"{len(results)} runs read from {args.json}", file=sys.stderr)
    todo = [] if args.report_only else [t for t in tasks if (t[0], t[1], t[3]) not in results]
    # One trace after another, cheap policies first: a partial run (--json is written after every
    # simulation) then gives complete traces.
    cost = {"fifo": 0, "slurm": 0, "srtf": 1, "afs-l": 2, "afs-p": 3, "tiresias": 4, "default": 5, "gandiva": 6}
    order = {(vc, ld): i for i, (vc, ld) in enumerate((vc, ld) for ld in loads for vc in vcs)}
    todo.sort(key=lambda t: (order[(t[0], t[1])], cost.get(t[3].removesuffix(PARK), 9), t[3]))
    t0 = time.perf_counter()
    if todo:
        with ProcessPoolExecutor(max_workers=args.procs) as pool:
            futures = [pool.submit(run_one, *t) for t in todo]
            for i, f in enumerate(as_completed(futures), 1):
                vc, load, pol, summ, wall = f.result()
                results[(vc, load, pol)] = summ
                walls[(vc, load, pol)] = wall
                print(f"[{i}/{len(todo)}] {vc} load {load} {pol}: {wall:.1f} s", file=sys.stderr, flush=True)
                if args.json:
                    _dump(args.json, results, walls)
    total = time.perf_counter() - t0
    report(results, walls, vcs, loads, policies, args.jobs)
    print(f"\n{len(todo)} simulations in {total:.0f} s wall with {args.procs} processes", file=sys.stderr)
    return 0


def report(
    results: dict[tuple[str, float, str], dict[str, float]],
    walls: dict[tuple[str, float, str], float],
    vcs: list[str],
    loads: list[float],
    policies: list[str],
    jobs: int,
) -> None:
    """Print the tables and the acceptance verdicts; runs missing from `results` show as '-'."""
    traces = [(vc, load) for vc in vcs for load in loads]

    def get(vc: str, ld: float, p: str, field: str) -> float | None:
        row = results.get((vc, ld, p))
        return None if row is None else float(row[field])

    def table(title: str, field: str, ref: str, div: float, fmt: str, rfmt: str = "5.2f") -> dict[str, float]:
        print(f"\n{title}")
        header = f"{'trace':<14}" + "".join(f"{p:>17}" for p in policies)
        print(header)
        print("-" * len(header))
        ratios: dict[str, list[float]] = {p: [] for p in policies}
        for vc, ld in traces:
            base = get(vc, ld, ref, field)
            cells = []
            for p in policies:
                v = get(vc, ld, p, field)
                if v is None:
                    cells.append("-")
                elif base:
                    cells.append(f"{format(v / div, fmt)} ({format(v / base, rfmt)}x)")
                    ratios[p].append(v / base)
                else:
                    cells.append(format(v / div, fmt))
            print(f"{vc + ' x' + str(ld):<14}" + "".join(f"{c:>17}" for c in cells))
        means = {p: geo(r) for p, r in ratios.items()}
        print(f"{'geo-mean':<14}" + "".join(f"{'(' + format(means[p], rfmt.strip('56')) + 'x)':>17}" for p in policies))
        return means

    ref = next((p for p in ("slurm", "fifo") if p in policies), policies[0])
    table(
        f"Average JCT (hours) and ratio to {ref}; 64 GPUs, first {jobs} jobs per virtual cluster",
        "avg_jct",
        ref,
        3600,
        "8.1f",
    )
    table(
        f"Time to first 100 mini-batches (minutes, average over jobs) and ratio to {ref}",
        "avg_time_to_feedback",
        ref,
        60,
        "9.1f",
        "6.4f",
    )
    table(f"p99 JCT (hours) and ratio to {ref}", "p99_jct", ref, 3600, "8.1f")

    print("\nOther figures (mean over the traces run): utilisation %, suspends / migrations / resizes per job")
    for p in policies:
        keys = [(vc, ld, p) for vc, ld in traces if (vc, ld, p) in results]
        if not keys:
            print(f"  {p:<9} not run")
            continue

        def avg(field: str, keys: list[tuple[str, float, str]] = keys) -> float:
            return sum(float(results[k].get(field, 0.0)) for k in keys) / len(keys)

        unfinished = sum(int(results[k]["jobs"]) - int(results[k]["finished"]) for k in keys)
        print(
            f"  {p:<9} util {100 * avg('gpu_utilisation'):5.1f}%  susp {avg('suspends_per_job'):8.2f}"
            f"  park {avg('parks_per_job'):7.2f}"
            f"  migr {avg('migrations_per_job'):6.2f}  resize {avg('resizes_per_job'):6.2f}"
            f"  sim wall {sum(walls[k] for k in keys):7.1f} s over {len(keys)} runs  unfinished jobs {unfinished}"
        )

    need = ("slurm", "fifo", "srtf", "tiresias", "gandiva", "afs-l", "afs-p", "default")
    if not set(need) <= set(policies):
        return
    complete = [(vc, ld) for vc, ld in traces if all((vc, ld, p) in results for p in need)]
    print(
        f"\nAcceptance, over the {len(complete)} of {len(traces)} traces with every policy run (geo-means of ratios):"
    )
    if not complete:
        print("  NOT RUN: no trace has results for every policy")
        return

    def val(vc: str, ld: float, p: str, field: str) -> float:
        return float(results[(vc, ld, p)][field])

    jct = {p: geo([val(vc, ld, p, "avg_jct") / val(vc, ld, "afs-l", "avg_jct") for vc, ld in complete]) for p in need}
    ttf = {
        p: geo(
            [
                val(vc, ld, p, "avg_time_to_feedback") / val(vc, ld, "slurm", "avg_time_to_feedback")
                for vc, ld in complete
                if ld >= 1.0
            ]
        )
        for p in need
    }
    holds = 0
    for vc, ld in complete:
        j = {p: val(vc, ld, p, "avg_jct") for p in need}
        holds += j["slurm"] > j["tiresias"] >= j["srtf"] > j["afs-p"] >= j["afs-l"]
    r = jct
    checks = [
        (
            "JCT order Slurm > Tiresias >= SRTF > AFS-P >= AFS-L",
            r["slurm"] > r["tiresias"] >= r["srtf"] > r["afs-p"] >= r["afs-l"],
            f"slurm {r['slurm']:.2f} tiresias {r['tiresias']:.2f} srtf {r['srtf']:.2f} afs-p {r['afs-p']:.2f}"
            f" afs-l 1.00; holds on {holds}/{len(complete)} traces",
        ),
        ("AFS-L >= 1.5x better than Tiresias", r["tiresias"] >= 1.5, f"{r['tiresias']:.2f}x"),
        ("AFS-L >= 1.8x better than Slurm", r["slurm"] >= 1.8, f"{r['slurm']:.2f}x"),
        ("AFS-L >= 1.8x better than strict FIFO", r["fifo"] >= 1.8, f"{r['fifo']:.2f}x"),
        ("Gandiva first-100 >= 4x faster than Slurm", ttf["gandiva"] <= 0.25, f"{1 / ttf['gandiva']:.1f}x"),
        ("default within 5% of AFS-L on JCT", r["default"] <= 1.05, f"default/afs-l {r['default']:.3f}"),
        (
            "default within 10% of Gandiva on first-100",
            ttf["default"] <= 1.10 * ttf["gandiva"],
            f"default/gandiva {ttf['default'] / ttf['gandiva']:.3f}",
        ),
    ]
    for col in (g for g in ("gandiva", "gandiva" + PARK) if g in policies):
        ours = [(vc, ld) for vc, ld in complete if (vc, ld, col) in results]
        if not ours:
            continue
        ratio = geo([val(vc, ld, col, "avg_jct") / val(vc, ld, "slurm", "avg_jct") for vc, ld in ours])
        lead = geo([val(vc, ld, col, "avg_time_to_feedback") / val(vc, ld, "slurm", "avg_time_to_feedback")
                    for vc, ld in ours if ld >= 1.0])
        worst = max(ours, key=lambda t: val(t[0], t[1], col, "avg_jct") / val(t[0], t[1], "slurm", "avg_jct"))
        w = val(*worst, col, "avg_jct") / val(*worst, "slurm", "avg_jct")
        p99 = geo([val(vc, ld, col, "p99_jct") / val(vc, ld, "slurm", "p99_jct") for vc, ld in ours])
        checks += [
            (f"{col}: avg JCT / slurm <= 0.45 (issue 31)", ratio <= 0.45, f"{ratio:.2f}x"),
            (f"{col}: first-100 lead kept (>= 4x, issue 31)", lead <= 0.25, f"{1 / lead:.1f}x"),
            (f"{col}: no trace worse than slurm in avg JCT", w <= 1.0, f"worst {worst[0]} x{worst[1]} {w:.2f}x"),
            (f"{col}: p99 JCT within 1.2x of slurm", p99 <= 1.2, f"{p99:.2f}x"),
        ]
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name:<52} {detail}")
    if len(complete) < len(traces):
        print(f"  (partial: {len(traces) - len(complete)} traces lack a policy's run; see the tables)")


def _dump(
    path: str, results: dict[tuple[str, float, str], dict[str, float]], walls: dict[tuple[str, float, str], float]
) -> None:
    with open(path, "w") as fh:
        json.dump(
            [
                {**results[(vc, ld, p)], "vc": vc, "load": ld, "policy": p, "wall_s": walls[(vc, ld, p)]}
                for vc, ld, p in results
            ],
            fh,
            indent=1,
        )


if __name__ == "__main__":
    sys.exit(main())
