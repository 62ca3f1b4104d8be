"""Slurm's JSON (squeue --json, sinfo --json), parsed into the project's own types (gres strings: gres.py).

The one place that knows Slurm's field names. Tolerates the data_parser versions v0.0.38 (22.05) to
v0.0.45: job_state as a string or a list, numbers as plain ints or {"set", "infinite", "number"}
objects, exit codes as raw wait statuses or {"status", "return_code", "signal"} objects, and sinfo's
flat "nodes" list (<= 23.02) or grouped "sinfo" list (>= 23.11).

Job arrays: every task is a job of its own named "ARRAY_TASK" (Slurm's notation; scontrol, scancel and
squeue accept it). A task Slurm has split off (its own record) keeps its record; the array's pending
meta record ("array_task_string" such as "1-2,4-5%2") becomes one pending job per task it still holds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from slurm_gandiva.slurm.base import HoldKind, SlurmJob, SlurmNode
from slurm_gandiva.slurm.gres import parse_gres_detail

_BASE_JOB_STATES = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "COMPLETED", "CANCELLED", "FAILED",
    "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED", "RESIZING",
    "REVOKED", "STAGE_OUT",
)
# Flags Slurm prints alone in place of a running job's state (22.05's squeue --json, scontrol): a job whose
# processes were sent SIGSTOP (a parked job, frozen: requeue/parking.py), or are being sent SIGSTOP / SIGCONT.
_RUNNING_FLAGS = ("STOPPED", "SIGNALING")
_ADMIN_HOLD_REASONS = ("JobHeldAdmin",)
_USER_HOLD_REASONS = ("JobHeldUser", "job_requeued_in_held_state", "RequeueHold")


class ParseError(ValueError):
    """Slurm printed something this module cannot read."""


def load_json(text: str, what: str) -> dict[str, Any]:
    """json.loads with a ParseError naming the command on failure."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{what} printed invalid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ParseError(f"{what} printed JSON that is not an object")
    return doc


def number(value: Any, default: int = 0) -> int:
    """An int from a plain number or a {"set": bool, "infinite": bool, "number": N} object."""
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    if isinstance(value, Mapping):
        if value.get("set") is False or value.get("infinite") is True:
            return default
        return number(value.get("number"), default)
    return default


def text(value: Any) -> str:
    """A string field; None -> ""; lists are comma-joined (newer versions list some string fields)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(text(v) for v in value)
    return str(value)


def states(value: Any) -> list[str]:
    """A state field as a list of upper-case words: "mixed" / ["MIXED", "DRAIN"] / "IDLE+DRAIN"."""
    if isinstance(value, list):
        return [str(v).upper() for v in value]
    if isinstance(value, str):
        return [s for s in re.split(r"[+ ,]", value.upper()) if s]
    return []


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """"n[1-3,5],gpu7" -> ("n1", "n2", "n3", "n5", "gpu7"). Keeps leading zeros ("n[01-02]")."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr or ""):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                width = len(lo) if lo.startswith("0") else 0
                out += [f"{prefix}{str(i).zfill(width)}" + suffix for i in range(int(lo), int(hi) + 1)]
            elif rng:
                out.append(f"{prefix}{rng}{suffix}")
    return tuple(out)


def parse_array_spec(spec: str) -> tuple[tuple[int, ...], int]:
    """An array's task list as sbatch and squeue write it -> (task ids, %MAX or 0).

    "0-11%4" -> ((0, ..., 11), 4); "[1-2,4-5%2]" -> ((1, 2, 4, 5), 2); "0-10:5" -> ((0, 5, 10), 0).
    ValueError on anything else.
    """
    body = spec.strip().removeprefix("[").removesuffix("]")
    limit = 0
    if "%" in body:
        body, _, lim = body.rpartition("%")
        if not lim.isdigit():
            raise ValueError(f"bad array throttle {lim!r}")
        limit = int(lim)
    out: set[int] = set()
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not m:
            raise ValueError(f"bad array index {part!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad array range {part!r}")
        out.update(range(lo, hi + 1, step))
    return tuple(sorted(out)), limit


def _exit_code(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "return_code" in value or "signal" in value:
            sig = value.get("signal")
            sig_id = number(sig.get("id"), 0) if isinstance(sig, Mapping) else 0
            if sig_id:
                return 128 + sig_id
            return number(value.get("return_code"), 0)
        if value.get("set") is False:
            return None
        return _exit_code(value.get("number"))
    raw = number(value, 0)
    # 22.05 reports the raw wait status: exit code in the high byte, signal in the low bits.
    if raw & 0x7F:
        return 128 + (raw & 0x7F)
    return (raw >> 8) & 0xFF


def _comment(value: Any) -> str:
    if isinstance(value, Mapping):
        return text(value.get("job"))
    return text(value)


def _base_state(value: Any) -> str:
    """The job's state in one word. COMPLETING wins, as in Slurm's own job_state_string(): 23.02 on lists
    a requeued job still being torn down as ["PENDING", "COMPLETING"] (22.05 printed "COMPLETING"); it
    holds its GPUs, and a begin time set before it has finished is overwritten when it does."""
    words = states(value)
    if "COMPLETING" in words:
        return "COMPLETING"
    for w in words:
        if w in _BASE_JOB_STATES:
            return w
    if any(w in _RUNNING_FLAGS for w in words):
        return "RUNNING"
    return words[0] if words else "UNKNOWN"


def hold_kind(state: str, reason: str, priority: int) -> HoldKind:
    """Admin hold (only root may release), user hold (the owner may), or none; pending jobs only."""
    if state != "PENDING":
        return HoldKind.NONE
    if reason in _ADMIN_HOLD_REASONS:
        return HoldKind.ADMIN
    if reason in _USER_HOLD_REASONS or priority == 0:
        return HoldKind.USER
    return HoldKind.NONE


def parse_job(raw: Mapping[str, Any]) -> SlurmJob:
    """One job object of squeue --json."""
    state = _base_state(raw.get("job_state"))
    reason = text(raw.get("state_reason")) or "None"
    priority = number(raw.get("priority"), -1)
    nodes = expand_hostlist(text(raw.get("nodes")))
    if not nodes:
        nodes = expand_hostlist(text(raw.get("required_nodes")))
    alloc_nodes = expand_hostlist(text(raw.get("nodes")))
    gpus: dict[str, tuple[int, ...]] = {}
    shards: dict[str, tuple[int, ...]] = {}
    details = raw.get("gres_detail") or []
    if isinstance(details, str):
        details = [details]
    for i, det in enumerate(details):
        if i >= len(alloc_nodes):
            break
        parsed = parse_gres_detail(text(det))
        if parsed.get("gpu"):
            gpus[alloc_nodes[i]] = parsed["gpu"]
        if parsed.get("shard"):
            shards[alloc_nodes[i]] = parsed["shard"]
    return SlurmJob(
        job_id=str(number(raw.get("job_id"), 0)),
        name=text(raw.get("name")),
        user=text(raw.get("user_name") or raw.get("user")),
        state=state,
        reason=reason,
        hold=hold_kind(state, reason, priority),
        nodes=nodes,
        gpus=gpus,
        shards=shards,
        restart_count=number(raw.get("restart_cnt"), 0),
        comment=_comment(raw.get("comment")),
        partition=text(raw.get("partition")),
        submit_time=float(number(raw.get("submit_time"), 0)),
        start_time=float(number(raw.get("start_time"), 0)),
        end_time=float(number(raw.get("end_time"), 0)),
        exit_code=_exit_code(raw.get("exit_code")) if state not in ("PENDING", "RUNNING") else None,
        tres_per_node=text(raw.get("tres_per_node")),
        work_dir=text(raw.get("current_working_directory")),
        std_out=text(raw.get("standard_output")),
        min_cpus_per_node=number(raw.get("minimum_cpus_per_node"), 0),
        min_memory_per_node=memory_per_node(raw),
        account=text(raw.get("account")),
        qos=text(raw.get("qos")),
    )


def memory_per_node(raw: Mapping[str, Any]) -> int:
    """MB a job needs on each node: its memory_per_node, else memory_per_cpu times its CPUs per node."""
    per_node = number(raw.get("memory_per_node"), 0)
    if per_node > 0:
        return per_node
    return number(raw.get("memory_per_cpu"), 0) * max(1, number(raw.get("minimum_cpus_per_node"), 0))


def array_jobs(raw: Mapping[str, Any], job: SlurmJob) -> Iterator[SlurmJob]:
    """`job` (parsed from `raw`) as the jobs it stands for: itself, or as array tasks named "ARRAY_TASK".

    A task of its own record (array_task_id set) is one job; the pending meta record of the tasks not split
    off yet is one job per task; a finished meta record that no longer says which tasks it held (all of
    them cancelled together) stands for none: those tasks are gone from the queue.
    """
    array = number(raw.get("array_job_id"), 0)
    if array <= 0:
        yield job
        return
    limit = number(raw.get("array_max_tasks"), 0)
    task = number(raw.get("array_task_id"), -1)
    if raw.get("array_task_id") is not None and task >= 0 and task != _NO_VAL:
        yield dataclasses.replace(job, job_id=f"{array}_{task}", array_id=str(array), array_max_tasks=limit)
        return
    spec = text(raw.get("array_task_string"))
    if spec.rstrip().endswith("..."):
        # Slurm's client cuts the list at SLURM_BITSTR_LEN (default 64 characters): read as it stands, the
        # tasks past the cut would look gone (and be settled as cancelled).
        raise ParseError(
            f"squeue cut job array {array}'s task list short ({spec[-24:]!r}): run it with SLURM_BITSTR_LEN=0"
        )
    try:
        tasks, spec_limit = parse_array_spec(spec)
    except ValueError:
        return
    limit = limit or spec_limit
    base = dataclasses.replace(job, array_id=str(array), array_max_tasks=limit)
    for t in tasks:
        yield _with_id(base, f"{array}_{t}")


def _with_id(job: SlurmJob, job_id: str) -> SlurmJob:
    """`job` under another id: a shallow copy, without `dataclasses.replace`'s __init__ (a 90,000-task
    array's meta record is 90,000 jobs: about 10 times faster)."""
    out = object.__new__(SlurmJob)
    out.__dict__.update(job.__dict__)  # a fresh copy of a frozen dataclass, not seen by anyone yet
    out.__dict__["job_id"] = job_id
    return out


_NO_VAL = 0xFFFFFFFE  # Slurm's NO_VAL, which some releases print for an unset task id


def parse_squeue(doc: Mapping[str, Any]) -> tuple[SlurmJob, ...]:
    """squeue --json -> jobs; array tasks as "ARRAY_TASK" (see `array_jobs`)."""
    _raise_errors(doc, "squeue")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise ParseError("squeue --json has no 'jobs' list")
    return tuple(job for j in jobs if isinstance(j, Mapping) for job in array_jobs(j, parse_job(j)))


def _node(raw: Mapping[str, Any]) -> SlurmNode:
    st = states(raw.get("state")) + [f for f in states(raw.get("state_flags")) if f]
    seen: list[str] = []
    for s in st:
        if s not in seen:
            seen.append(s)
    return SlurmNode(
        name=text(raw.get("name")),
        state="+".join(seen) or "UNKNOWN",
        partitions=tuple(text(p) for p in raw.get("partitions") or ()),
        gres=text(raw.get("gres")),
        gres_used=text(raw.get("gres_used")),
        cpus=number(raw.get("cpus"), 0),
        sockets=number(raw.get("sockets"), 0),
        memory=number(raw.get("real_memory"), 0),
        alloc_cpus=number(raw.get("alloc_cpus"), 0),
        alloc_memory=number(raw.get("alloc_memory"), 0),
    )


def _grouped_nodes(groups: Iterable[Any]) -> list[SlurmNode]:
    """sinfo >= 23.11: one entry per (partition, state, ...) group listing its node names."""
    out: dict[str, SlurmNode] = {}
    for g in groups:
        if not isinstance(g, Mapping):
            continue
        names = (g.get("nodes") or {}).get("nodes") or []
        part = text((g.get("partition") or {}).get("name"))
        node = g.get("node") or {}
        gres = g.get("gres") or {}
        cpus = g.get("cpus") or {}
        sockets = g.get("sockets") or {}
        memory = g.get("memory") or {}
        for name in names:
            prev = out.get(name)
            parts = tuple(dict.fromkeys((*(prev.partitions if prev else ()), *((part,) if part else ()))))
            out[name] = SlurmNode(
                name=text(name),
                state="+".join(states(node.get("state"))) or "UNKNOWN",
                partitions=parts,
                gres=text(gres.get("total")),
                gres_used=text(gres.get("used")),
                cpus=number(cpus.get("maximum", cpus.get("total")), 0),
                sockets=number(sockets.get("maximum"), 0),
                memory=number(memory.get("maximum"), 0),
                # A group's allocation is its nodes' sum: exact for a group of one node, else spread evenly.
                alloc_cpus=-(-number(cpus.get("allocated"), 0) // max(1, len(names))),
                alloc_memory=-(-number(memory.get("allocated"), 0) // max(1, len(names))),
            )
    return list(out.values())


def parse_sinfo(doc: Mapping[str, Any]) -> tuple[SlurmNode, ...]:
    """sinfo --json -> nodes, sorted by name."""
    _raise_errors(doc, "sinfo")
    if isinstance(doc.get("nodes"), list):
        nodes = [_node(n) for n in doc["nodes"] if isinstance(n, Mapping)]
    elif isinstance(doc.get("sinfo"), list):
        nodes = _grouped_nodes(doc["sinfo"])
    else:
        raise ParseError("sinfo --json has neither 'nodes' nor 'sinfo'")
    return tuple(sorted(nodes, key=lambda n: n.name))


class SlurmQueryError(ParseError):
    """squeue/sinfo --json exited 0 but reported errors instead of data (22.05 does this when it
    cannot reach slurmctld: an empty job list that must never be taken for "no jobs")."""


def _raise_errors(doc: Mapping[str, Any], what: str) -> None:
    msgs = []
    for e in doc.get("errors") or []:
        if isinstance(e, Mapping):
            parts = [text(e.get(k)) for k in ("description", "error", "source") if e.get(k)]
            msgs.append(" / ".join(parts))
        else:
            msgs.append(text(e))
    msgs = [m for m in msgs if m]
    if msgs:
        raise SlurmQueryError(f"{what} --json reported: {'; '.join(msgs)}")
