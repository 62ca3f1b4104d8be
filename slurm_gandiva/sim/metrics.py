"""Summary metrics of a simulation run, comparison tables and JSON/CSV output."""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from slurm_gandiva.sim.engine import SimResult


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """The headline figures of one run (seconds unless named otherwise)."""

    policy: str
    trace: str
    jobs: int
    finished: int
    avg_jct: float
    median_jct: float
    p99_jct: float
    avg_queueing: float
    median_queueing: float
    avg_time_to_feedback: float  # time to the first 100 mini-batches
    median_time_to_feedback: float
    makespan: float
    gpu_utilisation: float  # GPUs held (whole or by shards, each GPU once) over the makespan, 0..1
    suspends_per_job: float
    migrations_per_job: float
    resizes_per_job: float
    packs_per_job: float
    parks_per_job: float = 0.0  # co-held switches (`SimConfig.park`); suspends_per_job counts requeues

    @staticmethod
    def of(result: SimResult) -> Summary:
        fin = result.finished
        jct = [j.jct for j in fin if j.jct is not None]
        queue = [j.queueing_delay for j in result.jobs if j.queueing_delay is not None]
        ttf = [j.time_to_feedback for j in result.jobs if j.time_to_feedback is not None]
        first = min((j.submit for j in result.jobs), default=0.0)
        last = max((j.finish for j in fin if j.finish is not None), default=first)
        makespan = last - first
        busy = 0.0
        for a, b in itertools.pairwise(result.samples):
            busy += a.gpus_busy * (b.time - a.time)
        n = len(result.jobs) or 1
        return Summary(
            policy=result.policy,
            trace=result.trace,
            jobs=len(result.jobs),
            finished=len(fin),
            avg_jct=mean(jct),
            median_jct=percentile(jct, 50),
            p99_jct=percentile(jct, 99),
            avg_queueing=mean(queue),
            median_queueing=percentile(queue, 50),
            avg_time_to_feedback=mean(ttf),
            median_time_to_feedback=percentile(ttf, 50),
            makespan=makespan,
            gpu_utilisation=busy / (result.total_gpus * makespan) if makespan > 0 else math.nan,
            suspends_per_job=sum(j.suspends for j in result.jobs) / n,
            migrations_per_job=sum(j.migrations for j in result.jobs) / n,
            resizes_per_job=sum(j.resizes for j in result.jobs) / n,
            packs_per_job=sum(j.packs for j in result.jobs) / n,
            parks_per_job=sum(j.parks for j in result.jobs) / n,
        )


# (field, header, unit divisor, format); lower is better for all but utilisation.
_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("avg_jct", "avg JCT h", 3600.0, "{:.2f}"),
    ("median_jct", "med JCT h", 3600.0, "{:.2f}"),
    ("p99_jct", "p99 JCT h", 3600.0, "{:.1f}"),
    ("avg_queueing", "avg queue h", 3600.0, "{:.2f}"),
    ("avg_time_to_feedback", "first-100 min", 60.0, "{:.1f}"),
    ("makespan", "makespan h", 3600.0, "{:.1f}"),
    ("gpu_utilisation", "util %", 0.01, "{:.1f}"),
    ("suspends_per_job", "susp/job", 1.0, "{:.2f}"),
    ("migrations_per_job", "migr/job", 1.0, "{:.2f}"),
    ("resizes_per_job", "resize/job", 1.0, "{:.2f}"),
)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(summaries: Sequence[Summary], baseline: str | None = None) -> str:
    """A table with one row per policy; with `baseline`, each figure is followed by its ratio to it."""
    base = next((s for s in summaries if s.policy == baseline), None)
    header = ["policy", "done", *(h for _, h, _, _ in _COLUMNS)]
    rows = [header]
    for s in summaries:
        row = [s.policy, f"{s.finished}/{s.jobs}"]
        for name, _, div, fmt in _COLUMNS:
            v = getattr(s, name)
            cell = fmt.format(v / div) if not math.isnan(v) else "-"
            if base is not None and base is not s:
                b = getattr(base, name)
                if b and not math.isnan(b) and not math.isnan(v):
                    cell += f" ({v / b:.2f}x)"
            row.append(cell)
        rows.append(row)
    return _table(rows)


def write_results(result: SimResult, out: Path, stem: str | None = None) -> list[Path]:
    """<stem>.summary.json, <stem>.jobs.csv and <stem>.timeline.csv under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or result.policy
    summary = Summary.of(result)
    p_sum = out / f"{stem}.summary.json"
    payload = {
        "summary": asdict(summary),
        "total_gpus": result.total_gpus,
        "elastic": result.elastic,
        "overheads": asdict(result.overheads),
        "decisions": result.decisions,
        "actions": result.actions,
        "end_time": result.end_time,
    }
    p_sum.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    p_jobs = out / f"{stem}.jobs.csv"
    names = [f.name for f in fields(result.jobs[0])] if result.jobs else []
    with p_jobs.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*names, "jct", "queueing_delay", "time_to_feedback"])
        for j in result.jobs:
            w.writerow([*(getattr(j, n) for n in names), j.jct, j.queueing_delay, j.time_to_feedback])
    p_tl = out / f"{stem}.timeline.csv"
    with p_tl.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "gpus_busy", "running", "waiting"])
        for s in result.samples:
            w.writerow([s.time, s.gpus_busy, s.running, s.waiting])
    return [p_sum, p_jobs, p_tl]
