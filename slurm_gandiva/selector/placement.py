"""Affinity-aware placement (Gandiva's reactive mode) and the step from GPU counts to a plan.

`GpuPool` books GPUs (whole or as shards) and answers "where should a k-GPU job go": nodes whose jobs
have the same GPU count (same affinity), then free nodes, then nodes of another affinity, and within a
node the GPUs under one PCIe switch, else one socket, else the node; a job larger than any node's free
GPUs spans as few nodes as it can, and waits if that is more than its `max_nodes`. Nodes are indexed
by (affinity, free GPUs), so one placement touches a handful of nodes, never the whole cluster.

`realize` turns per-job GPU counts into the targets of `Plan.from_targets`: running jobs keep their
GPUs when their count is unchanged (no needless migrations), shrink in place, grow where they can.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from slurm_gandiva.model import (
    ClusterView,
    GpuRef,
    Job,
    JobState,
    Locality,
    Placement,
    Topology,
    TrialKind,
)
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector.common import Memo
from slurm_gandiva.selector.pool_state import (
    BOOKED_LIMIT,
    EMPTY,
    MIXED,
    Booked,
    NodeState,
    booked_cache,
    gpu_set,
    pool_template,
)

# Relative speed at each locality when the job's own rates say nothing about it (the default locality
# penalty). It also stands for a better locality that was never measured: a job measured only across
# sockets is assumed to lose 12% there, which clears Gandiva's 10% `locality_gain`, so it gets a migration
# trial when GPUs under one switch free up; the trial measures the new rate and reverts if it is not better.
LOCALITY_PRIOR: Mapping[Locality, float] = {
    Locality.SWITCH: 1.0,
    Locality.SOCKET: 0.95,
    Locality.NODE: 0.88,
    Locality.CROSS_NODE: 0.75,
}
# How much relative speed a job gives up to stay in an earlier affinity tier (limits fragmentation).
TIER_COST = 0.02
# How many candidate nodes one tier examines for a better locality before settling.
_SCAN_LIMIT = 8

_EMPTY = EMPTY  # affinity key of a node with no jobs
_MIXED = MIXED  # affinity key of a node whose jobs have different GPU counts
_NodeState = NodeState


def locality_factor(job: Job, gpus: int, locality: Locality) -> float:
    """The job's speed at `locality` relative to its best locality at `gpus` GPUs (1.0 = no loss).

    Uses the rates measured at `gpus` GPUs, else at the nearest other multi-GPU count; a locality not
    measured there is estimated from the measured ones with `LOCALITY_PRIOR` (so a rate measured only at
    a poor locality still shows the loss a better one is expected to save). Nothing measured: the prior.
    """
    if gpus <= 1 or locality is Locality.SWITCH:
        return 1.0
    rates = job.rates.rates
    if rates:
        for k in (gpus, *sorted({k for k, _ in rates if k > 1 and k != gpus}, key=lambda k: abs(k - gpus))):
            measured = {loc: r for loc in Locality if (r := rates.get((k, loc))) is not None and r > 0}
            if not measured:
                continue
            est = dict(measured)
            for loc in Locality:
                if loc not in est:  # scale the nearest measured locality (the better one on a tie)
                    near = min(measured, key=lambda m: (abs(int(m) - int(loc)), int(m)))
                    guess = measured[near] * LOCALITY_PRIOR[loc] / LOCALITY_PRIOR[near]
                    # never slower than a worse locality was measured to be
                    est[loc] = max(guess, max((r for m, r in measured.items() if m > loc), default=0.0))
            best = max(est.values())
            return min(1.0, est[locality] / best)
    return LOCALITY_PRIOR[locality]


Need = tuple[int, int]  # CPUs and memory (MB) a job takes on each of its nodes
_NO_NEED: Need = (0, 0)


def need_of(job: Job | None) -> Need:
    """What `job` takes on each of its nodes besides GPUs (none for None)."""
    return _NO_NEED if job is None else (job.spec.cpus_per_node, job.spec.mem_per_node_mb)


def _room_template(topology: Topology) -> dict[str, list[int | None]]:
    """Up nodes whose CPUs or memory are counted -> [free CPUs or None, free MB or None] before any booking."""
    return {
        n.name: [n.cpus - n.cpus_taken if n.cpus else None, n.memory_mb - n.memory_taken_mb if n.memory_mb else None]
        for n in topology.nodes
        if n.up and (n.cpus or n.memory_mb)
    }


class GpuPool:
    """Which GPUs of the up nodes are free, whole or as shards, indexed for fast placement."""

    def __init__(
        self,
        topology: Topology,
        memo: Memo | None = None,
        *,
        strict_ties: bool = False,
        ties: bool = True,
        even_spans: bool = False,
    ) -> None:
        self.topology = topology
        # A job across nodes gets the same GPU indices on each (`ClusterView.same_gpus_per_node`).
        self.even_spans = even_spans
        self.memo = memo if memo is not None else Memo()
        self.ties = ties  # Slurm ties requeued jobs to their old GPU indices (`ClusterView.requeue_ties`)
        self.strict_ties = strict_ties  # `find`: never place a requeued job where Slurm would hold it
        self._settled: set[GpuRef] = set()  # booked by jobs that stay where they run (`settle`)
        # `find` requests (GPUs, tied indices, max nodes) that found nothing since the pool last changed:
        # they find nothing again (a round asks the same of many waiting jobs).
        self._failed: set[tuple[int, frozenset[int], int | None, Need]] = set()
        self._shards: dict[GpuRef, int] = {}
        self._whole: set[GpuRef] = set()
        self._factors: dict[tuple[int, int, Locality], float] = {}
        self._node_refs: dict[str, tuple[GpuRef, ...]] = {}
        template = self.memo.per_topology(topology, pool_template)
        self._nodes: dict[str, _NodeState] = dict(template.states)
        self._mine: set[str] = set()  # nodes whose state this pool copied (`_own`); the others are shared
        self._shard_cap = template.shard_cap  # read only
        # Nodes by (affinity key, free GPUs), each bucket in the order nodes were (re)indexed, which
        # placement's tie-breaks follow; `_keys`: affinity key -> how many nodes have it.
        self._index = {k: dict(v) for k, v in template.index.items()}
        self._keys = dict(template.keys)
        self.max_node_gpus = template.max_node_gpus
        self._free_total = template.free_total
        self._pristine = True  # nothing booked, settled, released or found yet (`book_many` may reuse a state)
        # Free CPUs and memory of the nodes that count them (`Node.cpus`); booking a job takes its `Need`.
        self._room = {k: list(v) for k, v in self.memo.per_topology(topology, _room_template).items()}

    # -- index upkeep ---------------------------------------------------------------------------
    def _add_index(self, name: str, st: _NodeState) -> None:
        key = st.key
        self._index.setdefault((key, len(st.free)), {})[name] = None
        self._keys[key] = self._keys.get(key, 0) + 1

    def _drop_index(self, name: str, st: _NodeState) -> None:
        key = st.key
        bucket = self._index[(key, len(st.free))]
        del bucket[name]
        self._keys[key] -= 1
        if not self._keys[key]:
            del self._keys[key]

    # -- queries ----------------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        """GPUs that are free whole (no holder at all)."""
        return self._free_total

    def is_free(self, ref: GpuRef) -> bool:
        st = self._nodes.get(ref.node)
        return st is not None and ref in st.free

    def node_free(self, node: str) -> tuple[GpuRef, ...]:
        st = self._nodes.get(node)
        return tuple(st.free) if st else ()

    def can_book(self, placement: Placement) -> bool:
        """Whether every GPU of `placement` is on an up node and still available in that mode."""
        for g in placement.gpus:
            st = self._nodes.get(g.node)
            if st is None:
                return False
            if placement.shared:
                if not self.topology.has_gpu(g) or g in self._whole:
                    return False
                if self._shards.get(g, 0) >= self._shard_cap[g.node]:
                    return False
            elif g not in st.free:  # only existing GPUs are ever free
                return False
        return True

    def fits(self, node: str, need: Need) -> bool:
        """Whether `node`'s free CPUs and memory (what this pool has booked taken) hold `need`."""
        if need == _NO_NEED:
            return True
        room = self._room.get(node)
        if room is None:
            return True
        cpus, mem = room
        return (cpus is None or cpus >= need[0]) and (mem is None or mem >= need[1])

    def _use(self, placement: Placement, need: Need, sign: int) -> None:
        if need == _NO_NEED or not self._room:
            return
        for name in placement.nodes:
            room = self._room.get(name)
            if room is not None:
                for i in (0, 1):
                    if room[i] is not None:
                        room[i] = room[i] - sign * need[i]  # type: ignore[operator]

    def shard_cap(self, node: str) -> int:
        """How many shard holders one GPU of `node` takes (0 for a node that is down or unknown)."""
        return self._shard_cap.get(node, 0)

    def shard_slots(self) -> list[GpuRef]:
        """GPUs already held as shards that have room for one more holder."""
        return [g for g, n in self._shards.items() if 0 < n < self._shard_cap[g.node]]

    # -- booking ----------------------------------------------------------------------------------
    def book(self, placement: Placement, job: Job | None = None) -> bool:
        """Book `placement` (whole or shards) for `job`; False, and nothing booked, if any GPU is unavailable
        or a node's free CPUs or memory cannot hold the job (`fits`)."""
        need = need_of(job)
        if not self.can_book(placement) or not all(self.fits(n, need) for n in placement.nodes):
            return False
        touched = dict.fromkeys(g.node for g in placement.gpus)
        for name in touched:
            self._drop_index(name, self._nodes[name])
        self._take(placement)
        self._use(placement, need, 1)
        for name in touched:
            self._add_index(name, self._nodes[name])
        return True

    def _take(self, placement: Placement) -> None:
        """Mark a bookable placement's GPUs (whole or a shard each) and count its size on its nodes."""
        self._pristine = False
        self._failed.clear()
        for g in placement.gpus:
            st = self._own(g.node)
            if placement.shared:
                self._shards[g] = self._shards.get(g, 0) + 1
                if st.free.pop(g, None) is not None:
                    self._free_total -= 1
            else:
                del st.free[g]
                self._free_total -= 1
                self._whole.add(g)
        size = placement.count
        for name in dict.fromkeys(g.node for g in placement.gpus):
            sizes = self._own(name).sizes
            sizes[size] = sizes.get(size, 0) + 1

    def _own(self, name: str) -> _NodeState:
        """Node `name`'s state, copied first if it is still shared (with the template or a cached booking)."""
        st = self._nodes[name]
        if name not in self._mine:
            st = self._nodes[name] = _NodeState(dict(st.free), dict(st.sizes))
            self._mine.add(name)
        return st

    def book_many(self, placements: Sequence[Placement], jobs: Sequence[Job] | None = None) -> list[bool]:
        """`book` each placement in turn for the job at its place in `jobs`, rebuilding the node index once at
        the end. Jobs that stay where they run: their CPUs and memory are taken even where a node seems full.

        On a fresh pool without CPU or memory counts, the same placements (the same objects) booked on the
        same topology before give the state they gave then, copied (`Booked`)."""
        cache: dict[tuple[int, ...], Booked] | None = None
        key: tuple[int, ...] = ()
        if self._pristine and not self._room:
            cache = self.memo.per_topology(self.topology, booked_cache)
            key = tuple(map(id, placements))
            hit = cache.get(key)
            if hit is not None and all(a is b for a, b in zip(hit.placements, placements, strict=True)):
                self._restore(hit)
                return list(hit.out)
        out = self._book_many(placements, jobs)
        if cache is not None:
            if len(cache) >= BOOKED_LIMIT:
                cache.clear()
            cache[key] = self._snapshot(placements, out)
        return out

    def _book_many(self, placements: Sequence[Placement], jobs: Sequence[Job] | None) -> list[bool]:
        self._index.clear()
        self._keys.clear()
        out: list[bool] = []
        for i, placement in enumerate(placements):
            if placement.shared:
                if not self.can_book(placement):
                    out.append(False)
                    continue
                self._take(placement)
            elif not self._take_whole(placement.gpus):
                out.append(False)
                continue
            if self._room:
                self._use(placement, need_of(jobs[i] if jobs is not None else None), 1)
            out.append(True)
        index, keys = self._index, self._keys
        for name, st in self._nodes.items():  # `_add_index` of every node, inlined: this runs every round
            sizes = st.sizes
            key = _EMPTY if not sizes else next(iter(sizes)) if len(sizes) == 1 else _MIXED
            index.setdefault((key, len(st.free)), {})[name] = None
            keys[key] = keys.get(key, 0) + 1
        return out

    def _take_whole(self, gpus: tuple[GpuRef, ...]) -> bool:
        """`can_book` and `_take` for a whole-GPU placement in one pass; False, and nothing taken, if a GPU
        is not free."""
        nodes = self._nodes
        for g in gpus:
            st = nodes.get(g.node)
            if st is None or g not in st.free:
                return False
        self._pristine = False
        self._failed.clear()
        whole, mine = self._whole, self._mine
        names = dict.fromkeys(g.node for g in gpus)
        for name in names:
            if name not in mine:
                self._own(name)
        for g in gpus:
            del nodes[g.node].free[g]
            whole.add(g)
        self._free_total -= len(gpus)
        size = len(gpus)
        for name in names:
            sizes = nodes[name].sizes
            sizes[size] = sizes.get(size, 0) + 1
        return True

    def _snapshot(self, placements: Sequence[Placement], out: list[bool]) -> Booked:
        return Booked(
            placements=tuple(placements),
            out=tuple(out),
            nodes=self._share(),
            whole=frozenset(self._whole),
            shards=dict(self._shards),
            index={k: dict(v) for k, v in self._index.items()},
            keys=dict(self._keys),
            free_total=self._free_total,
        )

    def _share(self) -> tuple[tuple[str, _NodeState], ...]:
        """The node states, from now on shared (this pool copies a node's again before changing it)."""
        self._mine = set()
        return tuple(self._nodes.items())

    def _restore(self, booked: Booked) -> None:
        """This fresh pool's state becomes `booked`'s (a copy: the cached one is never changed)."""
        self._pristine = False
        self._nodes = dict(booked.nodes)
        self._mine = set()
        self._whole = set(booked.whole)
        self._shards = dict(booked.shards)
        self._index = {k: dict(v) for k, v in booked.index.items()}
        self._keys = dict(booked.keys)
        self._free_total = booked.free_total

    def settle(self, placement: Placement) -> None:
        """Mark a booked placement as a running job's that stays: only such GPUs tie a requeued job
        (`Job.requeue_indices`); one starting in the same plan waits for the requeued job's resume
        (the actor's waves), so it does not."""
        self.settle_gpus(placement.gpus)

    def settle_gpus(self, gpus: Iterable[GpuRef]) -> None:
        """`settle` for booked GPUs of one or more placements."""
        self._pristine = False
        self._failed.clear()
        self._settled.update(gpus)

    def release(self, placement: Placement, job: Job | None = None) -> None:
        """Undo `book(placement, job)` (and `settle`)."""
        self._pristine = False
        self._failed.clear()
        self._use(placement, need_of(job), -1)
        self._settled.difference_update(placement.gpus)
        size = placement.count
        touched = dict.fromkeys(g.node for g in placement.gpus)
        for name in touched:
            self._drop_index(name, self._nodes[name])
        for g in placement.gpus:
            st = self._own(g.node)
            if placement.shared:
                left = self._shards[g] - 1
                if left:
                    self._shards[g] = left
                else:
                    del self._shards[g]
                    st.free[g] = self.topology.gpu(g)
                    self._free_total += 1
            else:
                self._whole.discard(g)
                st.free[g] = self.topology.gpu(g)
                self._free_total += 1
        for name in touched:
            st = self._own(name)
            st.sizes[size] -= 1
            if not st.sizes[size]:
                del st.sizes[size]
            self._add_index(name, st)

    # -- placement --------------------------------------------------------------------------------
    def factor(self, job: Job, gpus: int, locality: Locality) -> float:
        """`locality_factor`, memoised per rate table for the life of this pool (one round)."""
        key = (id(job.rates), gpus, locality)
        val = self._factors.get(key)
        if val is None:
            val = self._factors[key] = locality_factor(job, gpus, locality)
        return val

    def _nodes_with(self, key: int, at_least: int) -> Iterable[str]:
        """Nodes of affinity `key` with at least `at_least` free GPUs, fewest free first (best fit)."""
        for f in range(at_least, self.max_node_gpus + 1):
            bucket = self._index.get((key, f))
            if bucket:
                yield from bucket

    def find(self, job: Job, gpus: int, tied: frozenset[int] | None = None) -> Placement | None:
        """The best whole-GPU placement of `gpus` GPUs for `job` by affinity and locality (not booked),
        on at most `job.spec.max_nodes` nodes; for a requeued job, on nodes where no other job holds a
        GPU with one of its old indices (`tied`, default `Job.requeue_indices`) when there is such a
        placement.

        A preference, not a rule: were it a rule, the count-based policies (AFS, the default) would keep
        giving GPUs to a job that cannot be placed and stopping others for it (hundreds of suspends per
        job on Philly's 0e4a51). Where only a tied node is left, the job may wait in Slurm there; with
        `strict_ties` (Gandiva, whose leftover GPUs go to other waiting jobs) it gets none instead. Without
        `ties` (a Slurm that does not tie requeued jobs) the old indices are only preferred."""
        if tied is None:
            tied = job.requeue_indices
        # Whether anything is found depends on the pool and these alone (the job only picks among them).
        need = need_of(job)
        request = (gpus, tied, job.spec.max_nodes, need)
        if request in self._failed:
            return None
        found = None
        if tied and self.ties:
            found = self._find(job, gpus, tied, tied)
        if found is None and not (tied and self.ties and self.strict_ties):
            found = self._find(job, gpus, frozenset(), tied)
        if found is None:
            self._pristine = False
            self._failed.add(request)
        return found

    def _find(self, job: Job, gpus: int, tied: frozenset[int], prefer: frozenset[int]) -> Placement | None:
        """`find` on nodes clear for `tied`; on a node, GPUs with the `prefer` indices first."""
        if gpus <= 0 or gpus > self.free_count:
            return None
        max_nodes = job.spec.max_nodes
        need = need_of(job)
        if max_nodes is not None and gpus > max_nodes * self.max_node_gpus:
            return None
        if gpus <= self.max_node_gpus:
            others = sorted(k for k in self._keys if k not in (gpus, _EMPTY))
            best: tuple[float, list[GpuRef]] | None = None
            for tier_no, keys in enumerate(([gpus], [_EMPTY], others)):
                ceiling = 1.0 - TIER_COST * tier_no  # the best score any node of this tier can get
                if best is not None and best[0] >= ceiling:
                    break
                scanned = 0
                for key in keys:
                    for name in self._nodes_with(key, gpus):
                        if (tied and not self._clear_for(name, tied)) or not self.fits(name, need):
                            continue
                        refs, loc = _pick_on_node(self._nodes[name], gpus, prefer)
                        score = self.factor(job, gpus, loc) - TIER_COST * tier_no
                        if best is None or score > best[0]:
                            best = (score, refs)
                        scanned += 1
                        if score >= ceiling or scanned >= _SCAN_LIMIT:
                            break
                    if (best is not None and best[0] >= ceiling) or scanned >= _SCAN_LIMIT:
                        break
            if best is not None:
                return Placement(tuple(best[1]))
        if max_nodes == 1:
            return None
        if self.even_spans:
            return self._find_even(gpus, tied, prefer, max_nodes, need)
        found = self._find_across(gpus, tied, prefer, need)
        if found is not None and max_nodes is not None and len(found.nodes) > max_nodes:
            return None  # the fewest nodes that hold `gpus` free GPUs are still too many
        return found

    def _clear_for(self, name: str, indices: frozenset[int]) -> bool:
        """Whether no GPU of node `name` with one of `indices` is held by a job that stays (`settle`): a
        requeued job tied to those indices can start there (`Job.requeue_indices`)."""
        settled = self._settled
        return not any(ref in settled for ref in self._refs(name) if ref.index in indices)

    def _refs(self, name: str) -> tuple[GpuRef, ...]:
        refs = self._node_refs.get(name)
        if refs is None:
            refs = self._node_refs[name] = tuple(g.ref for g in self.topology.node(name).gpus)
        return refs

    def _find_even(
        self, gpus: int, tied: frozenset[int], prefer: frozenset[int], max_nodes: int | None, need: Need = _NO_NEED
    ) -> Placement | None:
        """Across as few nodes as possible with the same free GPU indices on each (Slurm's per-node gres gives
        a job the same GPUs on every node): k nodes with `gpus / k` shared free indices, best-fitting nodes
        (fewest free GPUs) first, so whole free nodes are kept for jobs that need them."""
        by_set: dict[frozenset[int], list[str]] = {}
        for (_, f), bucket in self._index.items():
            if f:
                for name in bucket:
                    if (not tied or self._clear_for(name, tied)) and self.fits(name, need):
                        by_set.setdefault(frozenset(r.index for r in self._nodes[name].free), []).append(name)
        sets = sorted(by_set, key=lambda fs: (len(fs), sorted(fs)))
        hosts_total = sum(len(v) for v in by_set.values())
        most = hosts_total if max_nodes is None else min(max_nodes, hosts_total)
        for k in range(2, most + 1):
            if gpus % k or gpus // k > self.max_node_gpus:
                continue
            per = gpus // k
            for fs in sets:
                if len(fs) < per:
                    continue
                refs, _ = _pick_on_node(self._nodes[by_set[fs][0]], per, prefer)
                want = frozenset(r.index for r in refs)
                hosts = [n for other in sets if want <= other for n in sorted(by_set[other])]
                if len(hosts) >= k:
                    return Placement(tuple(GpuRef(n, i) for n in sorted(hosts[:k]) for i in sorted(want)))
        return None

    def _find_across(
        self,
        gpus: int,
        tied: frozenset[int] = frozenset(),
        prefer: frozenset[int] = frozenset(),
        takes: Need = _NO_NEED,
    ) -> Placement | None:
        """Span as few nodes as possible: whole free nodes first, then the best-fitting remainder
        (largest first, so no placement of `gpus` free GPUs uses fewer nodes); only nodes clear of
        booked GPUs with the job's `tied` indices."""
        chosen: list[GpuRef] = []
        need = gpus
        used: set[str] = set()
        by_free: dict[int, list[str]] = {}
        every = not tied and (takes == _NO_NEED or not self._room)  # every node with free GPUs is a host
        for (_, f), bucket in self._index.items():
            if f:
                by_free.setdefault(f, []).extend(
                    bucket if every else
                    (n for n in bucket if (not tied or self._clear_for(n, tied)) and self.fits(n, takes))
                )
        if sum(f * len(names) for f, names in by_free.items()) < gpus:
            return None  # (what the loop below finds too, after taking every host)
        for f in by_free:
            by_free[f].sort()
        sizes = sorted(by_free)
        while need > 0:
            fit = next((f for f in sizes if f >= need and any(n not in used for n in by_free[f])), None)
            if fit is not None:
                name = next(n for n in by_free[fit] if n not in used)
                refs, _ = _pick_on_node(self._nodes[name], need, prefer)
                chosen.extend(refs)
                return Placement(tuple(chosen))
            big = next((f for f in reversed(sizes) if any(n not in used for n in by_free[f])), None)
            if big is None:
                return None
            name = next(n for n in by_free[big] if n not in used)
            used.add(name)
            chosen.extend(self._nodes[name].free)
            need -= big
        return Placement(tuple(chosen))


def held_indices(p: Placement) -> frozenset[int] | None:
    """The GPU indices Slurm keeps for a running job on `p` once it is requeued by a move or resize
    (`Job.requeue_indices`); None for shards (untied)."""
    return None if p.shared else frozenset(g.index for g in p.gpus)


def _pick_on_node(st: _NodeState, k: int, prefer: frozenset[int] = frozenset()) -> tuple[list[GpuRef], Locality]:
    """k free GPUs of one node with the best locality; best fit so whole switches stay free; among
    equally good GPUs those with the `prefer` indices (a requeued job's own: Slurm keeps them, so a job
    that keeps its indices ties no other GPU, and who gets which GPU does not hang on placement order)."""
    by_switch: dict[int, list[GpuRef]] = {}
    by_socket: dict[int, list[int]] = {}
    for ref, info in st.free.items():
        lst = by_switch.setdefault(info.switch, [])
        if not lst:
            by_socket.setdefault(info.socket, []).append(info.switch)
        lst.append(ref)

    def own(s: int) -> int:
        return -sum(1 for r in by_switch[s] if r.index in prefer) if prefer else 0

    def ranked(refs: list[GpuRef]) -> list[GpuRef]:
        return sorted(refs, key=lambda r: (r.index not in prefer, r)) if prefer else sorted(refs)

    fits = [s for s, refs in by_switch.items() if len(refs) >= k]
    if fits:
        sw = min(fits, key=lambda s: (len(by_switch[s]), own(s), s))
        return ranked(by_switch[sw])[:k], Locality.SWITCH

    def take(switches: Iterable[int]) -> list[GpuRef]:
        out: list[GpuRef] = []
        for s in sorted(switches, key=lambda s: (-len(by_switch[s]), own(s), s)):
            out.extend(ranked(by_switch[s])[: k - len(out)])
            if len(out) >= k:
                break
        return out

    sock_fits = [
        (sum(len(by_switch[s]) for s in sws), sock, sws)
        for sock, sws in by_socket.items()
        if sum(len(by_switch[s]) for s in sws) >= k
    ]
    if sock_fits:
        _, _, sws = min(sock_fits)
        return take(sws), Locality.SOCKET
    return take(by_switch), Locality.NODE


def shrink(topology: Topology, placement: Placement, k: int) -> Placement:
    """The k GPUs of `placement` to keep when a job shrinks: the most tightly grouped ones."""
    groups: dict[tuple[str, int, int], list[GpuRef]] = {}
    for g in placement.gpus:
        info = topology.gpu(g)
        groups.setdefault((g.node, info.socket, info.switch), []).append(g)
    per_node = Counter(g.node for g in placement.gpus)
    per_socket = Counter((n, s) for n, s, _ in groups for _ in groups[(n, s, _)])
    order = sorted(
        groups,
        key=lambda key: (-per_node[key[0]], key[0], -per_socket[(key[0], key[1])], -len(groups[key]), key),
    )
    kept: list[GpuRef] = []
    for key in order:
        kept.extend(groups[key][: k - len(kept)])
        if len(kept) >= k:
            break
    return Placement(tuple(kept), shared=placement.shared)


def is_even(placement: Placement) -> bool:
    """Whether `placement` has the same GPU indices on each of its nodes (what Slurm's per-node gres gives)."""
    sets = {frozenset(placement.on_node(n)) for n in placement.nodes}
    return len(sets) == 1


def even_shrink(topology: Topology, placement: Placement, k: int) -> Placement | None:
    """The k GPUs to keep of an even `placement` (`is_even`) so that what is kept is even too: the fewest of
    its nodes that hold k GPUs with the same indices on each (the indices `shrink` keeps on the first node);
    None when no such part exists (k GPUs cannot be spread evenly over its nodes)."""
    nodes = sorted(placement.nodes)
    per = len(placement.on_node(nodes[0]))
    for m in range(1, len(nodes) + 1):
        if k % m == 0 and k // m <= per:
            first = Placement(tuple(GpuRef(nodes[0], i) for i in placement.on_node(nodes[0])), shared=placement.shared)
            keep = sorted(g.index for g in shrink(topology, first, k // m).gpus)
            return Placement(tuple(GpuRef(n, i) for n in nodes[:m] for i in keep), shared=placement.shared)
    return None


@dataclass
class Targets:
    """What `realize` produced: target placements (only for jobs that change) and their annotations."""

    placements: dict[str, Placement | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    trials: dict[str, TrialKind] = field(default_factory=dict)
    reverts: set[str] = field(default_factory=set)

    def set(self, job_id: str, placement: Placement | None, reason: str) -> None:
        self.placements[job_id] = placement
        self.reasons[job_id] = reason

    def plan(self, view: ClusterView) -> Plan:
        return Plan.from_targets(view, self.placements, self.reasons, self.trials, frozenset(self.reverts))


def placed_ok(view: ClusterView, job: Job) -> bool:
    """A running job whose placement is entirely on existing GPUs of up nodes."""
    if job.state is not JobState.RUNNING or job.placement is None:
        return False
    topo = view.topology
    return all(topo.has_gpu(g) and topo.node(g.node).up for g in job.placement.gpus)


def realize(
    view: ClusterView,
    jobs: Sequence[Job],
    counts: Mapping[str, int],
    *,
    pool: GpuPool | None = None,
    elastic_fallback: bool = False,
    reason: str = "",
    fixed: Mapping[str, Placement] | None = None,
    reverts: Iterable[str] = (),
    memo: Memo | None = None,
    strict_ties: bool = False,
) -> tuple[Targets, GpuPool]:
    """Targets that give each job in `jobs` (priority order) `counts[job_id]` GPUs (0 or missing: none).

    Running jobs keep their GPUs when the count is unchanged, keep a subset when it shrinks, and
    keep what they have if a larger placement cannot be found. New placements go in priority order.
    With `elastic_fallback`, a job that cannot get its count gets the most it can, down to its minimum.
    `fixed` names exact placements for some jobs (trial reverts), taken when their GPUs are available
    after the staying jobs are booked; `reverts` marks the decisions of those jobs as reverts.
    `strict_ties`: see `GpuPool.find` (for the pool made here).
    A job grows only onto a placement where it is expected to run faster than where it is (`_faster`):
    more GPUs spread over nodes can be slower than fewer in one (an elastic policy's counts assume the
    best locality; `afs.settled_plan` feeds such refusals back to the rule).
    """
    topo = view.topology
    pool = pool or GpuPool(topo, memo, strict_ties=strict_ties, ties=view.requeue_ties,
                           even_spans=view.same_gpus_per_node)
    out = Targets()
    kept: dict[str, Placement] = {}
    pending: list[tuple[int, Job]] = []  # (place in `jobs`, job): placed in that order
    fixed = fixed or {}
    out.reverts.update(reverts)
    deferred: list[tuple[int, Job]] = []
    exists = pool.memo.per_topology(topo, gpu_set)
    running = JobState.RUNNING
    # Book what stays first, so that nobody is placed on GPUs a staying job holds.
    stay: list[tuple[int, Job, Placement, int]] = []
    for i, job in enumerate(jobs):
        want = counts.get(job.job_id, 0)
        if want > 0 and job.job_id in fixed:
            deferred.append((i, job))
        elif job.state is running and job.placement is not None:
            cur = job.placement
            if want <= 0:
                out.set(job.job_id, None, reason or "preempted")
            elif want >= len(cur.gpus) or not exists.issuperset(cur.gpus):
                stay.append((i, job, cur, want))
            else:
                part: Placement | None = shrink(topo, cur, want)
                if pool.even_spans and part is not None and not is_even(part):
                    part = even_shrink(topo, cur, want) if is_even(cur) else None
                if part is None:
                    pending.append((i, job))  # placed anew: moved to where its count fits evenly
                else:
                    stay.append((i, job, part, want))
        elif want > 0:
            pending.append((i, job))
    booked = pool.book_many([t for _, _, t, _ in stay], [j for _, j, _, _ in stay])
    settled: list[GpuRef] = []
    for (i, job, target, want), ok in zip(stay, booked, strict=True):
        had = job.placement
        assert had is not None
        if not ok:
            pending.append((i, job))
            continue
        settled += target.gpus
        kept[job.job_id] = target
        if target is not had and target != had:
            out.set(job.job_id, target, reason or "shrink")
        if want > len(had.gpus):
            pending.append((i, job))
    if settled:
        pool.settle_gpus(settled)
    for i, job in deferred:
        target = fixed[job.job_id]
        if pool.book(target, job):
            kept[job.job_id] = target
            out.set(job.job_id, target, "revert")
        elif job.state is JobState.RUNNING and placed_ok(view, job) and pool.book(job.placement, job):  # type: ignore[arg-type]
            pool.settle(job.placement)  # type: ignore[arg-type]
            kept[job.job_id] = job.placement  # type: ignore[assignment]
        else:
            pending.append((i, job))
    pending.sort(key=itemgetter(0))
    for _, job in pending:
        want = counts[job.job_id]
        old = kept.pop(job.job_id, None)
        if old is not None:
            pool.release(old, job)
        found = None
        lowest = job.spec.min_gpus if elastic_fallback else want
        # A running job moved off its GPUs is requeued: it keeps their indices (`Job.requeue_indices`).
        moved = job.placement if old is None and job.state is JobState.RUNNING else None
        tied = held_indices(moved) if moved is not None else None
        for k in range(want, max(1, lowest) - 1, -1):
            if old is not None and k <= old.count:
                break
            found = pool.find(job, k, tied)
            if found is not None and old is not None and not _faster(pool, job, found, old):
                found = None  # more GPUs, but spread where the job runs slower than it does now
            if found is not None:
                break
        if found is not None:
            pool.book(found, job)
            out.set(job.job_id, found, reason or ("grow" if old is not None else "start"))
        elif old is not None:
            pool.book(old, job)
            pool.settle(old)
            out.placements.pop(job.job_id, None)
        elif job.state is JobState.RUNNING:
            out.set(job.job_id, None, reason or "no room")
    return out, pool


def _faster(pool: GpuPool, job: Job, new: Placement, old: Placement) -> bool:
    """Whether `job` is expected to run faster on `new` than on `old` (its rates at each count, times the
    locality factor of each placement)."""
    topo = pool.topology

    def speed(p: Placement) -> float:
        return job.rates.throughput(p.count) * pool.factor(job, p.count, topo.locality(p.gpus))

    return speed(new) > speed(old)
