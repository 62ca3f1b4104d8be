"""The one place that talks to Slurm. `make_backend()` gives the CLI backend (squeue/sinfo --json)."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Placement
from slurm_gandiva.slurm.base import SlurmBackend


def make_backend(env: Mapping[str, str] | None = None, *, timeout: float = 30.0) -> SlurmBackend:
    """A CLI backend; `env` (e.g. {"SLURM_CONF": ...}) is added to every Slurm command's environment."""
    from slurm_gandiva.slurm.cli_backend import CliBackend

    return CliBackend(env, timeout=timeout)


def gres_string(indices: tuple[int, ...] | list[int], *, shared: bool = False) -> str:
    """Per-GPU typed gres for GPUs on one node: (0, 2) -> "gpu:g0:1,gpu:g2:1" ("shard:..." if shared)."""
    if not indices:
        raise BadRequest("a placement needs at least one GPU")
    kind = "shard" if shared else "gpu"
    return ",".join(f"{kind}:g{k}:1" for k in sorted(set(indices)))


def placement_gres(placement: Placement) -> tuple[str, str]:
    """(nodelist, gres) for `scontrol update` / sbatch. Slurm's gres is per node, so a multi-node
    placement must use the same GPU indices on every node."""
    per_node = {placement.on_node(n) for n in placement.nodes}
    if len(per_node) != 1:
        raise BadRequest(f"placement {placement} uses different GPU indices per node: Slurm cannot express it")
    return ",".join(placement.nodes), gres_string(next(iter(per_node)), shared=placement.shared)
