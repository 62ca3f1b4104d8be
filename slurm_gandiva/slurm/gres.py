"""Slurm's gres and TRES strings: the one place that reads and writes them.

Every form Slurm takes or prints is a comma-separated list of items `[gres:|gres/]NAME[:TYPE][:COUNT][(DETAIL)]`:
a request as given to sbatch / scontrol ("gpu:g0:1,shard:g2:1"), a job's tres_per_node as 22.05 prints it
("gres:gpu:g0:1") and 24.11 ("gres/gpu:g0:1"), untyped ("gpu:2"), a node's configured gres ("gpu:4(S:0-1)"),
its gres_used and a job's gres_detail ("gpu:2(IDX:0-1)", "shard:g2:1(1/2)"), and TRES ("cpu=4,gres/gpu=2",
"gres/gpu:a100=1": only the gres/ items are gres). Type "(null)" reads as untyped, a missing count as 1.

The project's own layout gives each GPU K of a node its own type gK (see topology/gresconf.py), so a typed
request names exact GPUs: `typed_gres`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Placement

_ITEM = re.compile(
    r"(?:gres/|gres:)?(?P<name>[A-Za-z_]+)"
    r"(?::(?P<type>\(null\)|[^:(,=]+))?"
    r"(?:(?P<sep>[:=])(?P<count>\d+))?"
    r"(?:\((?P<detail>[^)]*)\))?"
)
_GPU_TYPE = re.compile(r"g(\d+)")
_IDX = re.compile(r"IDX:([^)]*)")


@dataclass(frozen=True)
class Gres:
    """One item of a gres string."""

    name: str  # "gpu", "shard", ...
    type: str = ""  # "" untyped
    count: int = 1
    detail: str = ""  # what Slurm prints in parentheses: "IDX:0-1", "S:0-1", "1/2"


def parse_gres(spec: str) -> tuple[Gres, ...]:
    """Every item of a gres (or TRES) string, in order; items that are not gres are skipped."""
    out: list[Gres] = []
    for raw in _split_top(spec or ""):
        item = raw.strip()
        m = _ITEM.fullmatch(item)
        if not m:
            continue
        typ, count_s = m.group("type"), m.group("count")
        if m.group("sep") == "=" and not item.startswith("gres/"):
            continue  # a TRES item that is not gres: cpu=4, node=1, billing=4
        if typ is not None and count_s is None and typ.isdigit():
            typ, count_s = None, typ  # "gpu:2(IDX:0-1)": the second field is the count
        out.append(Gres(m.group("name"), "" if typ in (None, "(null)") else typ, int(count_s or 1),
                        m.group("detail") or ""))
    return tuple(out)


def write_gres(items: Iterable[Gres], *, prefix: str = "", tres: bool = False) -> str:
    """The string of `items`: "gpu:g0:1,shard:g2:1(1/2)"; `prefix` "gres/" or "gres:" as Slurm prints a job's
    tres_per_node; `tres`: TRES form ("gres/gpu:g0=1", no detail). The one builder of gres strings."""
    out = []
    for g in items:
        head = f"{'gres/' if tres else prefix}{g.name}" + (f":{g.type}" if g.type else "")
        if tres:
            out.append(f"{head}={g.count}")
        else:
            out.append(f"{head}:{g.count}" + (f"({g.detail})" if g.detail else ""))
    return ",".join(out)


def gpu_index(typ: str) -> int | None:
    """The GPU a per-GPU type names: "g3" -> 3; None for any other type."""
    m = _GPU_TYPE.fullmatch(typ)
    return int(m.group(1)) if m else None


def typed_gres(indices: Sequence[int], *, shared: bool = False) -> str:
    """Per-GPU typed gres for GPUs on one node: (0, 2) -> "gpu:g0:1,gpu:g2:1" ("shard:..." if shared)."""
    if not indices:
        raise BadRequest("a placement needs at least one GPU")
    kind = "shard" if shared else "gpu"
    return write_gres(Gres(kind, f"g{k}", 1) for k in sorted(set(indices)))


def placement_gres(placement: Placement) -> tuple[str, str]:
    """(nodelist, gres) for `scontrol update` / sbatch. Slurm's gres is per node, so a multi-node
    placement must use the same GPU indices on every node."""
    per_node = {placement.on_node(n) for n in placement.nodes}
    if len(per_node) != 1:
        raise BadRequest(f"placement {placement} uses different GPU indices per node: Slurm cannot express it")
    return ",".join(placement.nodes), typed_gres(next(iter(per_node)), shared=placement.shared)


def requested_gres(spec: str) -> frozenset[tuple[str, str]]:
    """The (name, type) pairs a gres request asks for with a count > 0 (untyped: type "")."""
    return frozenset((g.name, g.type) for g in parse_gres(spec) if g.count > 0)


def typed_indices(spec: str) -> set[int]:
    """GPU indices named by a request's per-GPU typed items with a count > 0 (gpu:gK:n or shard:gK:n)."""
    return {k for g in parse_gres(spec) if g.count > 0 and (k := gpu_index(g.type)) is not None}


def node_gpus(gres: str) -> tuple[int, ...]:
    """GPU indices in a node's configured gres (the project's one-type-per-GPU form gpu:gK:1)."""
    return tuple(sorted({k for g in parse_gres(gres) if g.name == "gpu" and (k := gpu_index(g.type)) is not None}))


def gres_gpu_count(gres: str) -> int:
    """GPUs in a configured gres string, e.g. "gpu:g0:1,gpu:g1:1,shard:g0:2" -> 2, "gpu:4(S:0-1)" -> 4."""
    return sum(g.count for g in parse_gres(gres) if g.name == "gpu")


def tres_gpus(tres: str) -> int | None:
    """The untyped GPU count of a TRES limit, e.g. "cpu=8,gres/gpu=2" -> 2 (sacctmgr's GrpTRES); None
    when it names none (a typed `gres/gpu:a100=N` alone limits that type only: not counted here)."""
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if key == "gres/gpu" and value.strip().isdigit():
            return int(value)
    return None


def parse_index_spec(spec: str) -> tuple[int, ...]:
    """"0-1,3" -> (0, 1, 3); "" / "N/A" -> ()."""
    spec = spec.strip()
    if not spec or spec.upper() == "N/A":
        return ()
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += range(int(lo), int(hi) + 1)
        else:
            out.append(int(part))
    return tuple(sorted(set(out)))


def parse_gres_detail(detail: str) -> dict[str, tuple[int, ...]]:
    """One node's gres_detail, e.g. "gpu:g1:1(IDX:1),shard:g2:1(IDX:2)" -> {"gpu": (1,), "shard": (2,)}.

    Where IDX is missing but the type is one of ours ("gK"), the type gives the index (count > 0 only).
    """
    out: dict[str, set[int]] = {}
    for g in parse_gres(detail):
        if g.count == 0:
            continue
        idx: tuple[int, ...] = ()
        im = _IDX.search(g.detail)
        if im:
            try:
                idx = parse_index_spec(im.group(1))
            except ValueError:
                idx = ()
        if not idx and (k := gpu_index(g.type)) is not None:
            idx = (k,)
        if idx:
            out.setdefault(g.name, set()).update(idx)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _split_top(s: str) -> list[str]:
    """Split on commas outside parentheses ("gpu:2(IDX:0,2),shard:..." keeps IDX:0,2 together)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p for p in parts if p.strip()]
