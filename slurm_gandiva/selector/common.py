"""Small helpers every policy uses: the active jobs, capacity, memoised speeds, greedy filling."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from slurm_gandiva.model import ClusterView, Job, JobState, RateTable, Topology
from slurm_gandiva.plan import Plan

T = TypeVar("T")
K = TypeVar("K")


def active_jobs(view: ClusterView) -> list[Job]:
    """Jobs that are not finished, in view order, less the waiting jobs whose minimum cannot fit on
    `max_nodes` of the up nodes (they wait, holding no share of the GPUs, until nodes come back)."""
    out: list[Job] = []
    most: list[int] | None = None
    for j in view.jobs:
        if j.state.finished:
            continue
        if j.spec.max_nodes is not None and j.state.waiting:
            most = most if most is not None else node_prefix(view.topology)
            if j.spec.min_gpus > most[min(j.spec.max_nodes, len(most) - 1)]:
                continue
        out.append(j)
    return out


def node_prefix(topology: Topology) -> list[int]:
    """[0, GPUs of the largest up node, of the two largest, ...]: the most GPUs n nodes hold."""
    sizes = sorted((len(n.gpus) for n in topology.nodes if n.up), reverse=True)
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def gpu_limit(job: Job, topology: Topology, memo: Memo | None = None) -> int:
    """The most GPUs `job` can hold: its maximum, capped by what `max_nodes` up nodes hold."""
    if job.spec.max_nodes is None:
        return job.spec.max_gpus
    most = memo.per_topology(topology, node_prefix) if memo is not None else node_prefix(topology)
    return min(job.spec.max_gpus, most[min(job.spec.max_nodes, len(most) - 1)])


def capacity(view: ClusterView) -> int:
    """Whole GPUs on up nodes."""
    return sum(len(n.gpus) for n in view.topology.nodes if n.up)


def slice_age(job: Job, now: float) -> float:
    """Seconds the job's current slice has run (0 for a job that is not running)."""
    if job.state is not JobState.RUNNING or job.slice_start is None:
        return 0.0
    return max(0.0, now - job.slice_start)


def next_rotation(now: float, grid: float) -> float:
    """The first multiple of `grid` (a policy's `rotation_grid`) after `now`."""
    return (math.floor(now / grid + 1e-9) + 1) * grid


def wait_since(job: Job) -> float:
    """When the job last began waiting: its last stop, else its submission."""
    return job.last_run_end if job.last_run_end is not None else job.spec.submit_time


def clamp(job: Job, k: int) -> int:
    """k clamped into the job's GPU range."""
    return max(job.spec.min_gpus, min(job.spec.max_gpus, k))


class Memo:
    """Answers of pure functions of frozen inputs, kept across rounds by a policy (a cache, not state).

    Keyed by object identity; each entry holds its object, so an id cannot be reused while cached. The
    cache is emptied when it grows past `limit` entries (live rate tables change at every measurement).
    """

    def __init__(self, limit: int = 65536) -> None:
        self.limit = limit
        self._rates: dict[tuple[int, int], tuple[RateTable, float]] = {}
        self._topo: dict[int, tuple[Topology, object]] = {}
        self._objs: dict[tuple[int, int], tuple[object, Any]] = {}

    def throughput(self, rates: RateTable, k: int) -> float:
        key = (id(rates), k)
        hit = self._rates.get(key)
        if hit is not None and hit[0] is rates:
            return hit[1]
        if len(self._rates) >= self.limit:
            self._rates.clear()
        val = rates.throughput(k)
        self._rates[key] = (rates, val)
        return val

    def per_topology(self, topology: Topology, build: Callable[[Topology], T]) -> T:
        """`build(topology)`, computed once per topology object (and per `build`)."""
        key = id(topology) ^ id(build)
        hit = self._topo.get(key)
        if hit is not None and hit[0] is topology:
            return hit[1]  # type: ignore[return-value]
        if len(self._topo) >= 64:
            self._topo.clear()
        val = build(topology)
        self._topo[key] = (topology, val)
        return val

    def of(self, obj: K, build: Callable[[K], T]) -> T:
        """`build(obj)` for a frozen `obj` (a placement), computed once per object and `build` while cached."""
        key = (id(obj), id(build))
        hit = self._objs.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]  # type: ignore[no-any-return]
        if len(self._objs) >= self.limit:
            self._objs.clear()
        val = build(obj)
        self._objs[key] = (obj, val)
        return val


class Speeds:
    """Throughput and remaining-time look-ups for one decision round (over a policy's `Memo`)."""

    def __init__(self, memo: Memo | None = None) -> None:
        self._memo = memo if memo is not None else Memo()
        self._remaining: dict[tuple[int, int], float] = {}  # (id(job), k): jobs live through the round

    def throughput(self, job: Job, k: int) -> float:
        return self._memo.throughput(job.rates, k)

    def remaining(self, job: Job, k: int) -> float:
        """Seconds to finish on k GPUs (inf when the remaining work or the speed is unknown)."""
        key = (id(job), k)
        hit = self._remaining.get(key)
        if hit is None:
            hit = self._remaining[key] = self._remaining_uncached(job, k)
        return hit

    def _remaining_uncached(self, job: Job, k: int) -> float:
        rem = job.remaining_work
        if rem is None or k <= 0:
            return math.inf
        rate = self.throughput(job, k)
        return rem / rate if rate > 0 else math.inf

    def gain(self, job: Job, k: int) -> float:
        """T(k+1) / T(k): the relative speed-up of one more GPU."""
        base = self.throughput(job, k)
        return self.throughput(job, k + 1) / base if base > 0 else 1.0


class GroupRoom:
    """Places left in each capped group (`ClusterView.group_caps`) as a round hands out GPUs: a job whose
    group already has its cap of jobs placed may not run (a job array's %MAX). Jobs of groups without a
    cap, and jobs of no group, always fit. Falsy when no group is capped (then every check is free)."""

    __slots__ = ("caps", "used")

    def __init__(self, caps: Mapping[str, int], placed: Iterable[Job] = ()) -> None:
        self.caps = caps
        self.used: dict[str, int] = {}
        if caps:
            for j in placed:
                self.take(j)

    @staticmethod
    def of(view: ClusterView, jobs: Iterable[Job], counts: Mapping[str, int]) -> GroupRoom:
        """The room left once the jobs with a GPU count in `counts` run."""
        caps = view.group_caps
        return GroupRoom(caps, (j for j in jobs if counts.get(j.job_id, 0) > 0) if caps else ())

    def __bool__(self) -> bool:
        return bool(self.caps)

    def fits(self, job: Job) -> bool:
        """Whether one more job of `job`'s group may run."""
        g = job.spec.group
        if g is None or not self.caps:
            return True
        cap = self.caps.get(g)
        return cap is None or self.used.get(g, 0) < cap

    def take(self, job: Job) -> None:
        g = job.spec.group
        if g is not None and g in self.caps:
            self.used[g] = self.used.get(g, 0) + 1

    def give(self, job: Job) -> None:
        g = job.spec.group
        if g is not None and self.used.get(g, 0) > 0:
            self.used[g] -= 1

    def claim(self, job: Job) -> bool:
        """Take a place for `job` if its group has one left; whether it did."""
        if not self.fits(job):
            return False
        self.take(job)
        return True


def within_group_caps(plan: Plan, view: ClusterView, order: Sequence[Job]) -> Plan:
    """`plan` without the decisions that would run more jobs of a capped group than its cap: the jobs
    that would start running latest in `order` (the policy's priority) lose theirs. A policy's last guard;
    a round that counted with `GroupRoom` drops nothing here."""
    if not view.group_caps or not plan:
        return plan
    now_running = {j.job_id for j in view.running}
    stops = {d.job_id for d in plan.decisions if d.placement is None}
    newcomers = {d.job_id for d in plan.decisions if d.placement is not None and d.job_id not in now_running}
    after = (now_running - stops) | newcomers
    rank = {j.job_id: i for i, j in enumerate(order)}
    running = [view.job(jid) for jid in after]
    # Running jobs that stay keep their places first, then newcomers in priority order.
    running.sort(key=lambda j: (j.job_id in newcomers, rank.get(j.job_id, len(rank)), j.job_id))
    room = GroupRoom(view.group_caps)
    dropped = {j.job_id for j in running if not room.claim(j) and j.job_id in newcomers}
    if not dropped:
        return plan
    return Plan(tuple(d for d in plan.decisions if d.job_id not in dropped))


def fill(
    order: Iterable[Job],
    free: int,
    need: Callable[[Job], int],
    counts: dict[str, int] | None = None,
    room: GroupRoom | None = None,
) -> tuple[dict[str, int], int]:
    """Give each job in `order` its `need` GPUs while they fit (smaller later jobs may still fit), and
    (with `room`) while its group has a place left."""
    counts = {} if counts is None else counts
    for job in order:
        if job.job_id in counts:
            continue
        k = need(job)
        if 0 < k <= free and (not room or room.claim(job)):
            counts[job.job_id] = k
            free -= k
    return counts, free


def pinned_counts(
    jobs: Sequence[Job], now: float, min_slice: float, cap: int, room: GroupRoom | None = None
) -> tuple[dict[str, int], int]:
    """Running jobs whose slice is younger than `min_slice` keep their GPU count (oldest slices first),
    while their group (`room`) has a place left."""
    counts: dict[str, int] = {}
    if min_slice <= 0:
        return counts, cap
    young = [j for j in jobs if j.state is JobState.RUNNING and slice_age(j, now) < min_slice]
    young.sort(key=lambda j: (j.slice_start or 0.0, j.job_id))
    for j in young:
        k = clamp(j, j.gpus)
        if k <= cap and (not room or room.claim(j)):
            counts[j.job_id] = k
            cap -= k
    return counts, cap


def key_submit(job: Job) -> tuple[float, str]:
    return (job.spec.submit_time, job.job_id)


def merged(*maps: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        out.update(m)
    return out
