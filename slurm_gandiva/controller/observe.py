"""observe: one Slurm snapshot + the store + the wrapper's progress files -> an immutable ClusterView.

`build_view` is pure (unit-tested with plain data); `Observer.observe` gathers its inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from slurm_gandiva.controller.cohold import view_placement
from slurm_gandiva.model import (
    STARTUP_GRACE_S,
    ClusterView,
    GpuRef,
    Job,
    JobSpec,
    JobState,
    Locality,
    Node,
    Placement,
    RateTable,
    Topology,
    Trial,
    TrialKind,
)
from slurm_gandiva.requeue.namespace import is_marked
from slurm_gandiva.selector.round import Claim
from slurm_gandiva.slurm.base import HoldKind, SlurmJob, SlurmNode, Snapshot
from slurm_gandiva.slurm.gres import Gres, gpu_index, parse_gres
from slurm_gandiva.store.api import JobRecord, RateRecord, SliceRecord

log = logging.getLogger(__name__)

# A measurement taken this soon after a slice started still contains start-up time; ignore it.
RATE_WARMUP_S = 2.0
# The wrapper reports progress every few seconds (5 by default); the controller carries a running job's
# last report forward at its measured rate for at most this long (a job that stops reporting stalls).
PROGRESS_CARRY_S = 30.0
# A wrapper's training start this much before the slice's recorded start still belongs to the slice (the
# slice is recorded when the controller has seen the job RUNNING; torch start-up alone takes longer).
TRAINING_START_SLACK_S = 0.5


class ProgressLike(Protocol):
    """The fields of the wrapper's progress.json that the controller reads."""

    @property
    def samples(self) -> int | float: ...

    @property
    def total_samples(self) -> int | float | None: ...

    @property
    def samples_per_s(self) -> float: ...

    @property
    def world_size(self) -> int: ...

    @property
    def updated(self) -> float: ...

    @property
    def started(self) -> float | None: ...


ProgressReader = Callable[[Path, str], "ProgressLike | None"]  # (progress.json, the job's user)


def is_managed(job: SlurmJob, partitions: Iterable[str]) -> bool:
    """A job the controller owns: marked with the gandiva comment (`gandiva` or `gandiva:<private dir>`),
    in a managed partition."""
    parts = tuple(partitions)
    if not is_marked(job.comment):
        return False
    if not parts:
        return True
    return any(p in parts for p in job.partition.split(","))


def _gpu_items(job: SlurmJob) -> list[Gres]:
    """The gpu and shard items of a job's per-node gres request."""
    return [g for g in parse_gres(job.tres_per_node) if g.name in ("gpu", "shard")]


def requested_gpu_count(job: SlurmJob) -> int:
    """How many GPUs a job asks for (typed items count once each; shards count per GPU type)."""
    items = _gpu_items(job)
    gpus = sum(g.count for g in items if g.name == "gpu")
    if gpus:
        return gpus
    return len({g.type for g in items if g.name == "shard"})


def requested_placement(job: SlurmJob) -> Placement | None:
    """The exact placement a pending job was released onto: its required nodes and typed gres `gK` (the same
    GPUs on each node), else None."""
    items = _gpu_items(job)
    if not job.nodes or not items:
        return None
    idx: list[int] = []
    shared = False
    for g in items:
        k = gpu_index(g.type)
        if k is None:
            return None
        idx.append(k)
        shared = shared or g.name == "shard"
    return Placement(tuple(GpuRef(n, i) for n in job.nodes for i in sorted(set(idx))), shared=shared)


def held_placement(job: SlurmJob) -> Placement | None:
    """The GPUs Slurm says a running job holds (whole GPUs, else shards)."""
    if job.gpus:
        return Placement(tuple(GpuRef(n, i) for n, ixs in job.gpus.items() for i in ixs))
    if job.shards:
        return Placement(tuple(GpuRef(n, i) for n, ixs in job.shards.items() for i in ixs), shared=True)
    return requested_placement(job) if job.running else None


def ever_ran(job: SlurmJob, slices: Iterable[SliceRecord]) -> bool:
    return job.restart_count > 0 or any(True for _ in slices)


def slurm_state(job: SlurmJob, slices: tuple[SliceRecord, ...]) -> JobState:
    """The policies' state of a managed job from Slurm's (finished jobs map to DONE/FAILED/CANCELLED)."""
    if job.running:
        return JobState.RUNNING
    if job.pending:
        return JobState.SUSPENDED if ever_ran(job, slices) else JobState.QUEUED
    if job.state == "COMPLETED":
        return JobState.DONE
    if job.state == "CANCELLED":
        return JobState.CANCELLED
    return JobState.FAILED


def rate_table(records: Iterable[RateRecord]) -> RateTable:
    """The latest measured rate per (GPU count, locality)."""
    table = RateTable()
    for r in sorted(records, key=lambda r: (r.at, r.id)):
        if r.rate > 0:
            table = table.with_rate(r.gpus, r.locality, r.rate)
    return table


def with_prior(table: RateTable, speedup: Mapping[int, float]) -> RateTable:
    """Fill GPU counts nothing was measured at from a scaling table's speed-up curve, anchored to what was
    measured (the table's units are another model's; only its shape is used). Unmeasured counts are
    entered at SWITCH locality, where scaling tables are measured."""
    known = table.rates
    anchors = [r / speedup[k] for (k, _loc), r in known.items() if speedup.get(k, 0) > 0 and r > 0]
    if not anchors:
        return table
    anchors.sort()
    one = anchors[len(anchors) // 2]
    counts = {k for k, _ in known}
    out = table
    for k, s in sorted(speedup.items()):
        if k not in counts and s > 0:
            out = out.with_rate(k, Locality.SWITCH, one * s)
    return out


def training_start(started: float, progress: ProgressLike | None, rates: Iterable[RateRecord], now: float) -> float:
    """When a running job's slice began for min-slice / quantum accounting: when its training began
    after `started` (its slice's start), so that start-up (5-20 s of process launch, torch import and
    checkpoint load) does not eat the policy's minimum slice; `started` while it has not reported yet.

    The wrapper's progress.json says when this incarnation began training (`started`). Reports without
    it (older wrappers) fall back to the earliest rate recorded since `started` (rates are recorded every
    introspect interval: at most that late), else the report itself while the job is not measured yet.
    Start-up counts as at most `STARTUP_GRACE_S`, so a job that never reports is still time-sliced.
    """
    began = progress.started if progress is not None else None
    firsts = [r.at for r in rates if r.at >= started]
    if began is not None and began >= started - TRAINING_START_SLACK_S:
        first = max(started, began)  # the wrapper says when this incarnation's training began
    elif firsts:
        first = min(firsts)
    elif progress is not None and progress.updated > started:
        first = progress.updated
    else:
        return started
    return max(started, min(first, started + STARTUP_GRACE_S, now))


def topology_for(
    base: Topology,
    nodes: Iterable[SlurmNode],
    foreign: Mapping[str, set[int]],
    managed_cpus: Mapping[str, int] | None = None,
    managed_memory: Mapping[str, int] | None = None,
) -> Topology:
    """The topology with Slurm's node health, minus GPUs that unmanaged jobs hold, with each node's CPUs and
    memory and what unmanaged jobs hold of them there: Slurm's allocation less `managed_cpus` /
    `managed_memory` (node -> CPUs / MB the managed running jobs hold; None: not counted, as memory where
    Slurm does not allocate it)."""
    by_name = {n.name: n for n in nodes}
    out: list[Node] = []
    for n in base.nodes:
        sn = by_name.get(n.name)
        up = n.up and (sn.up if sn is not None else False)
        taken = foreign.get(n.name, set())
        gpus = tuple(g for g in n.gpus if g.ref.index not in taken)
        cpus = cpus_taken = memory = memory_taken = 0
        if sn is not None and managed_cpus is not None:
            cpus, cpus_taken = sn.cpus, max(0, sn.alloc_cpus - managed_cpus.get(n.name, 0))
        if sn is not None and managed_memory is not None:
            memory, memory_taken = sn.memory, max(0, sn.alloc_memory - managed_memory.get(n.name, 0))
        out.append(Node(n.name, gpus, up=up, shards=n.shards, cpus=cpus, cpus_taken=cpus_taken,
                        memory_mb=memory, memory_taken_mb=memory_taken))
    return Topology(tuple(out))


def managed_cpus(inputs: Iterable[JobInputs]) -> dict[str, int]:
    """Node -> the CPUs that managed jobs Slurm runs hold there (their MinCPUsNode on each of their nodes)."""
    return _managed(inputs, lambda sj: sj.min_cpus_per_node)


def managed_memory(inputs: Iterable[JobInputs]) -> dict[str, int]:
    """Node -> the MB that managed jobs Slurm runs hold there (their memory per node on each of their nodes)."""
    return _managed(inputs, lambda sj: sj.min_memory_per_node)


def _managed(inputs: Iterable[JobInputs], per_node: Callable[[SlurmJob], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for inp in inputs:
        sj = inp.slurm
        if sj.running:
            for node in sj.nodes:
                out[node] = out.get(node, 0) + per_node(sj)
    return out


@dataclass(frozen=True)
class JobInputs:
    """Everything known about one managed job at one instant (the inputs of `job_from`)."""

    slurm: SlurmJob
    spec: JobSpec
    slices: tuple[SliceRecord, ...] = ()
    rates: tuple[RateRecord, ...] = ()
    progress: ProgressLike | None = None
    trial: Trial | None = None
    failed_trials: frozenset[TrialKind] = frozenset()
    speedup: Mapping[int, float] | None = None  # k -> T(k)/T(1) from the model's scaling table
    # Where the job is starting, its start running on from an earlier round (`Actor.starting`): Slurm shows
    # it pending until it runs, but those GPUs are its own.
    starting: Placement | None = None
    # The GPUs the job co-holds while parked (`controller.cohold`): Slurm runs it, the policies see it
    # suspended.
    parked: Placement | None = None


def job_from(inp: JobInputs, topology: Topology, now: float, max_nodes: int | None = None) -> Job:
    """The policies' Job for one managed job (pure); it may span at most `max_nodes` nodes (the
    controller's `max_nodes`; None: any)."""
    sj, slices = inp.slurm, inp.slices
    state = slurm_state(sj, slices)
    open_slice = next((s for s in slices if s.is_open), None)
    placement = None
    if state is JobState.RUNNING:
        # A job still starting has no open slice yet: where its start put it is where it runs.
        placement = view_placement(held_placement(sj), open_slice.placement if open_slice else inp.starting)
    if inp.parked is not None and state is JobState.RUNNING:
        state, placement = JobState.SUSPENDED, None
    starting = inp.starting is not None and sj.pending
    if starting:
        state, placement = JobState.RUNNING, inp.starting
    if state is JobState.RUNNING and placement is None:
        log.warning("job %s runs but Slurm reports no GPUs for it", sj.job_id)
    closed = [s for s in slices if not s.is_open]
    last = max(closed, key=lambda s: s.seq, default=None)
    attained = sum(s.elapsed(now) * s.placement.count for s in slices)
    spec = inp.spec
    prog = inp.progress
    total = spec.total_work
    if total is None and prog is not None and prog.total_samples:
        spec = replace(spec, total_work=float(prog.total_samples))
    if spec.max_nodes != max_nodes:
        spec = replace(spec, max_nodes=max_nodes)
    if spec.cpus_per_node != sj.min_cpus_per_node:
        spec = replace(spec, cpus_per_node=sj.min_cpus_per_node)
    # What Slurm holds the job to (its association and QOS, its memory), not what the spec file says.
    if (spec.account, spec.qos, spec.mem_per_node_mb) != (sj.account, sj.qos, sj.min_memory_per_node):
        spec = replace(spec, account=sj.account, qos=sj.qos, mem_per_node_mb=sj.min_memory_per_node)
    rates = rate_table(inp.rates)
    measured: float | None = None
    slice_start = open_slice.start if (open_slice and state is JobState.RUNNING) else None
    if state is JobState.RUNNING and placement is not None and prog is not None:
        started = slice_start if slice_start is not None else sj.start_time
        fresh = prog.updated >= started + RATE_WARMUP_S
        if fresh and prog.samples_per_s > 0 and prog.world_size == placement.count:
            measured = float(prog.samples_per_s)
            loc = topology.locality(placement.gpus) if all(topology.has_gpu(g) for g in placement.gpus) else (
                Locality.CROSS_NODE if len(placement.nodes) > 1 else Locality.NODE
            )
            rates = rates.with_rate(placement.count, loc, measured)
    progress = float(prog.samples) if prog is not None else 0.0
    if measured is not None and prog is not None:
        # Where the job is now, not where it was at its last report: a job seconds from the end must
        # look so to the policy (`finishing`), as it does in the simulator.
        progress += measured * min(max(0.0, now - prog.updated), PROGRESS_CARRY_S)
        if spec.total_work is not None:
            progress = min(progress, spec.total_work)
    if inp.speedup:
        rates = with_prior(rates, inp.speedup)
    if state is JobState.RUNNING:
        base = slice_start if slice_start is not None else (now if starting else (sj.start_time or now))
        slice_start = training_start(base, prog, inp.rates, now)
    return Job(
        spec=spec,
        state=state,
        placement=placement,
        progress=progress,
        attained_service=attained,
        times_scheduled=len(slices),
        first_start=min((s.start for s in slices), default=None),
        slice_start=slice_start,
        last_run_end=max((s.end for s in closed if s.end is not None), default=None),
        last_gpus=last.placement.gpus if last is not None and not last.placement.shared else (),
        rates=rates,
        trial=inp.trial if state is JobState.RUNNING else None,
        measured_rate=measured,
        failed_trials=inp.failed_trials,
    )


JobMemo = dict[str, tuple[JobInputs, Job]]  # job id -> the inputs and the Job made of them


def build_view(
    topology: Topology,
    nodes: Iterable[SlurmNode],
    inputs: Iterable[JobInputs],
    foreign: Mapping[str, set[int]],
    now: float,
    *,
    requeue_ties: bool = True,
    packing: bool = True,
    memo: JobMemo | None = None,
    max_nodes: int | None = None,
    memory: bool = False,
) -> ClusterView:
    """The ClusterView of the managed jobs that are not finished (pure). `requeue_ties` and `packing`:
    what the running Slurm does (`ClusterView`, `SlurmCapabilities`). `memo` (the caller's, kept between
    calls) remembers the Jobs of waiting jobs whose inputs did not change. `max_nodes`: the most nodes a
    job may span (the controller's config; None: any); a job across nodes gets the same GPUs on each, as
    Slurm's per-node gres gives them (`ClusterView.same_gpus_per_node`). `memory`: the nodes' memory counts
    (Slurm allocates it: `SlurmCapabilities.memory_consumable`); CPUs always count."""
    inputs = tuple(inputs)
    topo = topology_for(topology, nodes, foreign, managed_cpus(inputs), managed_memory(inputs) if memory else None)
    jobs = tuple(
        sorted(
            (j for j in (_job_from(i, topo, now, memo, max_nodes) for i in inputs) if not j.state.finished),
            key=lambda j: (j.spec.submit_time, _id_key(j.job_id)),
        )
    )
    return ClusterView(topo, jobs, now, requeue_ties=requeue_ties, packing=packing, same_gpus_per_node=True)


def _job_from(
    inp: JobInputs, topology: Topology, now: float, memo: JobMemo | None, max_nodes: int | None = None
) -> Job:
    """`job_from`, remembered for a job that neither runs nor has an open slice: its Job then depends on
    its inputs alone (not on the time or the topology), and most of 10,000 managed jobs wait."""
    if memo is None:
        return job_from(inp, topology, now, max_nodes)
    jid = inp.slurm.job_id
    hit = memo.get(jid)
    if hit is not None and hit[0] == inp and hit[1].spec.max_nodes == max_nodes:
        return hit[1]
    job = job_from(inp, topology, now, max_nodes)
    if job.state is JobState.RUNNING or any(s.is_open for s in inp.slices):
        memo.pop(jid, None)
    else:
        memo[jid] = (inp, job)
    return job


def _id_key(job_id: str) -> tuple[int, str]:
    head = job_id.split("_", 1)[0]
    return (int(head) if head.isdigit() else 0, job_id)


def foreign_gpus(jobs: Iterable[SlurmJob], partitions: Iterable[str]) -> dict[str, set[int]]:
    """GPUs (whole or shard) that running jobs the controller does not own hold, per node."""
    parts = tuple(partitions)
    out: dict[str, set[int]] = {}
    for j in jobs:
        if not j.running or is_managed(j, parts):
            continue
        for mapping in (j.gpus, j.shards):
            for node, ixs in mapping.items():
                out.setdefault(node, set()).update(ixs)
    return out


@dataclass(frozen=True)
class Observation:
    """One tick's look at the world: the view for the policy and the raw Slurm jobs behind it."""

    view: ClusterView
    snapshot: Snapshot
    managed: Mapping[str, SlurmJob] = field(default_factory=dict)  # job id -> Slurm job (not finished)
    records: Mapping[str, JobRecord] = field(default_factory=dict)
    progress: Mapping[str, ProgressLike] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)  # job id -> why its files were refused
    claims: Mapping[str, Claim] = field(default_factory=dict)  # the finishing jobs' standing claims (`ClaimJudge`)

    def needs_admin_hold(self) -> tuple[SlurmJob, ...]:
        """Managed pending jobs that only a user hold (or no hold) keeps from Slurm's own scheduling."""
        return tuple(
            j for j in self.managed.values() if j.pending and j.hold is not HoldKind.ADMIN
        )
