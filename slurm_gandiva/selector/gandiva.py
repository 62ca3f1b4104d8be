"""Gandiva: time-slicing plus introspective mode (packing, migration, grow-shrink), and the composed default.

One round:
1. judge concluded trials (a trial runs `trial_window` seconds, then its measured rate is compared with
   the rate before it) and revert the failed ones;
2. choose GPU counts: Gandiva time-slices by least attained service per GPU (longest waiting first on a
   tie), the default allocates like AFS-L after giving never-run jobs a first slice; a running job whose
   slice is younger than `min_slice` keeps its GPUs;
3. place with affinity (placement.realize), then use leftover GPUs for whoever still waits;
4. introspect: pack waiting 1-GPU jobs onto a GPU with a running 1-GPU job (shards), migrate badly
   placed jobs to better locality, grow elastic jobs onto idle GPUs (Gandiva only), each a trial.
Steps 3 and 4 are `gandiva_round.run_round`, given the round's inputs as a `Round`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import ClassVar

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobState, Placement, TrialKind
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.afs import GrowRefusals, RuleEpochs, settled_plan, tie_rank, view_rule
from slurm_gandiva.selector.common import (
    GroupRoom,
    Memo,
    Speeds,
    active_jobs,
    capacity,
    clamp,
    gpu_limit,
    slice_age,
    wait_since,
)
from slurm_gandiva.selector.gandiva_round import Introspection, Round, finishing, run_round, young


@dataclass(frozen=True, kw_only=True)
class _TrialParams:
    """The `Introspection` knobs Gandiva and the default take as parameters (keyword-only); which
    trials run at all (pack, migrate, grow) is each policy's own."""

    trial_window: float = 120.0
    pack_keep: float = 0.55
    min_gain: float = 0.05
    locality_gain: float = 0.10
    max_moves: int = 4

    def _introspection(self, pack: bool, migrate: bool, grow: bool) -> Introspection:
        return Introspection(
            pack, migrate, grow, self.trial_window, self.pack_keep, self.min_gain, self.locality_gain, self.max_moves
        )


def _verdicts(
    jobs: Sequence[Job], now: float, knobs: Introspection, speeds: Speeds
) -> tuple[dict[str, Placement | None], set[str]]:
    """Failed trials: the placement each reverted job goes back to (None: stop it) and the revert set."""
    back: dict[str, Placement | None] = {}
    sharers: dict[GpuRef, list[Job]] = {}
    for j in jobs:
        if j.state is JobState.RUNNING and j.placement is not None and j.placement.shared:
            for g in j.placement.gpus:
                sharers.setdefault(g, []).append(j)
    for j in jobs:
        t = j.trial
        if t is None or j.state is not JobState.RUNNING or j.placement is None:
            continue
        if now - t.started < knobs.trial_window or j.measured_rate is None:
            continue
        rate = j.measured_rate
        prev = t.previous
        if prev is not None and not j.spec.min_gpus <= prev.count <= j.spec.max_gpus:
            prev = None  # the job's range changed since: nothing sensible to go back to
        if t.kind is TrialKind.PACK:
            if not j.placement.shared:
                continue
            alone = t.baseline_rate if t.baseline_rate > 0 else speeds.throughput(j, j.gpus)
            if rate >= knobs.pack_keep * alone:
                continue
            for g in j.placement.gpus:
                for other in sharers.get(g, ()):
                    op = other.trial.previous if other.trial is not None else None
                    ok = op is not None and op.count == 1 and other.spec.min_gpus == 1
                    back[other.job_id] = Placement(op.gpus) if ok and op is not None else None
        elif t.kind is TrialKind.GROW:
            if prev is None or j.gpus <= prev.count:
                continue
            base = t.baseline_rate if t.baseline_rate > 0 else speeds.throughput(j, prev.count)
            if rate < base * (1.0 + knobs.min_gain * (j.gpus - prev.count)):
                back[j.job_id] = prev
        elif t.kind is TrialKind.MIGRATE:
            if prev is None or prev.count != j.gpus:
                continue
            base = t.baseline_rate if t.baseline_rate > 0 else 0.0
            if rate < 0.99 * base:
                back[j.job_id] = prev
    return back, set(back)


# Jobs that stopped (or were submitted) within this many seconds of each other have waited equally long:
# one controller round's suspends complete within about a second of each other.
SAME_ROUND_S = 2.0


def tiers(values: Mapping[str, float], width: float) -> dict[str, int]:
    """Each key's tier: tiers start at the smallest value not yet placed and take every value less than
    `width` above it (`width` 0: equal values only). Equal tiers mean "treat as equal"."""
    out: dict[str, int] = {}
    tier, start = -1, -math.inf
    exact = width <= 0
    for key, v in sorted(values.items(), key=itemgetter(1)):
        new = v > start if exact else v >= start + width - 1e-9 * max(1.0, abs(v))
        if tier < 0 or new:
            tier, start = tier + 1, v
        out[key] = tier
    return out


def _las_counts(
    jobs: Sequence[Job],
    now: float,
    cap: int,
    min_slice: float,
    seed: int,
    hysteresis: float,
    step: float = 0.0,
    grid: float | None = None,
    grace: float = 0.0,
    window: float | None = None,
    caps: Mapping[str, int] | None = None,
    ratio: float = 0.0,
    feedback: float = 0.0,
    margin: float = 1.0,
) -> tuple[list[Job], dict[str, int]]:
    """Gandiva time-slicing: pinned young slices, then least attained service per GPU first.

    Slices younger than `min_slice` (see `young`) and jobs about to finish (`finishing`) keep their
    GPUs. Service per GPU is compared in tiers `step` wide (0: exactly), or with `ratio` > 1 in geometric
    tiers (each from its least service to `ratio` times that; 1 s the least counted): a job then takes
    GPUs only from one with `ratio` times its service. A running job counts `hysteresis`
    seconds less service, so a waiting job takes its GPUs only when
    it is that far behind: slices last about two quanta instead of swapping everyone every round.
    A group capped in `caps` (a job array's %MAX) gets GPUs for at most that many of its jobs, in the
    same order, whatever GPUs are left: its jobs are time-sliced among its places.
    With `feedback` > 0 and geometric tiers, a job with that many seconds of service per GPU is past its
    early feedback: it comes after every job still short of it, in `response_order`, a running job's
    response ratio counted `margin` times higher (a waiting job takes its GPUs only with a clearly higher one).
    """
    room = GroupRoom(caps or {})
    running = JobState.RUNNING
    holders: dict[GpuRef, int] = {}
    for j in jobs:
        p = j.placement
        if p is not None and p.shared and j.state is running:
            for g in p.gpus:
                holders[g] = holders.get(g, 0) + 1

    def cost(j: Job, k: int) -> float:
        if j.state is JobState.RUNNING and j.placement is not None and j.placement.shared and k == j.gpus:
            return sum(1.0 / holders[g] for g in j.placement.gpus)
        return float(k)

    # Service is compared in tiers `step` wide and waiting time in rounds: jobs whose service differs by
    # start-up jitter, or that stopped in the same round a second apart, tie and fall to the stable keys
    # below instead of sub-second noise choosing. Tiers start at the values themselves (not at fixed
    # multiples of `step`), so a group of similar values is not cut in two by an arbitrary edge.
    ids = [j.job_id for j in jobs]
    ran = [j.state is running for j in jobs]
    # service per GPU; a running job counts `hysteresis` less
    svc = [j.attained_service / j.spec.min_gpus - (hysteresis if r else 0.0) for j, r in zip(jobs, ran, strict=True)]
    if ratio > 1.0:
        served = tiers(dict(zip(ids, [math.log(max(v, 1.0)) for v in svc], strict=True)), math.log(ratio))
    else:
        served = tiers(dict(zip(ids, svc, strict=True)), step)
    waited = tiers(dict(zip(ids, map(wait_since, jobs), strict=True)), SAME_ROUND_S)
    past: dict[str, float] = {}
    if feedback > 0 and ratio > 1.0:
        last = len(jobs)  # after every tier
        for j in jobs:
            if j.attained_service >= feedback * j.spec.min_gpus:
                served[j.job_id] = last
                past[j.job_id] = response_order(j, now) * (margin if j.state is JobState.RUNNING else 1.0)
    # On a tie a running job keeps its GPUs (no needless swap); the place in `jobs` last: a stable sort.
    keyed = sorted(
        (served[jid], past.get(jid, 0.0), not r, waited[jid], j.spec.submit_time, _tie_rank(seed, jid), i)
        for i, (j, jid, r) in enumerate(zip(jobs, ids, ran, strict=True))
    )
    order = [jobs[k[-1]] for k in keyed]
    free = float(cap)
    counts: dict[str, int] = {}
    for j in order:
        if j.state is running and (young(j, now, min_slice, grid, window) or finishing(j, grace)):
            k = clamp(j, j.gpus)
            c = cost(j, k)
            if c <= free + 1e-9 and (not room or room.claim(j)):
                counts[j.job_id] = k
                free -= c
    least = 1.0 / max(holders.values()) if holders else 1.0  # the least any job can cost
    for j in order:
        if free + 1e-9 < least:
            break  # nobody fits any more
        if j.job_id in counts:
            continue
        k = j.spec.min_gpus
        c = cost(j, k) if j.gpus == k else float(k)
        if c <= free + 1e-9 and (not room or room.claim(j)):
            counts[j.job_id] = k
            free -= c
    if len(counts) == len(jobs):  # nobody waits: grown jobs keep what they grew to (no group is full)
        for j in order:
            extra = clamp(j, j.gpus) - counts[j.job_id]
            if j.state is JobState.RUNNING and 0 < extra <= free:
                counts[j.job_id] += extra
                free -= extra
    return order, counts


@functools.lru_cache(maxsize=1 << 16)
def _tie_rank(seed: int, job_id: str) -> int:
    return tie_rank(seed, job_id)  # (a pure function of its arguments, asked for every job every round)


def response_order(job: Job, now: float) -> float:
    """Highest response ratio first (HRRN): minus (seconds since submission + expected remaining seconds) /
    expected remaining seconds. The expected remaining time is the job's remaining work at its measured
    rate on its own GPU count, or, when its length is unknown, its service so far per GPU (a job that
    has run long is likely to run long yet). Short jobs go first, and a long one's ratio grows while it
    waits until it goes first too: the mean of shortest-first without starving the tail."""
    rem = job.remaining_time(job.spec.min_gpus)
    if not math.isfinite(rem):
        rem = job.attained_service / job.spec.min_gpus
    rem = max(rem, 1.0)
    return -(now - job.spec.submit_time + rem) / rem


@dataclass(frozen=True)
class Gandiva(_TrialParams):
    """Gandiva: affinity placement, time-slicing every `quantum` seconds when jobs outnumber GPUs
    (least attained service per GPU first, compared in tiers `service_step` wide, default a quarter
    quantum, so that start-up jitter does not decide between jobs started together; no job is
    suspended before `min_slice` (see `slice_floor`), nor for a job less than `hysteresis` seconds of
    service behind it, default `min_slice` or one quantum), and introspective packing, migration and
    grow-shrink trials. With `aligned` (the default) slices end only at rotations, every `quantum`
    seconds of wall time (multiples of it), as in Gandiva's round-based time-slicing: the jobs of a
    round stop and start together, and start-up jitter cannot move a slice's end to another tick; a
    slice ends only within `rotation_window` seconds after a rotation (default a quarter quantum), so a
    job kept at one keeps its GPUs until the next. Past the paper: a job expected to finish within
    `finish_grace` seconds (default a quarter quantum) is not stopped; and service is compared in
    geometric tiers `service_ratio` wide (default 4; 0: linear tiers `service_step` wide, the paper's
    round robin): a waiting job takes a running job's GPUs only when it has had less than a quarter of
    its service. A rotation pays only when the job it lets in is clearly the likelier to finish soon;
    between jobs of similar service it delays both (processor sharing) and pays a switch each time: with
    linear tiers Gandiva rotated about 490 times per job on the Philly traces (issue 31). With geometric
    tiers, time-slicing is bounded to a job's early feedback: past `feedback_service` seconds of service
    per GPU (default 600) a job waits behind every job short of it and runs in `response_order`
    (highest response ratio first, from its measured progress), preempted at a rotation only by a job
    short of its feedback or one whose ratio is `response_margin` times its own (default 1.0; 1.25 keeps
    ratios creeping past each other from costing a switch each, about 15 instead of 26 suspends on 2869ce's
    first 40 jobs, but let one user's search keep more of the cluster from another's jobs: with fair
    shares, alice's JCT rose 16% instead of 13% in the two-user case of issue 30). GPUs that no
    job counted for them can use (a wide job fits no node) go to the others in this same order, a
    running job keeping its own: giving them to waiting jobs first swapped two sets of jobs at every
    rotation (about 28 suspends per job on ee9e8c, 3 after; issue 31). Least service alone kept sharing
    GPUs among long jobs of similar service (all finish late) and left a wide job, once stopped, behind
    every later one: on the low-load VC 2869ce its 8- and 32-GPU jobs took 1.2-1.5x their time under
    Slurm (issue 31)."""

    quantum: float | None = 60.0
    min_slice: float | None = None
    hysteresis: float | None = None
    service_step: float | None = None  # seconds of service per GPU that count as equal; default quantum / 4
    aligned: bool = True
    rotation_window: float | None = None  # aligned: slices end only this soon after a rotation; quantum / 4
    finish_grace: float | None = None  # a job finishing within this many seconds is not stopped; quantum / 4
    service_ratio: float = 4.0  # service tiers this many times wide; 0: `service_step` wide
    feedback_service: float = 600.0  # seconds of service per GPU time-sliced; past it, `response_order`
    response_margin: float = 1.0  # past feedback, a waiting job preempts only with this times the ratio
    pack: bool = True
    migrate: bool = True
    grow: bool = True
    seed: int = 0
    name: str = "gandiva"
    elastic: ClassVar[bool] = False  # runs jobs as asked; grows the ones that declare a range
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)

    @property
    def knobs(self) -> Introspection:
        return self._introspection(self.pack, self.migrate, self.grow)

    @property
    def slice_floor(self) -> float:
        """`min_slice`, by default one quantum, or half of one with aligned rotations (a slice then ends at
        the first rotation at least half a quantum after its training began: one quantum on average)."""
        if self.min_slice is not None:
            return self.min_slice
        q = self.quantum or 0.0
        return q / 2 if self.rotation_grid else q

    @property
    def rotation_grid(self) -> float | None:
        """Seconds between rotations (slices end only at multiples of it), None: at any decision."""
        return self.quantum if self.aligned and self.quantum else None

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        if not jobs:
            return Plan()
        speeds = Speeds(self.memo)
        knobs = self.knobs
        grid = self.rotation_grid
        back, reverts = _verdicts(jobs, now, knobs, speeds)
        hyst = self.hysteresis if self.hysteresis is not None else self.min_slice or self.quantum or 0.0
        step = self.service_step if self.service_step is not None else (self.quantum or 0.0) / 4
        grace = self.finish_grace if self.finish_grace is not None else (self.quantum or 0.0) / 4
        window = self.rotation_window if self.rotation_window is not None else (self.quantum or 0.0) / 4
        order, counts = _las_counts(
            jobs, now, capacity(view), self.slice_floor, self.seed, hyst, step, grid, grace, window, view.group_caps,
            self.service_ratio, self.feedback_service, self.response_margin,
        )
        this_round = Round(
            view,
            now,
            jobs,
            order,
            counts,
            knobs,
            speeds,
            back,
            reverts,
            self.slice_floor,
            "time-slice",
            self.memo,
            reserve=True,
            grid=grid,
            grace=grace,
            window=window,
            # A job Slurm would hold waits here instead: the leftover loop gives its GPUs to others.
            strict_ties=True,
            leftovers_in_order=True,
        )
        return run_round(this_round)


@dataclass(frozen=True)
class Default(_TrialParams):
    """The composed default: AFS-L allocation, affinity placement, time-slicing when oversubscribed
    (a never-run job gets a first slice of `probe` seconds at once, for early feedback; no job is
    suspended before `min_slice`), and introspective migration trials. While every job runs, the rule
    decides only when a job arrives or leaves (`RuleEpochs`), not on every tick.

    Packing trials are off by default (`pack=True` turns them on): under AFS allocation a packed pair
    still counts two GPUs, so on the Philly traces packing churned (about 50 suspends per job on
    0e4a51) without shortening jobs; elastic growth (AFS) already uses the idle GPUs."""

    quantum: float | None = 60.0
    min_slice: float = 60.0
    probe: float = 120.0
    pack: bool = False
    migrate: bool = True
    seed: int = 0
    name: str = "default"
    elastic: ClassVar[bool] = True
    memo: Memo = field(default_factory=Memo, init=False, repr=False, compare=False)
    refusals: GrowRefusals = field(default_factory=GrowRefusals, init=False, repr=False, compare=False)
    epochs: RuleEpochs = field(default_factory=RuleEpochs, init=False, repr=False, compare=False)

    def decide(self, view: ClusterView, now: float) -> Plan:
        jobs = active_jobs(view)
        if not jobs:
            return Plan()
        speeds = Speeds(self.memo)
        knobs = self._introspection(self.pack, self.migrate, grow=False)
        back, reverts = _verdicts(jobs, now, knobs, speeds)
        floors: dict[str, int] = {}
        young = sorted(
            (j for j in jobs if j.state is JobState.RUNNING and slice_age(j, now) < self._hold(j)),
            key=lambda j: (j.slice_start or 0.0, j.job_id),
        )
        for j in young:
            floors[j.job_id] = clamp(j, j.gpus)
        if self.epochs.frozen(view, jobs, ((j.slice_start or 0.0) + self._hold(j) for j in young)):
            for j in jobs:  # every job runs: each keeps its count until a job arrives or leaves
                floors.setdefault(j.job_id, clamp(j, j.gpus))
        fresh = sorted(
            (j for j in jobs if j.state is JobState.QUEUED and j.times_scheduled == 0),
            key=lambda j: (j.spec.submit_time, j.job_id),
        )
        for j in fresh:
            floors[j.job_id] = j.spec.min_gpus
        # A job in its first slice is not resized until `probe` is over: a resize costs it a
        # suspend and a resume just when its user waits for the first mini-batches.
        probing = frozenset(j.job_id for j in young if j.times_scheduled <= 1) | {j.job_id for j in fresh}
        order = sorted(
            jobs,
            key=lambda j: (
                j.job_id not in floors,
                speeds.remaining(j, j.spec.min_gpus),
                j.attained_service,
                tie_rank(self.seed, j.job_id),
            ),
        )

        def place(counts: dict[str, int]) -> Plan:
            return run_round(
                Round(view, now, jobs, order, counts, knobs, speeds, back, reverts, self.min_slice, "afs", self.memo)
            )

        count = view_rule(view, jobs, speeds, pessimistic=False, seed=self.seed, floors=floors, frozen=probing)
        return settled_plan(view, count, place, lambda j: gpu_limit(j, view.topology, self.memo), self.refusals)

    def _hold(self, j: Job) -> float:
        return max(self.min_slice, self.probe) if j.times_scheduled <= 1 else self.min_slice
