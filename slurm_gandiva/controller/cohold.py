"""Co-held GPUs in the live controller (issue 31): jobs that take turns on the same GPUs switch in place.

With `co_hold = yes` (and a Slurm whose held jobs switch between shards and whole GPUs), every job the
controller starts on whole GPUs of one node holds a shard of each in Slurm (`slurm_placement`), so that a
second job can hold the other shard of the same GPUs: the round's last rule (`selector.cohold.co_held`) then
turns a time-slicing switch between them into a park of one and an unpark of the other (`RequeueProtocol.park`
/ `unpark`: no Slurm call, no new process). To the policies a job computing there holds its GPUs whole (its
open slice says so: `view_placement`) and a parked job is a suspended one; `ClusterView.co_hold` tells the
last rule which jobs are parked where, what state they would keep in host memory and how much there is.

Where a job is parked lives in the store, so a controller that restarts knows it: a parked job is one that
Slurm runs, whose record is SUSPENDED without an open slice, and whose last decision is a PARK that succeeded
(`ParkedJobs`). An interrupted park or unpark is finished by the reconciler's recovery (the operations are
idempotent and ordered: an unpark's intent is recorded only once the park of the job it replaces is done), so
never two jobs compute on the GPUs and no parked job is forgotten.

Memory: a parked job keeps its device state in its own host memory, inside its --mem. A job parks only if the
device state it reported when it last parked (per node) fits half its --mem per node (the other half is what
it used before); a job that never parked may park once, which measures it, and a job that declined a park
(the wrapper does when its device state would not fit the host memory left to it) is not asked again
(`co_hold_view`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from slurm_gandiva.model import CoHold, JobState, Placement
from slurm_gandiva.plan import Action
from slurm_gandiva.slurm.base import SlurmJob, SlurmNode
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.store.api import JobRecord, Outcome, StoreApi

MB = 1 << 20
UNMEASURED = 0  # state bytes of a job that never parked: its first park measures it


def co_holdable(p: Placement, max_gpus: int) -> bool:
    """Whether a job on `p` is held as shards of its GPUs: whole GPUs of one node, at most `max_gpus` of them
    (`co_hold_gpus`; 0: co-holding is off)."""
    return not p.shared and len(p.nodes) == 1 and p.count <= max_gpus


def co_hold_gpus(on: bool, caps: SlurmCapabilities) -> int:
    """The most GPUs a co-held job may have: 0 where co-holding is off or Slurm cannot (`packing`), 1 where
    one job may not hold shards of several GPUs of a node (`shards_on_several_gpus`), else any number."""
    if not on or not caps.packing:
        return 0
    return 1 << 16 if caps.shards_on_several_gpus else 1


def slurm_placement(p: Placement, max_gpus: int) -> Placement:
    """What the protocol asks Slurm for when the policy places a job on `p`: with co-holding on, whole GPUs
    of one node are held as a shard of each (another job may then co-hold them parked)."""
    return Placement(p.gpus, shared=True) if co_holdable(p, max_gpus) else p


def same_place(recorded: Placement, held: Placement) -> bool:
    """Whether Slurm holding `held` is the job being where the store recorded it: the same placement, or the
    same GPUs held as shards by a job the policy placed on them whole (`slurm_placement`)."""
    if recorded == held:
        return True
    return held.shared and not recorded.shared and set(recorded.gpus) == set(held.gpus)


def view_placement(held: Placement | None, recorded: Placement | None) -> Placement | None:
    """A running job's placement as the policies see it: where its open slice says when Slurm holds those
    GPUs (a co-held job's shards are its whole GPUs), else Slurm's own."""
    if held is not None and recorded is not None and same_place(recorded, held):
        return recorded
    return held


@dataclass(frozen=True)
class _Seen:
    updated: float
    parked: bool


class ParkedJobs:
    """Which of the controller's running jobs are parked, from the store (see the module docstring). The
    answer for a job is remembered while its record does not change (`JobRecord.updated`)."""

    def __init__(self, store: StoreApi) -> None:
        self.store = store
        self._seen: dict[str, _Seen] = {}

    def is_parked(self, rec: JobRecord | None, sj: SlurmJob, has_open_slice: bool) -> bool:
        if rec is None or not sj.running or rec.state is not JobState.SUSPENDED or has_open_slice:
            self._seen.pop(sj.job_id, None)
            return False
        seen = self._seen.get(sj.job_id)
        if seen is not None and seen.updated == rec.updated:
            return seen.parked
        done = [d for d in self.store.decisions(job_ids=[sj.job_id]) if d.outcome is not None]
        last = max(done, key=lambda d: (d.outcome_at or 0.0, d.id), default=None)
        parked = last is not None and last.action is Action.PARK and last.outcome is Outcome.SUCCEEDED
        self._seen[sj.job_id] = _Seen(rec.updated, parked)
        return parked

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is remembered of jobs not in `keep`."""
        keep = set(keep)
        for jid in [j for j in self._seen if j not in keep]:
            del self._seen[jid]


def co_hold_view(
    running: Mapping[str, Placement],
    parked: Mapping[str, Placement],
    parked_bytes: Mapping[str, int],
    mem_per_node_mb: Mapping[str, int],
    nodes: Iterable[SlurmNode],
    max_gpus: int,
    declined: Collection[str] = (),
) -> CoHold:
    """The view's `CoHold`. `running`: computing jobs' placements as the policies see them (the jobs that may
    park); `parked`: the parked jobs' GPUs; `parked_bytes`: job -> the device state (bytes, all its ranks) it
    held when it last parked; `mem_per_node_mb`: job -> its --mem per node (0: not set); `max_gpus`: see
    `co_holdable` (a job Slurm holds whole GPUs for cannot park); `declined`: jobs that did not park when
    asked (their state did not fit their host memory, or they do not answer): the requeue path for them."""
    state: dict[str, int] = {}
    for jid, p in {**running, **parked}.items():
        if jid in declined or (jid in running and not co_holdable(p, max_gpus)):
            continue  # whole GPUs in Slurm (across nodes, or too many): it takes turns through the requeue path
        per_gpu = parked_bytes.get(jid)
        if per_gpu is None:
            state[jid] = UNMEASURED
            continue
        per_gpu = -(-per_gpu // max(1, p.count))
        mem = mem_per_node_mb.get(jid, 0) * MB
        if mem == 0 or per_gpu * p.count <= mem // 2:
            state[jid] = per_gpu
    host = {n.name: n.memory * MB for n in nodes if n.memory > 0}
    return CoHold(parked=dict(parked), state_bytes=state, host_bytes=host)
