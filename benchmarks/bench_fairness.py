"""Fairness among tenants (issue 30, item 6): the policies with and without the fair-share layer, one run.

Policies: `slurm` with its multifactor fairshare (Fair Tree, weights 10000/1000: what sites run), `slurm`
in strict submit order (fairshare=off: the baseline before issue 30), gandiva, afs-l, default; each
without and with the fair-share layer (`FairShare`, equal shares). Every scenario's tenants are
(account, user) pairs with one user per account. rho is finish-time fairness (sim/fairness.py): a job's
JCT over its JCT when its tenant runs alone on floor(GPUs x its share) GPUs with the same policy.

(a) Two users, 8 GPUs: alice submits 40 x 4-hour 1-GPU jobs at t=0, bob 4 such jobs at t=10 min.
    Bob's and alice's average JCT; ratios: bob's to his 4 h, alice's to her JCT without shares.
(b) Philly virtual clusters 2869ce, 0e4a51, 7f04ca, ee9e8c (first --jobs each, arrivals compressed by
    the load as bench_policies.py does) merged as four tenants on 256 GPUs, load 1.0 and 1.5; each
    VC alone on 64 GPUs is the rho denominator. Per-tenant average rho, the worst, the overall average
    JCT (ratio to default without shares), Jain's index over GPU-time received / entitled.
(c) A 500-task array (1-GPU, 1-hour tasks at t=0) of one tenant beside three tenants with four 2-GPU
    2-hour jobs each at t=30 min, 32 GPUs: the small tenants' average JCT and worst rho, the array's
    average JCT.

Then PASS/FAIL for the issue's acceptance lines:
  (a) bob's average JCT within 1.25x of 4 h under gandiva, afs-l and default with shares, and alice's
      within 15% of her JCT without shares;
  (b) at each load, with shares under default: no tenant's average rho above 1.0, the worst tenant's
      rho at least 1.5x lower than under slurm with fairshare (no layer), the overall average JCT
      within 10% of default without shares.

Usage: .venv/bin/python benchmarks/bench_fairness.py [--procs 2] [--jobs 500] [--quick] [--out FILE]
  --quick: 100 jobs per VC in (b), load 1.0 only (for CI).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.sim.engine import Overheads, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.fairness import Fairness, isolated_jcts
from slurm_gandiva.sim.trace import Trace, TraceJob, load_philly

VCS = ("2869ce", "0e4a51", "7f04ca", "ee9e8c")
HOURS4 = 4 * 3600.0
# label -> (policy name, parameters)
POLICIES: dict[str, tuple[str, dict[str, object]]] = {
    "slurm-fs": ("slurm", {}),
    "slurm-fifo": ("slurm", {"fairshare": "off"}),
    "gandiva": ("gandiva", {}),
    "afs-l": ("afs-l", {}),
    "default": ("default", {}),
}
RESULTS = Path(__file__).resolve().parent / "results" / "fairness.txt"


def maker(label: str) -> Callable[[], Policy]:
    name, params = POLICIES[label]
    return lambda: make_policy(name, **params)


def two_users() -> Trace:
    jobs = [TraceJob(f"a{i}", 0.0, HOURS4, 1, model="cifar10", user="alice", account="alice") for i in range(40)]
    jobs += [TraceJob(f"b{i}", 600.0, HOURS4, 1, model="cifar10", user="bob", account="bob") for i in range(4)]
    return Trace("two-users", tuple(jobs))


def array_and_few() -> Trace:
    jobs = [
        TraceJob(f"s{i}", 0.0, 3600.0, 1, model="cifar10", user="sweep", account="sweep", group="sweep")
        for i in range(500)
    ]
    for t in ("t1", "t2", "t3"):
        jobs += [TraceJob(f"{t}-{i}", 1800.0, 7200.0, 2, model="imagenet", user=t, account=t) for i in range(4)]
    return Trace("array+3", tuple(sorted(jobs, key=lambda j: j.submit_time)))


def philly_merged(jobs: int, load: float, config: SimConfig) -> Trace:
    """The four VCs as four tenants, each from t=0, models drawn once (so the isolated runs get the same)."""
    merged: list[TraceJob] = []
    for vc in VCS:
        t = load_philly(vc=vc, jobs=jobs, load=load)
        merged += [replace(j, job_id=f"{vc}:{j.job_id}", user=vc, account=vc) for j in t.jobs]
    trace = Trace(f"philly-4vc-x{load}", tuple(sorted(merged, key=lambda j: j.submit_time)))
    drawn = {r.job.job_id: r.job.spec.model for r in Simulator(trace, make_policy("fifo"), config).make_jobs()}
    return Trace(trace.name, tuple(replace(j, model=drawn[j.job_id]) for j in trace.jobs))


def config_for(gpus: int, overheads: Overheads) -> SimConfig:
    return SimConfig(nodes=gpus // 4, gpus_per_node=4, overheads=overheads)


def run_case(trace: Trace, label: str, shares: bool, gpus: int, overheads: Overheads) -> tuple[SimResult, float]:
    inner = maker(label)()
    pol: Any = FairShare(inner) if shares else inner
    t0 = time.perf_counter()
    res = Simulator(trace, pol, config_for(gpus, overheads)).run()
    return res, time.perf_counter() - t0


def run_isolated(trace: Trace, label: str, gpus: int, overheads: Overheads) -> tuple[dict[str, float], float]:
    """Job id -> JCT alone on its tenant's share (the models are pinned in the trace: no shared run needed)."""
    t0 = time.perf_counter()
    stub = SimResult(label, trace.name, gpus, False, overheads, (), (), 0.0, 0, 0)
    out = isolated_jcts(trace, stub, maker(label), config_for(gpus, overheads))
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=500, help="jobs per VC in (b) (default 500)")
    ap.add_argument("--loads", default="1.0,1.5")
    ap.add_argument("--quick", action="store_true", help="100 jobs per VC, load 1.0 only")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"write the table here (default {RESULTS})")
    args = ap.parse_args(argv)
    jobs = 100 if args.quick else args.jobs
    loads = [1.0] if args.quick else [float(x) for x in args.loads.split(",")]
    labels = args.policies.split(",")
    overheads = Overheads.default()
    wall0 = time.perf_counter()
    traces: dict[str, tuple[Trace, int]] = {"a": (two_users(), 8), "c": (array_and_few(), 32)}
    for ld in loads:
        traces[f"b{ld}"] = (philly_merged(jobs, ld, config_for(256, overheads)), 256)
    shared: dict[tuple[str, str, bool], SimResult] = {}
    alone: dict[tuple[str, str], dict[str, float]] = {}
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        runs = {
            (key, lb, sh): pool.submit(run_case, tr, lb, sh, gpus, overheads)
            for key, (tr, gpus) in traces.items()
            for lb in labels
            for sh in (False, True)
        }
        solo = {
            (key, lb): pool.submit(run_isolated, tr, lb, gpus, overheads)
            for key, (tr, gpus) in traces.items()
            if key != "a"
            for lb in labels
        }
        for k, f in runs.items():
            shared[k], wall = f.result()
            print(f"  {k[0]:<6} {k[1]:<10} {'shares' if k[2] else 'alone ':<6} {wall:6.1f} s", file=sys.stderr)
        for k2, f2 in solo.items():
            alone[k2], wall = f2.result()
            print(f"  {k2[0]:<6} {k2[1]:<10} isolated {wall:6.1f} s", file=sys.stderr)
    for lb in labels:  # (a): each tenant alone on 4 GPUs (its share) is cheap to compute here
        alone[("a", lb)] = run_isolated(traces["a"][0], lb, 8, overheads)[0]
    text, ok = report(traces, shared, alone, labels, jobs, loads)
    elapsed = time.perf_counter() - wall0
    text += f"\n\n{len(shared) + len(alone)} simulations in {elapsed:.0f} s wall with {args.procs} processes"
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if ok else 1


def _avg(res: SimResult, prefix: str) -> float:
    jcts = [j.jct for j in res.jobs if j.job_id.startswith(prefix) and j.jct is not None]
    return sum(jcts) / len(jcts) if jcts else math.nan


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join([_row(header, widths), "  ".join("-" * w for w in widths), *(_row(r, widths) for r in rows)])


def report(
    traces: dict[str, tuple[Trace, int]],
    shared: dict[tuple[str, str, bool], SimResult],
    alone: dict[tuple[str, str], dict[str, float]],
    labels: list[str],
    jobs: int,
    loads: list[float],
) -> tuple[str, bool]:
    out: list[str] = []
    fair = {k: Fairness.of(r, traces[k[0]][0], {}, alone.get((k[0], k[1]))) for k, r in shared.items()}

    def name(lb: str, sh: bool) -> str:
        return f"{lb}{' +shares' if sh else ''}"

    out.append("(a) two users on 8 GPUs: alice 40 x 4 h 1-GPU jobs at t=0, bob 4 such at 10 min (hours)")
    rows = []
    for lb in labels:
        for sh in (False, True):
            r = shared[("a", lb, sh)]
            bob, alice = _avg(r, "b"), _avg(r, "a")
            base = _avg(shared[("a", lb, False)], "a")
            f = fair[("a", lb, sh)]
            rows.append([
                name(lb, sh), f"{bob / 3600:.2f} ({bob / HOURS4:.2f}x of 4 h)",
                f"{alice / 3600:.2f} ({alice / base:.2f}x)", f"{f.worst_tenant_rho:.2f}", f"{f.jain:.3f}",
            ])
    out.append(_table(["policy", "bob avg JCT", "alice avg JCT (x no shares)", "worst rho", "Jain"], rows))

    for ld in loads:
        key = f"b{ld}"
        out.append(
            f"\n(b) Philly {', '.join(VCS)} (first {jobs} each) as 4 tenants on 256 GPUs, load {ld};"
            " rho against each VC alone on 64 GPUs"
        )
        base = "default" if "default" in labels else None  # else each policy against itself without shares
        rows = []
        for lb in labels:
            base_jct = _avg(shared[(key, base or lb, False)], "")
            for sh in (False, True):
                f = fair[(key, lb, sh)]
                rhos = {t.tenant[0]: t.avg_rho for t in f.tenants}
                jct = _avg(shared[(key, lb, sh)], "")
                rows.append([
                    name(lb, sh), *(f"{rhos[vc]:.2f}" for vc in VCS), f"{f.worst_tenant_rho:.2f}",
                    f"{jct / 3600:.2f} ({jct / base_jct:.2f}x)", f"{f.jain:.3f}",
                ])
        out.append(_table(
            ["policy", *(f"rho {vc}" for vc in VCS), "worst rho", f"avg JCT h (x {base or 'no shares'})", "Jain"], rows
        ))

    out.append("\n(c) a 500-task array (1 GPU, 1 h) beside 3 tenants with 4 x 2-GPU 2-hour jobs at 30 min, 32 GPUs")
    rows = []
    for lb in labels:
        for sh in (False, True):
            r = shared[("c", lb, sh)]
            f = fair[("c", lb, sh)]
            small = [t for t in f.tenants if t.tenant[0] != "sweep"]
            few = sum(t.avg_jct for t in small) / len(small)
            sweep = _avg(r, "s")
            sweep0 = _avg(shared[("c", lb, False)], "s")
            rows.append([
                name(lb, sh), f"{few / 3600:.2f}", f"{max(t.avg_rho for t in small):.2f}",
                f"{sweep / 3600:.2f} ({sweep / sweep0:.2f}x)", f"{f.jain:.3f}",
            ])
    out.append(_table(["policy", "few-job tenants avg JCT h", "their worst rho", "array avg JCT h", "Jain"], rows))

    checks: list[tuple[str, bool, str]] = []
    for lb in ("gandiva", "afs-l", "default"):
        if lb not in labels:
            continue
        bob = _avg(shared[("a", lb, True)], "b") / HOURS4
        alice = _avg(shared[("a", lb, True)], "a") / _avg(shared[("a", lb, False)], "a")
        checks.append((f"(a) {lb}: bob within 1.25x of 4 h", bob <= 1.25, f"{bob:.2f}x"))
        checks.append((f"(a) {lb}: alice within 15% of no shares", alice <= 1.15, f"{alice:.2f}x"))
    if {"default", "slurm-fs"} <= set(labels):
        for ld in loads:
            key = f"b{ld}"
            f = fair[(key, "default", True)]
            worst = f.worst_tenant_rho
            slurm = fair[(key, "slurm-fs", False)].worst_tenant_rho
            jct = _avg(shared[(key, "default", True)], "") / _avg(shared[(key, "default", False)], "")
            checks.append((f"(b) x{ld}: default+shares, no tenant's rho above 1.0", worst <= 1.0, f"worst {worst:.2f}"))
            checks.append((
                f"(b) x{ld}: worst rho >= 1.5x lower than slurm-fs", slurm >= 1.5 * worst,
                f"slurm-fs {slurm:.2f} / {worst:.2f} = {slurm / worst:.2f}x",
            ))
            checks.append((f"(b) x{ld}: avg JCT within 10% of default", jct <= 1.10, f"{jct:.3f}x"))
    out.append("\nAcceptance (issue 30):")
    out += [f"  {'PASS' if ok else 'FAIL'}  {n:<52} {d}" for n, ok, d in checks]
    return "\n".join(out), all(ok for _, ok, _ in checks)


if __name__ == "__main__":
    sys.exit(main())
