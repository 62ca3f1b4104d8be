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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import ClassVar

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobState, Locality, Node, Placement, Topology, TrialKind
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.afs import afs_counts, tie_rank
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
    within_group_caps,
)
from slurm_gandiva.selector.placement import GpuPool, Targets, held_indices, realize


@dataclass(frozen=True)
class Introspection:
    """Knobs of introspective mode.

    `trial_window`: seconds a trial runs before it is judged. A packed job must keep `pack_keep` of its
    rate alone (two jobs at more than half speed beat time-slicing). A grow must speed the job up by
    `min_gain` per added GPU (and is tried only while one more GPU is expected to give that); a
    migration must not slow it down. A job is migrated when the expected rate gain from better
    locality is at least `locality_gain`; at most `max_moves` migrations start per round.
    """

    pack: bool = True
    migrate: bool = True
    grow: bool = True
    trial_window: float = 120.0
    pack_keep: float = 0.55
    min_gain: float = 0.05
    locality_gain: float = 0.10
    max_moves: int = 4


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


def young(job: Job, now: float, min_slice: float, grid: float | None = None, window: float | None = None) -> bool:
    """Whether a running job's slice may not end now: less than `min_slice` old, or, with a rotation
    `grid`, before the first multiple of `grid` (seconds of wall time) at least `min_slice` after the
    slice began, or (with a `window`) more than `window` seconds after the last rotation. On a grid,
    slices end at fixed times whatever a job's start-up took, so a second of start-up jitter cannot move
    a rotation to another tick; with a window, a job kept at a rotation keeps its GPUs until the next
    one (a slice does not end mid-round when another job's finish or service crosses it by a second)."""
    if job.state is not JobState.RUNNING or job.slice_start is None:
        return False
    if not grid:
        return slice_age(job, now) < min_slice
    due = math.ceil((job.slice_start + min_slice) / grid - 1e-9) * grid
    if now < due - 1e-6:
        return True
    return window is not None and now - math.floor(now / grid + 1e-9) * grid >= window


def finishing(job: Job, grace: float) -> bool:
    """A running job expected to finish within `grace` seconds at its rate: stopping it now would cost
    a checkpoint, a resume and a whole wait to save the others a few seconds."""
    return grace > 0 and job.state is JobState.RUNNING and job.remaining_time(job.gpus) <= grace


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
) -> tuple[list[Job], dict[str, int]]:
    """Gandiva time-slicing: pinned young slices, then least attained service per GPU first.

    Slices younger than `min_slice` (see `young`) and jobs about to finish (`finishing`) keep their
    GPUs. Service per GPU is compared in tiers `step` wide (0: exactly). A running job counts `hysteresis`
    seconds less service, so a waiting job takes its GPUs only when
    it is that far behind: slices last about two quanta instead of swapping everyone every round.
    A group capped in `caps` (a job array's %MAX) gets GPUs for at most that many of its jobs, in the
    same order, whatever GPUs are left: its jobs are time-sliced among its places.
    """
    room = GroupRoom(caps or {})
    holders: dict[GpuRef, int] = {}
    for j in jobs:
        if j.state is JobState.RUNNING and j.placement is not None and j.placement.shared:
            for g in j.placement.gpus:
                holders[g] = holders.get(g, 0) + 1

    def cost(j: Job, k: int) -> float:
        if j.state is JobState.RUNNING and j.placement is not None and j.placement.shared and k == j.gpus:
            return sum(1.0 / holders[g] for g in j.placement.gpus)
        return float(k)

    def service(j: Job) -> float:
        return j.attained_service / j.spec.min_gpus - (hysteresis if j.state is JobState.RUNNING else 0.0)

    # Service is compared in tiers `step` wide and waiting time in rounds: jobs whose service differs by
    # start-up jitter, or that stopped in the same round a second apart, tie and fall to the stable keys
    # below instead of sub-second noise choosing. Tiers start at the values themselves (not at fixed
    # multiples of `step`), so a group of similar values is not cut in two by an arbitrary edge.
    served = tiers({j.job_id: service(j) for j in jobs}, step)
    waited = tiers({j.job_id: wait_since(j) for j in jobs}, SAME_ROUND_S)
    order = sorted(
        jobs,
        key=lambda j: (
            served[j.job_id],
            j.state is not JobState.RUNNING,  # on a tie a running job keeps its GPUs: no needless swap
            waited[j.job_id],
            j.spec.submit_time,
            tie_rank(seed, j.job_id),
        ),
    )
    free = float(cap)
    counts: dict[str, int] = {}
    for j in order:
        if j.state is JobState.RUNNING and (young(j, now, min_slice, grid, window) or finishing(j, grace)):
            k = clamp(j, j.gpus)
            c = cost(j, k)
            if c <= free + 1e-9 and (not room or room.claim(j)):
                counts[j.job_id] = k
                free -= c
    for j in order:
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


def _run_round(
    view: ClusterView,
    now: float,
    jobs: Sequence[Job],
    order: Sequence[Job],
    counts: dict[str, int],
    knobs: Introspection,
    speeds: Speeds,
    back: dict[str, Placement | None],
    reverts: set[str],
    min_slice: float,
    reason: str,
    memo: Memo,
    reserve: bool = False,
    grid: float | None = None,
    grace: float = 0.0,
    window: float | None = None,
    strict_ties: bool = False,
) -> Plan:
    for job_id, p in back.items():
        if p is None:
            counts[job_id] = 0
    fixed = {jid: p for jid, p in back.items() if p is not None and counts.get(jid, 0) > 0}
    for jid, p in fixed.items():
        counts[jid] = p.count
    targets, pool = realize(
        view, order, counts, reason=reason, fixed=fixed, reverts=reverts, memo=memo, strict_ties=strict_ties
    )
    counted = GroupRoom.of(view, order, counts)

    def may_run(j: Job) -> bool:  # counted for GPUs already, or its group has a place left
        return counts.get(j.job_id, 0) > 0 or counted.fits(j)

    res = (
        _reservation(view, order, targets, now, min_slice, grid, grace, window, strict_ties, may_run)
        if reserve
        else None
    )
    if res is not None:
        # The first waiting multi-GPU job could not be placed: keep GPUs of one node for it, stopping
        # lower-priority jobs there once nothing younger than a min slice is left in its way.
        _hand_on(order, counts, res, back, counted)
        pool = GpuPool(view.topology, memo, strict_ties=strict_ties, ties=view.requeue_ties,
                       even_spans=view.same_gpus_per_node)
        hold = Placement(res.held)
        pool.book(hold)
        targets, pool = realize(
            view, order, counts, pool=pool, reason=reason, fixed=fixed, reverts=reverts, memo=memo
        )
        if res.startable:
            pool.release(hold)
            head = res.head
            p = pool.find(head, head.spec.min_gpus)
            if p is not None and pool.book(p):
                targets.set(head.job_id, p, f"{reason}: its turn, on GPUs kept free for it")
    final = {j.job_id: targets.placements.get(j.job_id, j.placement) for j in jobs}
    waiting: list[Job] = []  # the waiting jobs left without GPUs, then the running ones, each in order
    stopped: list[Job] = []
    for j in order:
        if final[j.job_id] is None:
            (stopped if j.state is JobState.RUNNING else waiting).append(j)
    waiting += stopped
    # A capped group's jobs run only while it has places left (`ClusterView.group_caps`).
    room = GroupRoom(view.group_caps, (j for j in jobs if final[j.job_id] is not None))
    # Leftover GPUs (shared GPUs make the count arithmetic conservative) go to whoever still waits.
    started: set[str] = set()
    for j in waiting:
        if not pool.free_count:
            break
        if j.job_id in back or pool.free_count < j.spec.min_gpus or not room.fits(j):
            continue
        p = j.placement if j.state is JobState.RUNNING else None
        if p is None or p.count != j.spec.min_gpus or not pool.can_book(p):  # stay put when it can
            p = pool.find(j, j.spec.min_gpus, held_indices(p) if p is not None else None)
        if p is not None and pool.book(p):
            room.take(j)
            if p == j.placement:
                pool.settle(p)
            targets.set(j.job_id, p, reason)
            final[j.job_id] = p
            started.add(j.job_id)
    waiting = [j for j in waiting if j.job_id not in started]
    _unpack_lonely(jobs, final, targets, pool)
    if knobs.pack and view.packing and waiting:
        _pack(order, waiting, final, targets, pool, back, room)
    if knobs.migrate:
        _migrate(view, jobs, final, targets, pool, knobs, now, min_slice, grace)
    if knobs.grow and not waiting and pool.free_count:
        _grow(jobs, final, targets, pool, knobs, speeds, now, min_slice, grace)
    return within_group_caps(targets.plan(view), view, order)


@dataclass(frozen=True)
class _Reservation:
    head: Job  # the waiting job the GPUs are kept for
    held: tuple[GpuRef, ...]  # GPUs nobody else may take this round
    yields: tuple[str, ...]  # lower-priority running jobs stopped for it
    startable: bool  # `held` is enough for it now


def _reservation(
    view: ClusterView,
    order: Sequence[Job],
    targets: Targets,
    now: float,
    min_slice: float,
    grid: float | None,
    grace: float = 0.0,
    window: float | None = None,
    strict_ties: bool = False,
    may_run: Callable[[Job], bool] | None = None,
) -> _Reservation | None:
    """GPUs to keep for the highest-priority waiting job that got none, when it needs several.

    Without this, a waiting 4-GPU job is never placed while 1-GPU jobs keep starting on each GPU that
    frees up (their young slices are pinned): it waits until the cluster drains. The node chosen is one
    where the jobs ahead of it in priority leave room for it: preferably one where it can start now
    (stopping the lowest-priority jobs there), else the one with fewest GPUs pinned by young slices,
    whose free GPUs then stay idle (at most one min slice) instead of starting new slices. GPUs this
    round gives to jobs ahead of it stay theirs. With `strict_ties`, not on a node where a running job
    that stays holds a GPU with one of the head's Slurm indices (`Job.requeue_indices`): Slurm would
    hold it. A job that `may_run` says may not run this round (its group is at its cap) is not the head.
    """
    head = next(
        (
            j
            for j in order
            if j.state is not JobState.RUNNING
            and targets.placements.get(j.job_id) is None
            and (may_run is None or may_run(j))
        ),
        None,
    )
    if head is None or head.spec.min_gpus < 2:
        return None
    k = head.spec.min_gpus
    tied = head.requeue_indices if view.requeue_ties else frozenset()
    rank = {j.job_id: i for i, j in enumerate(order)}
    mine = rank[head.job_id]
    holders: dict[str, list[tuple[Job, Placement]]] = {}  # node -> (job, the GPUs it holds or gets)
    for j in order:
        p = j.placement if j.state is JobState.RUNNING else None
        if rank[j.job_id] < mine and j.job_id in targets.placements:
            p = targets.placements[j.job_id]  # where this round puts a job ahead of the head
        if p is not None:
            for name in p.nodes:
                holders.setdefault(name, []).append((j, p))
    def option(node: Node, need: int) -> tuple[tuple[int, int, int, str], list[GpuRef], list[str], bool] | None:
        """(score, GPUs kept, jobs that yield, startable) for keeping `need` GPUs of `node`; None: no room."""
        on_node = holders.get(node.name, [])
        permanent = pinned = 0
        movable: list[tuple[Job, Placement]] = []
        for j, p in on_node:
            n = len(p.on_node(node.name))
            if rank[j.job_id] < mine:
                permanent += n
            elif young(j, now, min_slice, grid, window) or finishing(j, grace):
                pinned += n
            else:
                movable.append((j, p))
        if len(node.gpus) - permanent < need:
            return None
        startable = len(node.gpus) - permanent - pinned >= need
        yields: list[str] = []
        free = _free_on(node, on_node, yields)
        if startable:
            movable.sort(key=lambda m: -rank[m[0].job_id])  # the lowest priority stops first
            for j, _ in movable:
                if len(free) >= need:
                    break
                yields.append(j.job_id)
                free = _free_on(node, on_node, yields)
            if len(free) < need:  # shared GPUs: a sharer still holds one
                return None
        if strict_ties and tied:
            staying = {g for j, p in on_node if j.job_id not in yields and p == j.placement for g in p.gpus}
            if any(g.index in tied for g in staying if g.node == node.name):
                return None
        return (0 if startable else 1, pinned, len(yields), node.name), list(free), yields, startable

    up = [node for node in view.topology.nodes if node.up and node.gpus]
    if up and k > max(len(node.gpus) for node in up):
        return _wide_reservation(head, k, [(node, option(node, len(node.gpus))) for node in up])
    best: tuple[tuple[int, int, int, str], _Reservation] | None = None
    for node in up:
        if len(node.gpus) < k:
            continue
        got = option(node, k)
        if got is None:
            continue
        score, free, yields, startable = got
        if best is None or score < best[0]:
            best = (score, _Reservation(head, tuple(free), tuple(yields), startable))
    return best[1] if best is not None and best[1].held else None


def _wide_reservation(
    head: Job,
    k: int,
    options: Sequence[tuple[Node, tuple[tuple[int, int, int, str], list[GpuRef], list[str], bool] | None]],
) -> _Reservation | None:
    """Whole nodes kept for a waiting job wider than any node: the fewest nodes over which its GPUs split
    evenly (a job across nodes gets the same GPUs on each), the best-scored ones (startable, fewest pinned
    GPUs, fewest jobs to stop). Whole nodes, so that the same GPUs are free on each when it starts."""
    ranked = sorted((opt for node, opt in options if opt is not None), key=lambda o: o[0])
    size = max((len(node.gpus) for node, _ in options), default=0)
    for m in range(-(-k // size) if size else 1, len(ranked) + 1):
        if k % m or k // m > size:
            continue
        chosen = ranked[:m]
        held = tuple(g for _, free, _, _ in chosen for g in free)
        yields = tuple(j for _, _, ys, _ in chosen for j in ys)
        return _Reservation(head, held, yields, all(st for _, _, _, st in chosen)) if held else None
    return None


def _hand_on(
    order: Sequence[Job],
    counts: dict[str, int],
    res: _Reservation,
    back: Mapping[str, object],
    room: GroupRoom | None = None,
) -> None:
    """Stop the jobs that yield to the reservation and hand the GPUs they were counted for to the next
    jobs in priority order that got none. Without this the leftover loop (waiting jobs before running
    ones) gave them to jobs of a lower service tier while a running job of a higher one was stopped;
    and whether a job seconds from its end was pinned decided which (sim and live diverged on it)."""
    freed = 0
    by_id = {j.job_id: j for j in order} if room else {}
    for jid in res.yields:
        if room and counts.get(jid, 0) > 0 and jid in by_id:
            room.give(by_id[jid])
        freed += counts.get(jid, 0)
        counts[jid] = 0
    if room and counts.get(res.head.job_id, 0) <= 0:
        room.take(res.head)
    for j in order:
        if freed <= 0:
            break
        jid = j.job_id
        if jid == res.head.job_id or jid in res.yields or jid in back or counts.get(jid, 0):
            continue
        if j.spec.min_gpus <= freed and (not room or room.claim(j)):
            counts[jid] = j.spec.min_gpus
            freed -= j.spec.min_gpus


def _free_on(node: Node, holders: Sequence[tuple[Job, Placement]], stopping: Sequence[str]) -> list[GpuRef]:
    """`node`'s GPUs that no job in `holders` holds once the jobs in `stopping` have stopped."""
    busy = {g for j, p in holders if j.job_id not in stopping for g in p.gpus}
    return [g.ref for g in node.gpus if g.ref not in busy]


def _unchanged(j: Job, targets: Targets) -> bool:
    return j.state is JobState.RUNNING and j.placement is not None and j.job_id not in targets.placements


def _unpack_lonely(jobs: Sequence[Job], final: dict[str, Placement | None], targets: Targets, pool: GpuPool) -> None:
    """A job left alone on a shared GPU takes the whole GPU back."""
    holders: dict[GpuRef, list[str]] = {}
    for jid, p in final.items():
        if p is not None and p.shared:
            for g in p.gpus:
                holders.setdefault(g, []).append(jid)
    for j in jobs:
        p = final[j.job_id]
        if p is None or not p.shared or any(len(holders[g]) > 1 for g in p.gpus):
            continue
        whole = Placement(p.gpus)
        pool.release(p)
        if pool.book(whole):
            targets.set(j.job_id, whole, "unpack: alone on its GPU")
            final[j.job_id] = whole
        else:
            pool.book(p)


def _pack(
    order: Sequence[Job],
    waiting: list[Job],
    final: dict[str, Placement | None],
    targets: Targets,
    pool: GpuPool,
    back: dict[str, Placement | None],
    room: GroupRoom | None = None,
) -> None:
    """Waiting 1-GPU jobs share a GPU with a running 1-GPU job (or take a free shard), as PACK trials
    (not one whose group, in `room`, is at its cap)."""
    slots = pool.shard_slots()
    hosts = [
        j
        for j in order
        if j.state is JobState.RUNNING  # (as _unchanged, first: most of 10,000 jobs wait)
        and _unchanged(j, targets)
        and pool.shard_cap(j.placement.gpus[0].node) >= 2  # type: ignore[union-attr]
        and j.gpus == 1
        and not j.placement.shared  # type: ignore[union-attr]
        and j.trial is None
        and TrialKind.PACK not in j.failed_trials
        and j.spec.min_gpus == 1
    ]
    hosts.reverse()  # the lowest-priority running job first: it would be the next to lose its GPU
    next_host = 0
    packed: set[str] = set()
    for j in waiting:
        if j.spec.min_gpus != 1 or TrialKind.PACK in j.failed_trials or j.job_id in back:
            continue
        if j.state is JobState.RUNNING or (room is not None and not room.fits(j)):
            continue
        if slots:
            g = slots.pop()
        elif next_host < len(hosts):
            host = hosts[next_host]
            next_host += 1
            assert host.placement is not None
            g = host.placement.gpus[0]
            pool.release(host.placement)
            shared = Placement((g,), shared=True)
            pool.book(shared)
            targets.set(host.job_id, shared, f"pack with {j.job_id}")
            targets.trials[host.job_id] = TrialKind.PACK
            final[host.job_id] = shared
        else:
            break
        mine = Placement((g,), shared=True)
        if pool.book(mine):
            if room is not None:
                room.take(j)
            targets.set(j.job_id, mine, "pack: shares a GPU instead of waiting")
            targets.trials[j.job_id] = TrialKind.PACK
            final[j.job_id] = mine
            packed.add(j.job_id)
    waiting[:] = [j for j in waiting if j.job_id not in packed]


def _migrate(
    view: ClusterView,
    jobs: Sequence[Job],
    final: dict[str, Placement | None],
    targets: Targets,
    pool: GpuPool,
    knobs: Introspection,
    now: float,
    min_slice: float,
    grace: float = 0.0,
) -> None:
    """Move settled multi-GPU jobs to clearly better locality, as MIGRATE trials (not a job expected to
    finish within `grace` seconds: the move's restart would cost more than it saves)."""
    topo = view.topology
    limits = pool.memo.per_topology(topo, _locality_limits)
    cands = []
    for j in jobs:
        if j.state is not JobState.RUNNING or not _unchanged(j, targets):
            continue  # (the state first: most of 10,000 jobs wait)
        if j.gpus < 2 or j.trial is not None or j.placement is None:
            continue
        if j.placement.shared or TrialKind.MIGRATE in j.failed_trials or slice_age(j, now) < min_slice:
            continue
        if finishing(j, grace):
            continue
        loc = topo.locality(j.placement.gpus)
        best = next((lvl for lvl, most in limits if j.gpus <= most), Locality.CROSS_NODE)
        if loc > best and pool.factor(j, j.gpus, best) >= (1.0 + knobs.locality_gain) * pool.factor(j, j.gpus, loc):
            cands.append((-int(loc), j.job_id, j, loc))
    cands.sort(key=lambda c: (c[0], c[1]))
    moves = 0
    for _, _, j, loc in cands:
        if moves >= knobs.max_moves or not pool.free_count:
            break
        cur = j.placement
        assert cur is not None
        pool.release(cur)
        p = pool.find(j, cur.count, held_indices(cur))  # moved, it is requeued: Slurm keeps its indices
        if p is not None and p != cur:
            new_loc = topo.locality(p.gpus)
            gain = pool.factor(j, cur.count, new_loc) / pool.factor(j, cur.count, loc)
            if gain >= 1.0 + knobs.locality_gain:
                pool.book(p)
                targets.set(j.job_id, p, f"migrate: {loc.name.lower()} -> {new_loc.name.lower()}")
                targets.trials[j.job_id] = TrialKind.MIGRATE
                final[j.job_id] = p
                moves += 1
                continue
        pool.book(cur)


def _locality_limits(topo: Topology) -> list[tuple[Locality, int]]:
    """The most GPUs one PCIe switch, one socket and one node hold (the best locality k GPUs can have)."""
    switch: dict[tuple[str, int], int] = {}
    socket: dict[tuple[str, int], int] = {}
    node = 0
    for n in topo.nodes:
        if not n.up:
            continue
        node = max(node, len(n.gpus))
        for g in n.gpus:
            switch[(n.name, g.switch)] = switch.get((n.name, g.switch), 0) + 1
            socket[(n.name, g.socket)] = socket.get((n.name, g.socket), 0) + 1
    return [
        (Locality.SWITCH, max(switch.values(), default=0)),
        (Locality.SOCKET, max(socket.values(), default=0)),
        (Locality.NODE, node),
    ]


def _grow(
    jobs: Sequence[Job],
    final: dict[str, Placement | None],
    targets: Targets,
    pool: GpuPool,
    knobs: Introspection,
    speeds: Speeds,
    now: float,
    min_slice: float,
    grace: float = 0.0,
) -> None:
    """Elastic jobs take idle GPUs while one more GPU still speeds them up, as GROW trials (not a job
    expected to finish within `grace` seconds)."""
    for j in jobs:
        if not pool.free_count:
            return
        if not _unchanged(j, targets) or j.trial is not None or TrialKind.GROW in j.failed_trials:
            continue
        cur = j.placement
        assert cur is not None
        top = gpu_limit(j, pool.topology, pool.memo)
        if cur.shared or j.gpus >= top or slice_age(j, now) < min_slice or finishing(j, grace):
            continue
        k = j.gpus
        while k < top and k - j.gpus < pool.free_count and speeds.gain(j, k) > 1 + knobs.min_gain:
            k += 1
        if k == j.gpus:
            continue
        pool.release(cur)
        p = pool.find(j, k, held_indices(cur))  # resized, it is requeued: Slurm keeps its indices
        if p is not None:
            pool.book(p)
            targets.set(j.job_id, p, f"grow onto idle GPUs: {j.gpus} -> {k}")
            targets.trials[j.job_id] = TrialKind.GROW
            final[j.job_id] = p
        else:
            pool.book(cur)


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
    `finish_grace` seconds (default a quarter quantum) is not stopped."""

    quantum: float | None = 60.0
    min_slice: float | None = None
    hysteresis: float | None = None
    service_step: float | None = None  # seconds of service per GPU that count as equal; default quantum / 4
    aligned: bool = True
    rotation_window: float | None = None  # aligned: slices end only this soon after a rotation; quantum / 4
    finish_grace: float | None = None  # a job finishing within this many seconds is not stopped; quantum / 4
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
            jobs, now, capacity(view), self.slice_floor, self.seed, hyst, step, grid, grace, window, view.group_caps
        )
        return _run_round(
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
        )


@dataclass(frozen=True)
class Default(_TrialParams):
    """The composed default: AFS-L allocation, affinity placement, time-slicing when oversubscribed
    (a never-run job gets a first slice of `probe` seconds at once, for early feedback; no job is
    suspended before `min_slice`), and introspective migration trials.

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
        fresh = sorted(
            (j for j in jobs if j.state is JobState.QUEUED and j.times_scheduled == 0),
            key=lambda j: (j.spec.submit_time, j.job_id),
        )
        for j in fresh:
            floors[j.job_id] = j.spec.min_gpus
        # A job in its first slice is not resized until `probe` is over: a resize costs it a
        # suspend and a resume just when its user waits for the first mini-batches.
        probing = frozenset(j.job_id for j in young if j.times_scheduled <= 1) | {j.job_id for j in fresh}
        counts = afs_counts(
            jobs,
            capacity(view),
            speeds,
            pessimistic=False,
            seed=self.seed,
            floors=floors,
            frozen=probing,
            limit=lambda j: gpu_limit(j, view.topology, self.memo),
            caps=view.group_caps,
        )
        order = sorted(
            jobs,
            key=lambda j: (
                j.job_id not in floors,
                speeds.remaining(j, j.spec.min_gpus),
                j.attained_service,
                tie_rank(self.seed, j.job_id),
            ),
        )
        return _run_round(
            view, now, jobs, order, counts, knobs, speeds, back, reverts, self.min_slice, "afs", self.memo
        )

    def _hold(self, j: Job) -> float:
        return max(self.min_slice, self.probe) if j.times_scheduled <= 1 else self.min_slice
