"""Sim-to-real: the demo's 12-job workload in the simulator vs on the real local Slurm cluster.

The real run is `gandiva demo` (its <state>/demo-results.json: submit times, per-job JCTs and the
samples/s the wrapper measured at each GPU count). The simulated run feeds H5's engine the same jobs
(same submit offsets, GPU ranges and total samples), the same policy and quantum, the rates measured in
the real run (one speed profile for the demo model, by GPU count) and the suspend/resume overheads
measured by H3 (benchmarks/results/requeue.json; the simulator's guesses when that file is missing).
A slice's start-up (process + torch import, checkpoint load; 5-30 s on this 2-core machine depending on
load) is not in requeue.json: by default it is measured from the real run's slices (time in slices minus
samples / measured rate, per slice) and charged as the start and resume cost (--no-calibrate: off).
Prints per-job JCTs side by side with their ratio and PASS when every job is within the tolerance (15%).

    sudo .venv/bin/python benchmarks/bench_sim_vs_real.py                 # runs the demo first (~5 min)
    .venv/bin/python benchmarks/bench_sim_vs_real.py --real /tmp/gandiva-demo/demo-results.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from slurm_gandiva.demo import DEFAULT_STATE_DIR, RESULTS_FILE, WORKLOAD, Demo, DemoResult
from slurm_gandiva.model import JobSpec
from slurm_gandiva.sim.engine import Overheads, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.models import ModelProfile
from slurm_gandiva.sim.trace import Trace, TraceJob

REPO = Path(__file__).resolve().parent.parent
MODEL = "demo"


def speed_profile(real: DemoResult, gpus_per_node: int = 4, nodes: int = 2) -> ModelProfile:
    """One profile for the demo model: step time by GPU count from the rates measured in the real run.

    local_bsz = 1 sample, so step_time(k) = k / rate(k). Counts never measured are interpolated
    linearly between measured ones (flat above the largest); a placement over two nodes is given the
    rate of the largest single-node count (no gain), so the engine never prefers spreading.
    """
    by_k: dict[int, list[float]] = {}
    for j in real.jobs:
        for k, r in j.rates:
            by_k.setdefault(k, []).append(r)
    if 1 not in by_k:
        raise SystemExit("the real run measured no 1-GPU rate: cannot build the speed profile")
    known = {k: statistics.median(v) for k, v in sorted(by_k.items())}
    rate: dict[int, float] = {}
    for k in range(1, gpus_per_node + 1):
        lower = max(x for x in known if x <= k)
        upper = [x for x in known if x >= k]
        if k in known or not upper:
            rate[k] = known.get(k, known[lower])
        else:
            hi = min(upper)
            rate[k] = known[lower] + (k - lower) / (hi - lower) * (known[hi] - known[lower])
    best = rate[gpus_per_node]
    cross = {(n, k): k / best for n in range(2, nodes + 1) for k in range(2, n * gpus_per_node + 1)}
    return ModelProfile(MODEL, 1, {(k,): k / r for k, r in rate.items()}, cross)


def slice_dead_time(real: DemoResult, profile: ModelProfile) -> tuple[float, int]:
    """Median seconds per slice in which a job held its GPUs without progress, measured in the real run
    (process and torch start-up, checkpoint load and write, wrapper exit): over jobs that ran on one GPU
    count, (time in slices - samples / measured rate) / slices. Returns (seconds, jobs measured)."""
    deads = []
    for j in real.jobs:
        if not j.slice_log or any(end is None for _, end, _, _ in j.slice_log):
            continue
        counts = {k for _, _, k, _ in j.slice_log}
        if len(counts) != 1:
            continue
        busy = sum((end or start) - start for start, end, _, _ in j.slice_log)
        compute = j.total_samples / profile.throughput((counts.pop(),))
        deads.append(max(0.0, busy - compute) / len(j.slice_log))
    return (statistics.median(deads), len(deads)) if deads else (0.0, 0)


class WorkloadSimulator(Simulator):
    """The engine with each job's GPU range as submitted (the engine widens elastic ranges to 1..max)."""

    def __init__(self, *args: Any, ranges: dict[str, tuple[int, int]], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.ranges = ranges

    def make_jobs(self) -> list[Any]:
        recs = super().make_jobs()
        for r in recs:
            lo, hi = self.ranges[r.job.job_id]
            spec: JobSpec = replace(r.job.spec, min_gpus=lo, max_gpus=hi)
            r.job = replace(r.job, spec=spec, rates=self._table(MODEL, hi))
        return recs


def make_policy_for(real: DemoResult) -> Any:
    """The real run's policy with its parameters (as the controller's config parsed them)."""
    from slurm_gandiva.controller.config import parse_config
    from slurm_gandiva.selector import make_policy

    lines = [f"quantum = {real.quantum:g}", f"policy = {real.policy}"]
    lines += [f"policy.{k} = {v}" for k, v in real.params]
    params = parse_config("\n".join(lines), "demo-results").params
    if "quantum" not in params:
        params["quantum"] = real.quantum
    return make_policy(real.policy, **params)


def simulate(real: DemoResult, overheads: Overheads) -> SimResult:
    """The real run's jobs in the simulator (2 nodes x 4 GPUs, the same policy and quantum)."""
    profile = speed_profile(real)
    t0 = min(j.submitted for j in real.jobs)
    jobs = []
    for j in sorted(real.jobs, key=lambda j: (j.submitted, int(j.job_id))):
        rate = profile.throughput((j.min_gpus,))
        jobs.append(
            TraceJob(j.job_id, j.submitted - t0, j.total_samples / rate, j.min_gpus, MODEL, "gandiva-demo", j.max_gpus)
        )
    trace = Trace("demo", tuple(jobs))
    config = SimConfig(nodes=2, gpus_per_node=4, overheads=overheads, seed=0)
    sim = WorkloadSimulator(
        trace,
        make_policy_for(real),
        config,
        profiles={MODEL: profile},
        ranges={j.job_id: (j.min_gpus, j.max_gpus) for j in real.jobs},
    )
    return sim.run()


def compare(real: DemoResult, sim: SimResult, tolerance: float) -> bool:
    sim_by = {j.job_id: j for j in sim.jobs}
    o = sim.overheads
    print(
        f"policy {real.policy}, quantum {real.quantum:g} s; overheads from {o.source}: "
        f"start {o.start:.1f} s, suspend {o.suspend:.1f} s, resume {o.resume:.1f} s"
    )
    print(f"{'job':>6} {'name':<4} {'gpus':<5} {'real JCT s':>10} {'sim JCT s':>10} {'sim/real':>8}  within")
    ok = True
    real_jcts, sim_jcts = [], []
    for j in sorted(real.jobs, key=lambda j: int(j.job_id)):
        s = sim_by.get(j.job_id)
        rj, sj = j.jct, (s.jct if s is not None else None)
        gpus = f"{j.min_gpus}" if j.min_gpus == j.max_gpus else f"{j.min_gpus}:{j.max_gpus}"
        if rj is None or sj is None or rj <= 0:
            print(f"{j.job_id:>6} {j.name:<4} {gpus:<5} {rj!s:>10} {sj!s:>10} {'-':>8}  NO (unfinished)")
            ok = False
            continue
        ratio = sj / rj
        good = abs(ratio - 1.0) <= tolerance
        ok &= good
        real_jcts.append(rj)
        sim_jcts.append(sj)
        print(f"{j.job_id:>6} {j.name:<4} {gpus:<5} {rj:10.1f} {sj:10.1f} {ratio:8.2f}  {'yes' if good else 'NO'}")
    if real_jcts:
        ra, sa = statistics.mean(real_jcts), statistics.mean(sim_jcts)
        print(f"{'mean':>6} {'':<4} {'':<5} {ra:10.1f} {sa:10.1f} {sa / ra:8.2f}")
    verdict = "PASS" if ok else "FAIL"
    print(
        f"{verdict}: every job's simulated JCT within {tolerance:.0%} of the real one"
        if ok
        else f"{verdict}: some jobs' simulated JCT is more than {tolerance:.0%} off the real one"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", type=Path, help="demo-results.json of a real run (default: run the demo now)")
    ap.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help="demo state dir")
    ap.add_argument("--overheads", type=Path, default=REPO / "benchmarks" / "results" / "requeue.json")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="do not take the per-slice start-up time from the real run (use the file/guesses)",
    )
    args = ap.parse_args(argv)
    path = args.real
    if path is None:
        demo = Demo(args.state_dir, workload=WORKLOAD)
        if demo.run() != 0:
            print("the real run failed: no comparison", file=sys.stderr)
            return 1
        path = args.state_dir / RESULTS_FILE
    real = DemoResult.from_json(path.read_text())
    overheads = Overheads.from_file(args.overheads) if args.overheads.is_file() else Overheads()
    if overheads.source == "guess":
        print(f"note: {args.overheads} is missing: suspend/migrate costs are the simulator's guesses")
    if args.calibrate:
        dead, n = slice_dead_time(real, speed_profile(real))
        if n:
            overheads = replace(
                overheads,
                start=dead,
                resume=max(overheads.resume, dead),
                source=f"{overheads.source} + start-up measured in the real run",
            )
            print(f"start-up dead time per slice, measured over {n} real jobs: {dead:.1f} s")
    sim = simulate(real, overheads)
    return 0 if compare(real, sim, args.tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
