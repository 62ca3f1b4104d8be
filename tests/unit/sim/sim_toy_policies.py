"""Tiny policies for the engine's unit tests only (the real ones live in slurm_gandiva.selector)."""

from __future__ import annotations

from slurm_gandiva.model import ClusterView, JobState, Placement
from slurm_gandiva.plan import Plan


class ToyFifo:
    """Start waiting jobs in arrival order on the first free GPUs, never preempt; head-of-line blocking."""

    name = "toy-fifo"
    quantum: float | None = None
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        free = list(view.free_gpus())
        targets: dict[str, Placement | None] = {}
        for job in sorted(view.waiting, key=lambda j: (j.spec.submit_time, j.job_id)):
            k = job.spec.min_gpus
            if k > len(free):
                break
            targets[job.job_id] = Placement(tuple(free[:k]))
            free = free[k:]
        return Plan.from_targets(view, targets)


class ToyRoundRobin:
    """Time-slice one-GPU jobs: every quantum, the running jobs go to the back of the line."""

    name = "toy-rr"
    elastic = False

    def __init__(self, quantum: float = 60.0) -> None:
        self.quantum = quantum

    def decide(self, view: ClusterView, now: float) -> Plan:
        gpus = list(view.topology.all_gpus())
        expired = [j for j in view.running if j.slice_start is not None and now - j.slice_start >= self.quantum - 1e-9]
        keep = [j for j in view.running if j not in expired]
        line = sorted(view.waiting, key=lambda j: (j.last_run_end or j.spec.submit_time, j.job_id))
        line += sorted(expired, key=lambda j: j.job_id)
        slots = len(gpus) - len(keep)
        chosen = line[:slots]
        targets: dict[str, Placement | None] = {j.job_id: None for j in expired}
        held = {g for j in keep if j.placement for g in j.placement.gpus}
        free = [g for g in gpus if g not in held]
        for j in chosen:
            if j.state is JobState.RUNNING and j.placement is not None:
                targets[j.job_id] = j.placement
                free = [g for g in free if g not in j.placement.gpus]
        for j in chosen:
            if j.state is not JobState.RUNNING:
                targets[j.job_id] = Placement((free.pop(0),))
        return Plan.from_targets(view, targets)


class ToyPackAll:
    """Pack every waiting one-GPU job onto shards of GPU n1:0 (for the interference test)."""

    name = "toy-pack"
    quantum: float | None = None
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        gpu = view.topology.all_gpus()[0]
        taken = view.usage.get(gpu, (0, 0))[1]
        targets: dict[str, Placement | None] = {}
        for job in view.waiting[: max(0, 2 - taken)]:
            targets[job.job_id] = Placement((gpu,), shared=True)
        return Plan.from_targets(view, targets)


class ToyDoubleBook:
    """Broken on purpose: puts every waiting job on GPU n1:0."""

    name = "toy-double"
    quantum: float | None = None
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        gpu = view.topology.all_gpus()[0]
        return Plan.from_targets(view, {j.job_id: Placement((gpu,)) for j in view.waiting})


class ToyGrowShrink:
    """Elastic toy: run the oldest job alone on all GPUs it may use, growing it as others finish."""

    name = "toy-grow"
    quantum: float | None = None
    elastic = True

    def decide(self, view: ClusterView, now: float) -> Plan:
        gpus = list(view.topology.all_gpus())
        active = sorted(view.active, key=lambda j: (j.spec.submit_time, j.job_id))
        if not active:
            return Plan()
        head = active[0]
        targets: dict[str, Placement | None] = {j.job_id: None for j in active[1:] if j.state is JobState.RUNNING}
        targets[head.job_id] = Placement(tuple(gpus[: head.spec.max_gpus]))
        return Plan.from_targets(view, targets)
