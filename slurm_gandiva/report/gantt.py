"""Gantt chart of GPUs over time (one colour per job, suspends and migrations marked) and a JCT summary.

`layout()` and `jct_summary()` are pure; `draw_gantt()` only renders their result with matplotlib (Agg).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_gandiva.model import GpuRef, JobState, Topology
from slurm_gandiva.store.api import JobRecord, SliceEnd, SliceRecord

# Slice ends worth a marker on the chart, and how each is drawn (matplotlib marker, label).
MARKERS: dict[SliceEnd, tuple[str, str]] = {
    SliceEnd.QUANTUM: ("|", "suspended"),
    SliceEnd.MIGRATE: (">", "migrated"),
    SliceEnd.RESIZE: ("s", "resized"),
    SliceEnd.PACK: ("D", "packed/unpacked"),
    SliceEnd.REQUEUED: ("x", "requeued"),
    SliceEnd.FAILED: ("X", "failed"),
    SliceEnd.CANCELLED: ("v", "cancelled"),
}
MARKER_COLOUR = "black"


@dataclass(frozen=True)
class Bar:
    """One job's use of one GPU during one slice. Shared slices sit in lane 0 or 1 of half height."""

    gpu: GpuRef
    job_id: str
    start: float
    end: float
    shared: bool
    lane: int
    end_reason: SliceEnd | None


@dataclass(frozen=True)
class Marker:
    gpu: GpuRef
    job_id: str
    at: float
    reason: SliceEnd


@dataclass(frozen=True)
class GanttLayout:
    rows: tuple[GpuRef, ...]  # top to bottom
    jobs: tuple[str, ...]  # colour order
    bars: tuple[Bar, ...]
    markers: tuple[Marker, ...]
    t0: float
    t1: float


def layout(slices: Iterable[SliceRecord], now: float, topology: Topology | None = None) -> GanttLayout:
    """Place every slice on its GPU rows; open slices run to `now`."""
    items = sorted(slices, key=lambda s: (s.start, s.id))
    gpus = set(topology.all_gpus(up_only=False)) if topology else set()
    for s in items:
        gpus.update(s.placement.gpus)
    jobs: list[str] = []
    bars: list[Bar] = []
    markers: list[Marker] = []
    lane_free: dict[tuple[GpuRef, int], float] = {}
    for s in items:
        if s.job_id not in jobs:
            jobs.append(s.job_id)
        end = s.end if s.end is not None else max(now, s.start)
        for g in s.placement.gpus:
            lane = 0
            if s.placement.shared:
                # first lane whose previous shared bar ended by our start
                lane = next((k for k in range(8) if lane_free.get((g, k), float("-inf")) <= s.start), 0)
                lane_free[(g, lane)] = end
            bars.append(Bar(g, s.job_id, s.start, end, s.placement.shared, lane, s.end_reason))
            if s.end_reason in MARKERS and s.end is not None:
                markers.append(Marker(g, s.job_id, s.end, s.end_reason))
    t0 = min((b.start for b in bars), default=now)
    t1 = max((b.end for b in bars), default=now)
    return GanttLayout(tuple(sorted(gpus)), tuple(jobs), tuple(bars), tuple(markers), t0, t1)


def draw_gantt(lay: GanttLayout, path: str | os.PathLike[str], *, title: str = "GPU allocation over time") -> None:
    """Render the layout to a PNG file."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cmap = plt.get_cmap("tab20")
    # the 10 dark tab20 hues first, then their light twins: neighbouring jobs never get look-alikes
    colour = {j: cmap((2 * i) % 20 + (i // 10) % 2) for i, j in enumerate(lay.jobs)}
    row_of = {g: i for i, g in enumerate(lay.rows)}
    height = max(3.0, 0.35 * len(lay.rows) + 1.5)
    fig, ax = plt.subplots(figsize=(12, height))
    try:
        for b in lay.bars:
            y = row_of[b.gpu]
            if b.shared:
                y0, h = y - 0.4 + 0.4 * b.lane, 0.38
            else:
                y0, h = y - 0.4, 0.8
            ax.broken_barh(
                [(b.start - lay.t0, b.end - b.start)],
                (y0, h),
                facecolors=colour[b.job_id],
                edgecolor="black",
                linewidth=0.3,
                hatch="//" if b.shared else None,
            )
        used: dict[SliceEnd, str] = {}
        for m in lay.markers:
            marker = MARKERS[m.reason][0]
            used[m.reason] = marker
            ax.plot(
                m.at - lay.t0,
                row_of[m.gpu],
                marker=marker,
                color=MARKER_COLOUR,
                markersize=16 if marker == "|" else 8,
                markeredgewidth=2.5 if marker == "|" else 1.0,
                linestyle="none",
            )
        ax.set_yticks(range(len(lay.rows)), [str(g) for g in lay.rows])
        ax.invert_yaxis()
        ax.set_xlim(0, max(1.0, lay.t1 - lay.t0))
        ax.set_xlabel("seconds since first slice")
        ax.set_ylabel("node:gpu")
        ax.set_title(title)
        ax.grid(axis="x", linestyle=":", linewidth=0.5)
        handles: list[Patch | Line2D] = [Patch(facecolor=colour[j], label=f"job {j}") for j in lay.jobs[:40]]
        handles += [Line2D([], [], marker=used[r], color="black", linestyle="none", label=MARKERS[r][1]) for r in used]
        if handles:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=100)
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class JobTimes:
    job_id: str
    user: str
    state: JobState
    submit: float
    first_start: float | None
    finish: float | None  # end of the last slice, for finished jobs
    slices: int
    gpu_seconds: float

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit

    @property
    def queueing(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit


@dataclass(frozen=True)
class JctSummary:
    jobs: tuple[JobTimes, ...]

    @property
    def finished(self) -> tuple[JobTimes, ...]:
        return tuple(j for j in self.jobs if j.jct is not None)

    def _jcts(self) -> list[float]:
        return [j.jct for j in self.finished if j.jct is not None]

    @property
    def mean_jct(self) -> float | None:
        v = self._jcts()
        return statistics.fmean(v) if v else None

    @property
    def median_jct(self) -> float | None:
        v = self._jcts()
        return statistics.median(v) if v else None

    @property
    def max_jct(self) -> float | None:
        v = self._jcts()
        return max(v) if v else None

    @property
    def makespan(self) -> float | None:
        fin = [j.finish for j in self.finished if j.finish is not None]
        return max(fin) - min(j.submit for j in self.jobs) if fin else None


def jct_summary(jobs: Sequence[JobRecord], slices: Iterable[SliceRecord], now: float) -> JctSummary:
    """Per-job completion times: JCT = end of the last slice - submit, for finished jobs."""
    by_job: dict[str, list[SliceRecord]] = {}
    for s in slices:
        by_job.setdefault(s.job_id, []).append(s)
    out = []
    for rec in jobs:
        mine = by_job.get(rec.job_id, [])
        ends = [s.end for s in mine if s.end is not None]
        finish = max(ends) if rec.state.finished and ends else None
        out.append(
            JobTimes(
                job_id=rec.job_id,
                user=rec.user,
                state=rec.state,
                submit=rec.spec.submit_time,
                first_start=min((s.start for s in mine), default=None),
                finish=finish,
                slices=len(mine),
                gpu_seconds=sum(s.elapsed(now) * s.placement.count for s in mine),
            )
        )
    return JctSummary(tuple(out))


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_jct(summary: JctSummary) -> str:
    """A small table: one line per job, then mean / median / max JCT and the makespan (seconds)."""
    head = ("JobID", "User", "State", "Slices", "Queued(s)", "JCT(s)", "GPU-s")
    body = [
        (j.job_id, j.user, j.state.value, str(j.slices), _sec(j.queueing), _sec(j.jct), f"{j.gpu_seconds:.1f}")
        for j in summary.jobs
    ]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    lines = [" ".join(c.rjust(w) for c, w in zip(head, widths, strict=True))]
    lines.append(" ".join("-" * w for w in widths))
    lines += [" ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    lines.append(
        f"finished {len(summary.finished)}/{len(summary.jobs)}  mean JCT {_sec(summary.mean_jct)} s  "
        f"median {_sec(summary.median_jct)} s  max {_sec(summary.max_jct)} s  makespan {_sec(summary.makespan)} s"
    )
    return "\n".join(lines) + "\n"
