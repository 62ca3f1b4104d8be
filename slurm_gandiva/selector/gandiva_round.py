"""One Gandiva or default round once the GPU counts are chosen: placement with affinity, a reservation
for the first waiting multi-GPU job, leftover GPUs to whoever still waits, then the introspective trials
(packing, migration, grow-shrink). `gandiva.py` chooses the counts and calls `run_round`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobState, Locality, Node, Placement, Topology, TrialKind
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.common import (
    GroupRoom,
    Memo,
    Speeds,
    gpu_limit,
    slice_age,
    within_group_caps,
)
from slurm_gandiva.selector.placement import GpuPool, Targets, held_indices, need_of, realize


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


@dataclass(frozen=True, slots=True)
class Round:
    """One round's inputs, as a policy's `decide` gathered them. `counts` (GPUs per job) is the policy's
    and the round adjusts it in place (reverted trials, a reservation's hand-on)."""

    view: ClusterView
    now: float
    jobs: Sequence[Job]
    order: Sequence[Job]  # priority order
    counts: dict[str, int]
    knobs: Introspection
    speeds: Speeds
    back: dict[str, Placement | None]  # failed trials: the placement each goes back to (None: stop it)
    reverts: set[str]
    min_slice: float
    reason: str
    memo: Memo
    reserve: bool = False  # keep one node's GPUs for the first waiting multi-GPU job that could not be placed
    grid: float | None = None
    grace: float = 0.0
    window: float | None = None
    strict_ties: bool = False
    # Leftover GPUs go to the jobs without GPUs in priority order, a running one staying put where it can
    # (False: waiting jobs first, then running ones). Waiting-first stopped a running job that held
    # leftovers behind a wide job that could not be placed, for a waiting one, and back at the next round.
    leftovers_in_order: bool = False


def run_round(r: Round) -> Plan:
    """The round's plan: `r.counts` placed, then leftovers, reservation and trials as the module says."""
    view, jobs, order, counts, back = r.view, r.jobs, r.order, r.counts, r.back
    for job_id, p in back.items():
        if p is None:
            counts[job_id] = 0
    fixed = {jid: p for jid, p in back.items() if p is not None and counts.get(jid, 0) > 0}
    for jid, p in fixed.items():
        counts[jid] = p.count
    targets, pool = realize(
        view, order, counts, reason=r.reason, fixed=fixed, reverts=r.reverts, memo=r.memo, strict_ties=r.strict_ties
    )
    counted = GroupRoom.of(view, order, counts)

    def may_run(j: Job) -> bool:  # counted for GPUs already, or its group has a place left
        return counts.get(j.job_id, 0) > 0 or counted.fits(j)

    res = (
        _reservation(
            view, order, targets, r.now, r.min_slice, r.grid, r.grace, r.window, r.strict_ties, may_run, r.memo
        )
        if r.reserve
        else None
    )
    if res is not None:
        # The first waiting multi-GPU job could not be placed: keep GPUs of one node for it, stopping
        # lower-priority jobs there once nothing younger than a min slice is left in its way.
        _hand_on(order, counts, res, back, counted)
        pool = GpuPool(view.topology, r.memo, strict_ties=r.strict_ties, ties=view.requeue_ties,
                       even_spans=view.same_gpus_per_node)
        hold = Placement(res.held)
        pool.book(hold)
        targets, pool = realize(
            view, order, counts, pool=pool, reason=r.reason, fixed=fixed, reverts=r.reverts, memo=r.memo
        )
        if res.startable:
            pool.release(hold)
            head = res.head
            p = pool.find(head, head.spec.min_gpus)
            if p is not None and pool.book(p, head):
                targets.set(head.job_id, p, f"{r.reason}: its turn, on GPUs kept free for it")
    final = {j.job_id: targets.placements.get(j.job_id, j.placement) for j in jobs}
    waiting: list[Job] = []  # the waiting jobs left without GPUs, then the running ones, each in order
    stopped: list[Job] = []
    for j in order:
        if final[j.job_id] is None:
            (stopped if j.state is JobState.RUNNING else waiting).append(j)
    waiting = [j for j in order if final[j.job_id] is None] if r.leftovers_in_order else waiting + stopped
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
        if p is not None and pool.book(p, j):
            room.take(j)
            if p == j.placement:
                pool.settle(p)
            targets.set(j.job_id, p, r.reason)
            final[j.job_id] = p
            started.add(j.job_id)
    waiting = [j for j in waiting if j.job_id not in started]
    _unpack_lonely(jobs, final, targets, pool)
    if r.knobs.pack and view.packing and waiting:
        _pack(order, waiting, final, targets, pool, back, room)
    if r.knobs.migrate:
        _migrate(view, jobs, final, targets, pool, r.knobs, r.now, r.min_slice, r.grace)
    if r.knobs.grow and not waiting and pool.free_count:
        _grow(jobs, final, targets, pool, r.knobs, r.speeds, r.now, r.min_slice, r.grace)
    return within_group_caps(targets.plan(view), view, order)


_AHEAD, _PINNED, _MOVABLE = 0, 1, 2  # a job on a node `_reservation` weighs: ahead of its head, or not and
# pinned (a young slice, or finishing), or not and movable
_Holder = tuple[Job, Placement, int, int, int]  # a job on a node: its GPUs, how many there, its rank, its kind


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
    memo: Memo | None = None,
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
    mine = next(i for i, j in enumerate(order) if j is head)
    memo = memo if memo is not None else Memo()
    placed = targets.placements
    # node -> (job, the GPUs it holds or gets, how many on the node, its rank, ahead / pinned / movable)
    holders: dict[str, list[_Holder]] = {}
    for i, j in enumerate(order):
        p = j.placement if j.state is JobState.RUNNING else None
        if i < mine and j.job_id in placed:
            p = placed[j.job_id]  # where this round puts a job ahead of the head
        if p is None:
            continue
        if i < mine:
            kind = _AHEAD
        elif young(j, now, min_slice, grid, window) or finishing(j, grace):
            kind = _PINNED
        else:
            kind = _MOVABLE
        for name, n in memo.of(p, _per_node):
            holders.setdefault(name, []).append((j, p, n, i, kind))

    def option(node: Node, need: int) -> tuple[tuple[int, int, int, str], list[GpuRef], list[str], bool] | None:
        """(score, GPUs kept, jobs that yield, startable) for keeping `need` GPUs of `node`; None: no room."""
        on_node = holders.get(node.name, [])
        permanent = pinned = 0
        movable: list[tuple[int, Job]] = []
        for j, _, n, i, kind in on_node:
            if kind == _AHEAD:
                permanent += n
            elif kind == _PINNED:
                pinned += n
            else:
                movable.append((i, j))
        size = len(node.gpus)
        if size - permanent < need:
            return None
        startable = size - permanent - pinned >= need
        yields: list[str] = []
        free = _free_on(node, on_node, yields)
        if startable:
            movable.sort(key=lambda m: -m[0])  # the lowest priority stops first
            for _, j in movable:
                if len(free) >= need:
                    break
                yields.append(j.job_id)
                free = _free_on(node, on_node, yields)
            if len(free) < need:  # shared GPUs: a sharer still holds one
                return None
        if strict_ties and tied:
            staying = {g for j, p, _, _, _ in on_node if j.job_id not in yields and p == j.placement for g in p.gpus}
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


def _per_node(p: Placement) -> tuple[tuple[str, int], ...]:
    """(node, how many of `p`'s GPUs are on it) for each of `p`'s nodes."""
    counts: dict[str, int] = {}
    for g in p.gpus:
        counts[g.node] = counts.get(g.node, 0) + 1
    return tuple(counts.items())


def _free_on(node: Node, holders: Sequence[_Holder], stopping: Sequence[str]) -> list[GpuRef]:
    """`node`'s GPUs that no job in `holders` holds once the jobs in `stopping` have stopped."""
    if not holders:
        return list(node.gpu_refs)
    busy = {g for j, p, _, _, _ in holders if j.job_id not in stopping for g in p.gpus}
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
        pool.release(p, j)
        if pool.book(whole, j):
            targets.set(j.job_id, whole, "unpack: alone on its GPU")
            final[j.job_id] = whole
        else:
            pool.book(p, j)


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
        need = need_of(j)
        slot = next((s for s in reversed(slots) if pool.fits(s.node, need)), None)
        if slot is not None:
            slots.remove(slot)
            g = slot
        elif next_host < len(hosts):
            host = hosts[next_host]
            assert host.placement is not None
            if not pool.fits(host.placement.gpus[0].node, need):
                continue  # its node's CPUs or memory cannot hold j as well
            next_host += 1
            g = host.placement.gpus[0]
            pool.release(host.placement, host)
            shared = Placement((g,), shared=True)
            pool.book(shared, host)
            targets.set(host.job_id, shared, f"pack with {j.job_id}")
            targets.trials[host.job_id] = TrialKind.PACK
            final[host.job_id] = shared
        else:
            break
        mine = Placement((g,), shared=True)
        if pool.book(mine, j):
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
    changed = targets.placements
    for j in jobs:
        p = j.placement
        if j.state is not JobState.RUNNING or p is None or j.job_id in changed:  # not `_unchanged`
            continue  # (the state first: most of 10,000 jobs wait)
        k = len(p.gpus)
        if k < 2 or j.trial is not None or p.shared or TrialKind.MIGRATE in j.failed_trials:
            continue
        best = next((lvl for lvl, most in limits if k <= most), Locality.CROSS_NODE)
        if best is Locality.CROSS_NODE or slice_age(j, now) < min_slice:
            continue  # (no locality is better than across nodes: the cheap test first)
        loc = topo.locality(p.gpus)
        if loc <= best or finishing(j, grace):
            continue
        if pool.factor(j, k, best) >= (1.0 + knobs.locality_gain) * pool.factor(j, k, loc):
            cands.append((-int(loc), j.job_id, j, loc))
    cands.sort(key=lambda c: (c[0], c[1]))
    moves = 0
    for _, _, j, loc in cands:
        if moves >= knobs.max_moves or not pool.free_count:
            break
        cur = j.placement
        assert cur is not None
        pool.release(cur, j)
        p = pool.find(j, cur.count, held_indices(cur))  # moved, it is requeued: Slurm keeps its indices
        if p is not None and p != cur:
            new_loc = topo.locality(p.gpus)
            gain = pool.factor(j, cur.count, new_loc) / pool.factor(j, cur.count, loc)
            if gain >= 1.0 + knobs.locality_gain:
                pool.book(p, j)
                targets.set(j.job_id, p, f"migrate: {loc.name.lower()} -> {new_loc.name.lower()}")
                targets.trials[j.job_id] = TrialKind.MIGRATE
                final[j.job_id] = p
                moves += 1
                continue
        pool.book(cur, j)


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
        pool.release(cur, j)
        p = pool.find(j, k, held_indices(cur))  # resized, it is requeued: Slurm keeps its indices
        if p is not None:
            pool.book(p, j)
            targets.set(j.job_id, p, f"grow onto idle GPUs: {j.gpus} -> {k}")
            targets.trials[j.job_id] = TrialKind.GROW
            final[j.job_id] = p
        else:
            pool.book(cur, j)
