"""Where a requeued job goes: the per-GPU typed gres and node fields that put it on a placement, what Slurm
cannot do to a job's gres (`plan_gres`), and the choice of free GPUs for `gandiva resize`."""

from __future__ import annotations

import enum

from slurm_gandiva.errors import BadRequest, ProtocolError
from slurm_gandiva.model import Placement
from slurm_gandiva.slurm.base import SlurmJob
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.slurm.gres import parse_gres, typed_gres, typed_indices


class GresKind(enum.Enum):
    """What a job's GPU request is made of (Slurm 22.05 cannot switch a job between gpu and shard)."""

    NONE = "none"  # no GPU request yet: the first placement fixes the kind
    GPU = "gpu"  # typed whole GPUs, gpu:gK:1
    UNTYPED = "untyped"  # gpu:N, as submitted: replaced by typed gres at the first placement
    SHARD = "shard"  # shard:gK:n


def gres_kind(tres_per_node: str) -> GresKind:
    """The kind of a job's GPU request, from Slurm's TresPerNode (e.g. "gres:gpu:g0:1,gres:gpu:g2:1")."""
    items = [g for g in parse_gres(tres_per_node) if g.count > 0]
    if any(g.name == "shard" for g in items):
        return GresKind.SHARD
    gpu = [g for g in items if g.name == "gpu"]
    if not gpu:
        return GresKind.NONE
    return GresKind.GPU if all(g.type for g in gpu) else GresKind.UNTYPED


def gres_for(placement: Placement) -> str:
    """Per-GPU typed gres for a placement, per node (the same GPUs on each of its nodes: `_check_placement`):
    gpu:g0:1,gpu:g2:1 (whole) or shard:g0:1,... (shared)."""
    return typed_gres(placement.on_node(placement.nodes[0]), shared=placement.shared)


def node_fields(placement: Placement, job: SlurmJob) -> dict[str, str]:
    """The scontrol update fields that put a held job on the placement's nodes: its node list, and as many
    nodes and tasks (the wrapper starts one launcher per node) as it spans. The node count is given as a
    range N-N: Slurm 22.05 refuses a bare N for a pending job ("Node count specification invalid"). The
    job's own MinCPUsNode is stated again: 22.05 keeps the CPU total of a larger node count when the count
    shrinks (the job then never runs: BadConstraints), and restating it makes Slurm count them anew."""
    count = len(placement.nodes)
    fields = {"nodelist": ",".join(placement.nodes), "numnodes": f"{count}-{count}", "numtasks": str(count)}
    if job.min_cpus_per_node > 0:
        fields["mincpusnode"] = str(job.min_cpus_per_node)
    return fields


def plan_gres(job: SlurmJob, placement: Placement, caps: SlurmCapabilities) -> str:
    """The per-GPU typed gres that gives `job` exactly `placement`; ProtocolError where Slurm cannot.

    The backend replaces a job's request (where Slurm would merge an update into the old request, the CLI
    backend clears it first). Where Slurm cannot switch a held job between gpu and shard
    (`caps.gres_kind_switch` false: 22.05), shards cannot be replaced either (clearing them crashes
    slurmctld): a job booked on shards keeps them and may only add more, a job booked on whole GPUs is never
    packed; jobs submitted without --gres can start either way. Elsewhere any placement goes.
    """
    if caps.gres_kind_switch:
        return gres_for(placement)
    kind = gres_kind(job.tres_per_node)
    if kind is GresKind.SHARD:
        if not placement.shared:
            raise ProtocolError(gres_refusal(job.job_id, kind, placement))
        before = typed_indices(job.tres_per_node)
        want = set(placement.on_node(placement.nodes[0]))
        if not before <= want:
            raise ProtocolError(
                f"job {job.job_id} holds shards of GPUs {sorted(before)}: Slurm {caps.release_text} cannot take "
                "shards away "
                f"from a job, so it cannot move to {placement}; pick GPUs that include {sorted(before)}"
            )
    elif kind is not GresKind.NONE and placement.shared:
        raise ProtocolError(gres_refusal(job.job_id, kind, placement))
    return gres_for(placement)


def gres_refusal(job_id: str, kind: GresKind, placement: Placement, why: str = "") -> str:
    want = "shards" if placement.shared else "whole GPUs"
    if kind is GresKind.SHARD:
        hint = "it is booked on shards, and Slurm cannot switch a job between shards and whole GPUs"
    elif placement.shared:
        hint = "it is booked on whole GPUs, and Slurm cannot switch a job to shards; submit it without --gres"
    else:
        hint = "check the node's gres.conf"
    return f"cannot give job {job_id} {want}{f' ({why})' if why else ''}: {hint}; the job stays as it is"


def check_placement(placement: Placement) -> None:
    if not placement.gpus:
        raise BadRequest("a placement needs at least one GPU")
    if len(placement.nodes) > 1:
        if len({placement.on_node(n) for n in placement.nodes}) != 1:
            raise BadRequest(f"placement {placement} has different GPUs on its nodes: Slurm gives a job the same "
                             "GPUs on every node (per-node gres); use the same GPU indices on each")
        if placement.shared:
            raise BadRequest(f"placement {placement}: a job across nodes runs on whole GPUs, not shards")


def busy_gpus(jobs: tuple[SlurmJob, ...], node: str, *, exclude: str = "") -> set[int]:
    """GPU indices on `node` that running jobs other than `exclude` hold, whole or as shards."""
    busy: set[int] = set()
    for j in jobs:
        if j.job_id == exclude or not j.running:
            continue
        busy.update(j.gpus.get(node, ()))
        busy.update(j.shards.get(node, ()))
    return busy


def choose_gpus(
    node_gpus: tuple[int, ...], busy: set[int], count: int, prefer: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """`count` free GPUs: the preferred (a job's current) ones first, then the lowest indices."""
    free = [g for g in node_gpus if g not in busy]
    ordered = [g for g in prefer if g in free] + [g for g in free if g not in prefer]
    if len(ordered) < count:
        raise BadRequest(f"only {len(free)} free GPUs ({free}) for {count} requested: pick another node")
    return tuple(sorted(ordered[:count]))
