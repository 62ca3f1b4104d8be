"""Domain types shared by the policies, the controller and the simulator.

Everything here is a frozen dataclass, an enum or a pure function, and does no I/O. Times are seconds
(floats) on whatever clock the caller injects; work is measured in "work units" (samples for the
wrapper's jobs, model-specific units in the simulator) and rates in work units per second.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

# The most seconds a slice's start-up (Slurm start to first progress report) is kept out of its age:
# the controller and the simulator both count a slice from its training start, at most this late.
STARTUP_GRACE_S = 60.0


class JobState(enum.Enum):
    """Lifecycle of a managed job, as the policies see it."""

    QUEUED = "queued"  # submitted, never ran
    RUNNING = "running"  # holds GPUs now
    SUSPENDED = "suspended"  # ran before, checkpointed, holds no GPUs
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

    @property
    def waiting(self) -> bool:
        return self in (JobState.QUEUED, JobState.SUSPENDED)


class Locality(enum.IntEnum):
    """How close a set of GPUs is; lower is better."""

    SWITCH = 0  # one GPU, or all GPUs under one PCIe switch
    SOCKET = 1  # one CPU socket, several switches
    NODE = 2  # one node, several sockets
    CROSS_NODE = 3  # several nodes


@dataclass(frozen=True, order=True)
class GpuRef:
    """One physical GPU: node name and the GPU's index on that node."""

    node: str
    index: int
    # GPUs are dict and set keys everywhere; the generated __hash__ built a tuple at every look-up.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.node, self.index)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[GpuRef], tuple[str, int]]:
        return GpuRef, (self.node, self.index)  # str hashes differ between processes: hash again

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True)
class GpuInfo:
    """Where a GPU sits in its node: CPU socket and PCIe switch (switch ids are unique per node)."""

    ref: GpuRef
    socket: int
    switch: int


@dataclass(frozen=True)
class Node:
    """A compute node with its GPUs. `shards` is how many packed jobs one GPU can hold.

    `cpus` and `memory_mb`: what Slurm may allocate on it (0: not counted, as in the simulator);
    `cpus_taken` and `memory_taken_mb`: what jobs outside the view (not managed) hold there now."""

    name: str
    gpus: tuple[GpuInfo, ...]
    up: bool = True
    shards: int = 2
    cpus: int = 0
    memory_mb: int = 0
    cpus_taken: int = 0
    memory_taken_mb: int = 0

    @property
    def gpu_refs(self) -> tuple[GpuRef, ...]:
        return tuple(g.ref for g in self.gpus)


@dataclass(frozen=True)
class Topology:
    """node > socket > PCIe switch > GPU."""

    nodes: tuple[Node, ...]

    @cached_property
    def _by_ref(self) -> dict[GpuRef, GpuInfo]:
        return {g.ref: g for n in self.nodes for g in n.gpus}

    @cached_property
    def _by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        return self._by_name[name]

    def gpu(self, ref: GpuRef) -> GpuInfo:
        return self._by_ref[ref]

    def has_gpu(self, ref: GpuRef) -> bool:
        return ref in self._by_ref

    def all_gpus(self, *, up_only: bool = True) -> tuple[GpuRef, ...]:
        return self._up_gpus if up_only else tuple(g.ref for n in self.nodes for g in n.gpus)

    @cached_property
    def _up_gpus(self) -> tuple[GpuRef, ...]:
        return tuple(g.ref for n in self.nodes if n.up for g in n.gpus)

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @cached_property
    def _localities(self) -> dict[tuple[GpuRef, ...], Locality]:
        return {}  # locality's answers: the topology is frozen, and policies ask of the same placements each round

    def locality(self, gpus: Iterable[GpuRef]) -> Locality:
        key = gpus if isinstance(gpus, tuple) else tuple(gpus)
        hit = self._localities.get(key)
        if hit is None:
            hit = self._localities[key] = self._locality(key)
        return hit

    def _locality(self, gpus: tuple[GpuRef, ...]) -> Locality:
        infos = [self._by_ref[g] for g in gpus]
        if len({i.ref.node for i in infos}) > 1:
            return Locality.CROSS_NODE
        if len({i.switch for i in infos}) <= 1:
            return Locality.SWITCH
        if len({i.socket for i in infos}) <= 1:
            return Locality.SOCKET
        return Locality.NODE

    @staticmethod
    def uniform(
        nodes: int,
        gpus_per_node: int,
        *,
        gpus_per_switch: int = 2,
        sockets: int = 2,
        prefix: str = "n",
        shards: int = 2,
    ) -> Topology:
        """A homogeneous cluster: nodes named prefix1..prefixN, GPUs split evenly over sockets and switches."""
        per_socket = max(1, gpus_per_node // max(1, sockets))
        out = []
        for i in range(1, nodes + 1):
            name = f"{prefix}{i}"
            gpus = tuple(
                GpuInfo(GpuRef(name, k), socket=min(k // per_socket, sockets - 1), switch=k // gpus_per_switch)
                for k in range(gpus_per_node)
            )
            out.append(Node(name, gpus, shards=shards))
        return Topology(tuple(out))


def placeable(k: int, node_gpus: Iterable[int]) -> bool:
    """Whether k GPUs fit on nodes of these GPU counts with as many on each node used (Slurm's per-node gres):
    m nodes with at least k/m GPUs each, for some m that divides k."""
    sizes = sorted(node_gpus, reverse=True)
    return any(k % m == 0 and sizes[m - 1] >= k // m for m in range(1, len(sizes) + 1))


@dataclass(frozen=True)
class Placement:
    """The GPUs a job holds. `shared` means it holds one shard of each GPU (packing), not the whole GPU."""

    gpus: tuple[GpuRef, ...]
    shared: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus)))
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"placement lists a GPU twice: {self.gpus}")

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({g.node for g in self.gpus}))

    def on_node(self, node: str) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if g.node == node)

    def __str__(self) -> str:
        body = ",".join(f"{n}:{'+'.join(map(str, self.on_node(n)))}" for n in self.nodes)
        return body + ("(shared)" if self.shared else "")


@dataclass(frozen=True)
class RateTable:
    """Throughput (work units / s) by GPU count and locality: measured, or a prior from a scaling table.

    `throughput(k)` answers for the best locality known at k; unknown counts are interpolated from the
    nearest known counts (never extrapolated above the best known per-GPU rate).
    """

    rates: Mapping[tuple[int, Locality], float] = field(default_factory=dict)

    def with_rate(self, gpus: int, locality: Locality, rate: float) -> RateTable:
        new = dict(self.rates)
        new[(gpus, locality)] = rate
        return RateTable(new)

    def known_counts(self) -> list[int]:
        return sorted({k for k, _ in self.rates})

    @cached_property
    def _answers(self) -> dict[tuple[int, Locality | None], float]:
        return {}  # throughput's answers: the table is frozen, and policies ask the same counts every round

    def throughput(self, gpus: int, locality: Locality | None = None) -> float:
        key = (gpus, locality)
        hit = self._answers.get(key)
        if hit is None:
            hit = self._answers[key] = self._throughput(gpus, locality)
        return hit

    def _throughput(self, gpus: int, locality: Locality | None) -> float:
        if gpus <= 0:
            return 0.0
        if locality is not None and (gpus, locality) in self.rates:
            return self.rates[(gpus, locality)]
        at_k = [r for (k, loc), r in self.rates.items() if k == gpus and (locality is None or loc >= locality)]
        if at_k:
            return max(at_k)
        best = {k: max(r for (kk, _), r in self.rates.items() if kk == k) for k in self.known_counts()}
        if not best:
            return float(gpus)  # nothing known: assume linear scaling in arbitrary units
        lower = [k for k in best if k < gpus]
        upper = [k for k in best if k > gpus]
        if lower and upper:
            lo, hi = max(lower), min(upper)
            frac = (gpus - lo) / (hi - lo)
            return best[lo] + frac * (best[hi] - best[lo])
        if lower:
            lo = max(lower)
            return best[lo]  # no evidence that more GPUs help
        hi = min(upper)
        return best[hi] * gpus / hi

    def speedup(self, gpus: int) -> float:
        one = self.throughput(1)
        return self.throughput(gpus) / one if one > 0 else float(gpus)


class TrialKind(enum.Enum):
    """Introspective-mode experiments; each is measured and reverted if the job got slower."""

    PACK = "pack"
    MIGRATE = "migrate"
    GROW = "grow"


@dataclass(frozen=True)
class Trial:
    """A running experiment on a job: what was tried, when, and the rate it must beat."""

    kind: TrialKind
    started: float
    baseline_rate: float
    previous: Placement | None


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for. A rigid job has min_gpus == max_gpus."""

    job_id: str
    user: str
    min_gpus: int
    max_gpus: int
    submit_time: float
    total_work: float | None = None  # work units to finish, when known
    name: str = ""
    model: str = ""  # scaling-table name, when known
    max_nodes: int | None = None  # most nodes one placement may span (None: any; the job wrapper runs on 1)
    # The group the job belongs to (a job array's id: one task of a hyper-parameter search), or None.
    # `ClusterView.group_caps` may cap how many jobs of one group run at once.
    group: str | None = None
    # CPUs and memory (MB) it needs on each of its nodes (Slurm's MinCPUsNode / MinMemoryNode); 0: none.
    cpus_per_node: int = 0
    mem_per_node_mb: int = 0
    # The Slurm account and QOS it runs under ("": none given; the fair-share layer's tenant is the
    # account, then the user in it).
    account: str = ""
    qos: str = ""

    def __post_init__(self) -> None:
        if self.min_gpus < 1 or self.max_gpus < self.min_gpus:
            raise ValueError(f"job {self.job_id}: bad GPU range {self.min_gpus}:{self.max_gpus}")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"job {self.job_id}: max_nodes must be at least 1, not {self.max_nodes}")

    @property
    def elastic(self) -> bool:
        return self.max_gpus > self.min_gpus


@dataclass(frozen=True)
class Job:
    """A managed job as the policies see it at one instant."""

    spec: JobSpec
    state: JobState = JobState.QUEUED
    placement: Placement | None = None
    progress: float = 0.0  # work units done
    attained_service: float = 0.0  # GPU-seconds received so far
    times_scheduled: int = 0  # how many slices it has started
    first_start: float | None = None
    slice_start: float | None = None  # when the current slice began (running jobs)
    last_run_end: float | None = None  # when it last stopped running
    # The GPUs of its last slice (whole GPUs only): Slurm 22.05 keeps a requeued job's GRES indices and
    # does not start it on a node where another job holds a GPU with one of them (see `requeue_indices`).
    last_gpus: tuple[GpuRef, ...] = ()
    rates: RateTable = field(default_factory=RateTable)
    trial: Trial | None = None
    measured_rate: float | None = None  # latest measurement at the current placement
    failed_trials: frozenset[TrialKind] = frozenset()  # kinds of trial reverted on this job (not retried)

    @cached_property
    def job_id(self) -> str:  # cached: policies read it millions of times on long traces
        return self.spec.job_id

    @property
    def gpus(self) -> int:
        return self.placement.count if self.placement else 0

    @property
    def remaining_work(self) -> float | None:
        if self.spec.total_work is None:
            return None
        return max(0.0, self.spec.total_work - self.progress)

    def remaining_time(self, gpus: int) -> float:
        """Estimated seconds to finish on `gpus` GPUs (inf when unknown or no progress possible)."""
        rem = self.remaining_work
        rate = self.rates.throughput(gpus)
        if rem is None or rate <= 0:
            return float("inf")
        return rem / rate

    @property
    def requeue_indices(self) -> frozenset[int]:
        """GPU indices Slurm ties this waiting job to: those of its last slice (empty for a running job).

        Slurm 22.05 keeps a requeued job's old GRES indices: released onto other GPUs of a node where
        another job holds a GPU with one of those indices, it stays pending until that GPU frees
        (measured: 15-45 s stalls), whatever its new gres says. Placement prefers nodes clear of them
        (`GpuPool.find`). A running job that is moved or resized is requeued too: `realize` steers a
        running job it moves off its GPUs the same way, but not a growing one (steering growth made
        AFS grow jobs in place with worse locality and shrink them again: 25x more resizes on the
        Philly traces), so a resize can still wait on Slurm.
        """
        if self.state is JobState.RUNNING:
            return frozenset()
        return frozenset(g.index for g in self.last_gpus)

    def evolve(self, **changes: object) -> Job:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class GpuLimit:
    """At most `gpus` GPUs held at once by the jobs in one scope: Slurm's `GrpTRES=gres/gpu=N` on an
    association (`account`, with `user` for a user's own association) or on a QOS (`qos`), or with
    `per_user` its `MaxTRESPerUser=gres/gpu=N` (each user's jobs in that scope counted apart)."""

    gpus: int
    account: str = ""
    user: str = ""
    qos: str = ""
    per_user: bool = False

    def scope(self, spec: JobSpec) -> tuple[str, ...] | None:
        """The counter `spec`'s GPUs add to under this limit (jobs with the same one share the cap), or
        None when the limit does not cover the job."""
        if self.qos:
            if spec.qos != self.qos:
                return None
        elif spec.account != self.account or (self.user and spec.user != self.user):
            return None
        return (self.account, self.user, self.qos, spec.user if self.per_user else "")


@dataclass(frozen=True)
class Tenants:
    """The cluster's tenants as Slurm's accounting holds them (read through slurm/, at most once a round).

    `shares`: account -> its RawShares (Fairshare=). `user_shares`: (account, user) -> the user's RawShares
    within the account. `limits`: the association and QOS GPU limits. An account or user not named has
    share 1; no limit means none. `usage` (account) and `user_usage` ((account, user)): Slurm's own decayed
    GPU-seconds as sshare shows them (every job of the association, managed or not, decayed by
    PriorityDecayHalfLife); empty: not read (no multifactor priority, or gres/gpu not accounted)."""

    shares: Mapping[str, float] = field(default_factory=dict)
    user_shares: Mapping[tuple[str, str], float] = field(default_factory=dict)
    limits: tuple[GpuLimit, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    user_usage: Mapping[tuple[str, str], float] = field(default_factory=dict)


@dataclass(frozen=True)
class CoHold:
    """Co-held placements (issue 31): a job may park instead of stopping. A parked job keeps a shard of each
    of its GPUs and its device state in host memory, and waits in its process; up to a node's `shards` jobs
    with the same GPUs co-hold them, at most one of them computing (the one holding them in its placement).
    To every policy rule a parked job is a suspended job; only the round's last rule (`selector.cohold`)
    turns a switch within a group into a park and an unpark.

    `parked`: job id -> the GPUs it co-holds while parked. `state_bytes`: job id -> device state per GPU
    (bytes) it would keep in host memory parked (a job not named cannot park). `host_bytes`: node -> host
    memory its parked jobs may use in all."""

    parked: Mapping[str, Placement] = field(default_factory=dict)
    state_bytes: Mapping[str, int] = field(default_factory=dict)
    host_bytes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterView:
    """An immutable snapshot of the cluster and the managed jobs: the input of every policy.

    `requeue_ties`: the cluster's Slurm ties a requeued job to its last GPUs' indices (`Job.requeue_indices`;
    Slurm 21.08.0-23.02.1, e.g. Debian 12's 22.05). Where it does not, placement ignores those indices
    (it still prefers a job's own GPUs among equally good ones). `packing`: the cluster can put jobs on
    shards of a GPU and move them back to whole GPUs (Slurm 23.11.5 on); where it cannot, no policy packs.
    `group_caps`: group (`JobSpec.group`) -> the most jobs of that group that may run at once (a job
    array's %MAX throttle); a group not named here is not capped. Every policy keeps within it: a
    time-slicing one rotates a group's jobs through its places. `same_gpus_per_node`: a job placed across
    nodes gets the same GPU indices on every node, as many on each (Slurm's gres request is per node);
    placements across nodes are then only such even spans (the simulator may place freely). `tenants`: the
    accounts' shares and GPU limits from Slurm's accounting (None: not read; the fair-share layer then
    uses its own configured shares). `co_hold`: co-held placements are allowed (`CoHold`); None, the live
    controller's view until it can carry out a park, leaves every plan as it was. `tenant_caps`: tenant
    (account, user) -> the GPUs the fair-share layer lets it hold this round; an elastic policy hands spare
    GPUs to a tenant at its cap only when no tenant below its own can use them (empty: no tenants' caps).
    """

    topology: Topology
    jobs: tuple[Job, ...]
    now: float = 0.0
    requeue_ties: bool = True
    packing: bool = True
    group_caps: Mapping[str, int] = field(default_factory=dict)
    same_gpus_per_node: bool = False
    tenants: Tenants | None = None
    co_hold: CoHold | None = None
    tenant_caps: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def group_cap(self, job: Job) -> int | None:
        """The most jobs of `job`'s group that may run at once (None: no cap)."""
        group = job.spec.group
        return None if group is None else self.group_caps.get(group)

    def group_overruns(self) -> dict[str, int]:
        """Capped groups that run more jobs than their cap -> how many they run (empty when none does)."""
        if not self.group_caps:
            return {}
        running: dict[str, int] = {}
        for j in self.running:
            g = j.spec.group
            if g is not None and g in self.group_caps:
                running[g] = running.get(g, 0) + 1
        return {g: n for g, n in running.items() if n > self.group_caps[g]}

    @cached_property
    def _by_id(self) -> dict[str, Job]:
        return {j.job_id: j for j in self.jobs}

    def job(self, job_id: str) -> Job:
        return self._by_id[job_id]

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    @property
    def active(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if not j.state.finished)

    @property
    def running(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.RUNNING)

    @property
    def waiting(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state.waiting)

    @cached_property
    def usage(self) -> dict[GpuRef, tuple[int, int]]:
        """GPU -> (jobs holding it whole, jobs holding a shard of it), over running jobs."""
        use: dict[GpuRef, list[int]] = {}
        for j in self.running:
            assert j.placement is not None
            for g in j.placement.gpus:
                u = use.setdefault(g, [0, 0])
                u[1 if j.placement.shared else 0] += 1
        return {g: (u[0], u[1]) for g, u in use.items()}

    def free_gpus(self) -> tuple[GpuRef, ...]:
        """GPUs on up nodes that no running job holds, whole or shared."""
        return self._free_gpus

    @cached_property
    def _free_gpus(self) -> tuple[GpuRef, ...]:
        usage = self.usage
        return tuple(g for g in self.topology.all_gpus() if g not in usage)

    def consistency_errors(self) -> list[str]:
        """Why this view is impossible (empty when it is fine): double bookings, bad nodes, bad counts."""
        errs: list[str] = []
        for g, (whole, shards) in self.usage.items():
            if not self.topology.has_gpu(g):
                errs.append(f"{g} does not exist")
                continue
            node = self.topology.node(g.node)
            if not node.up:
                errs.append(f"{g} is on down node {g.node}")
            if whole > 1:
                errs.append(f"{g} booked whole by {whole} jobs")
            if whole and shards:
                errs.append(f"{g} booked both whole and as shards")
            if shards > node.shards:
                errs.append(f"{g} has {shards} shard holders, more than {node.shards}")
        for j in self.jobs:
            if j.state is JobState.RUNNING:
                if j.placement is None:
                    errs.append(f"job {j.job_id} running without GPUs")
                elif not j.spec.min_gpus <= j.placement.count <= j.spec.max_gpus:
                    errs.append(f"job {j.job_id} holds {j.placement.count} GPUs outside its range")
            elif j.placement is not None:
                errs.append(f"job {j.job_id} is {j.state.value} but holds GPUs")
        return errs
