"""`scontrol show job -d -o` records in the shape of squeue --json's, for releases whose squeue --json ignores
`--jobs` (22.05: it prints every job, 6 s and 77 MB at 10,000 jobs, where `scontrol show job ID` takes 10 ms).

One record a line, `Key=Value` words. Some values are the job owner's free text (JobName, Comment, WorkDir, the
output paths) and may hold spaces and `Key=Value`-looking words of their own: a word that does not start a
key scontrol prints continues the value before it, and a key printed twice (or a node detail outside its
place) refuses the whole record. So a job name such as "x JobState=COMPLETED" cannot pass for the job's state,
and one job's odd name affects that job's read alone. `standard_output` is the expanded path (".../123.out"
where squeue prints ".../%j.out"), as pyslurm gives it; the project reads neither.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from slurm_gandiva.slurm.parse import ParseError, expand_hostlist, number

# The keys whose words the record is split at: every key scontrol prints for a job (22.05 to 26.05), so that
# none is taken for part of a value. Unknown keys are never split at: their words join the value before.
_KEYS = frozenset(
    re.findall(
        r"\S+",
        """JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet JobName UserId GroupId
    MCS_label Priority Nice Account QOS WCKey JobState Reason Dependency Requeue Restarts BatchFlag Reboot
    ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime AccrueTime StartTime EndTime
    Deadline PreemptEligibleTime PreemptTime SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition
    AllocNode:Sid ReqNodeList ExcNodeList NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task
    ReqB:S:C:T TRES Socks/Node NtasksPerN:B:S:C CoreSpec JOB_GRES Nodes CPU_IDs Mem GRES MinCPUsNode
    MinMemoryNode MinMemoryCPU MinTmpDiskNode Features DelayBoot OverSubscribe Contiguous Licenses Network
    Command WorkDir Comment AdminComment SystemComment StdErr StdIn StdOut Power TresPerNode TresPerJob
    TresPerTask TresPerSocket TresBind TresFreq CpusPerTres MemPerTres Reservation Prefer MailUser MailType
    NtasksPerTRES CPUs_Per_Tres Container ContainerID Comment2 Extra ResvPort SegmentSize SLUID AllocTRES
    BatchFeatures BurstBuffer BurstBufferState CPUFreqReq ClusterFeatures CompletingTime ConsolidateSegments
    CronJob CrontabSpec ExpeditedRequeue FailedNode FedActiveSiblings FedOrigin GresAllowTaskSharing
    GresEnforceBind GresOneTaskPerSharing KillOnInvalidDependent Memory OOMKillStep ReqTRES ResizeTime ResvPorts
    SELinuxContext SpreadJob SpreadSegments SrunHost:Pid StepMgrEnabled SubmitLine Switches ThreadSpec
    TresPerStep""",
    )
)
# Printed once per node of the allocation, between JOB_GRES and MinCPUsNode.
_PER_NODE = frozenset({"Nodes", "CPU_IDs", "Mem", "GRES"})
_REQUIRED = ("JobId", "JobName", "UserId", "Priority", "JobState", "Reason", "Restarts", "NodeList")
# The keys read here, in the order scontrol prints them (those it prints at all). A key found out of this order
# came from a free-text value: a JobName "x JOB_GRES=gpu Nodes=n1 GRES=gpu:g0:1(IDX:0)" would come before
# UserId, a Comment "ArrayJobId=5" after JobName.
_ORDER = {
    k: i
    for i, k in enumerate(
        re.findall(
            r"\S+",
            """JobId ArrayJobId ArrayTaskId ArrayTaskThrottle JobName UserId Priority Account QOS JobState Reason
        Restarts ExitCode SubmitTime StartTime EndTime Partition ReqNodeList NodeList JOB_GRES MinCPUsNode
        MinMemoryNode MinMemoryCPU WorkDir
        Comment StdOut TresPerNode""",
        )
    )
}
# A reason as job_reason_string() names it ("JobHeldAdmin", "None"), not a description.
_REASON = re.compile(r"[A-Z][A-Za-z0-9]*")
_KEY_WORD = re.compile(r"([A-Za-z_][A-Za-z0-9_/:]*)=(.*)", re.S)


def _words(line: str) -> Iterator[tuple[str, str]]:
    """(key, value) pairs of one record line; a value runs on over the words that start no known key."""
    key: str | None = None
    value: list[str] = []
    for word in line.split(" "):
        m = _KEY_WORD.fullmatch(word)
        if m and m.group(1) in _KEYS:
            if key is not None:
                yield key, " ".join(value).strip()
            key, value = m.group(1), [m.group(2)]
        elif key is not None:
            value.append(word)
        elif word.strip():
            raise ParseError(f"scontrol show job printed {word[:40]!r} before any key")
    if key is not None:
        yield key, " ".join(value).strip()


def _plain(value: str) -> str:
    return "" if value in ("(null)", "N/A", "None") else value


def _epoch(value: str) -> int:
    """scontrol's local time "2026-11-26T14:33:01" -> Unix seconds; "Unknown" / "None" / "N/A" -> 0. (A job
    without a time limit that runs has EndTime=Unknown, where squeue --json gives a date; the project reads a
    job's end only once it has stopped.)"""
    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0


def _int(value: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"scontrol show job printed {key}={value[:40]!r}, not a number") from None


def record(line: str) -> dict[str, Any]:
    """One `scontrol show job -d -o` line -> a squeue --json job record (the fields parse.parse_job reads)."""
    single: dict[str, str] = {}
    per_node: list[tuple[str, str]] = []  # (Nodes hostlist, GRES) in print order
    zone = "before"  # JOB_GRES opens the per-node details, MinCPUsNode closes them
    last = -1
    for key, value in _words(line):
        if key in _PER_NODE:
            if zone != "nodes":
                raise ParseError(f"scontrol show job printed {key}= outside the node details")
            if key == "Nodes":
                per_node.append((value, ""))
            elif key == "GRES" and per_node:
                per_node[-1] = (per_node[-1][0], value)
            continue
        if key in single:
            raise ParseError(f"scontrol show job printed {key}= twice for one job")
        rank = _ORDER.get(key)
        if rank is not None:
            if rank < last:
                raise ParseError(f"scontrol show job printed {key}= out of its place (in a free-text value?)")
            last = rank
        single[key] = value
        if key == "JOB_GRES":
            zone = "nodes"
        elif key == "MinCPUsNode":
            zone = "after"
    missing = [k for k in _REQUIRED if k not in single]
    if missing:
        raise ParseError(f"scontrol show job printed no {', '.join(missing)}")
    if not _REASON.fullmatch(single["Reason"]):
        # scontrol prints the description slurmctld set in place of the reason ("job_requeued_in_held_state"
        # stays when `scontrol hold` makes a requeue-held job's JobHeldUser a JobHeldAdmin): the hold's kind
        # cannot be told from it.
        raise ParseError(f"scontrol show job printed a description, not a reason: {single['Reason'][:40]!r}")
    nodes = expand_hostlist(_plain(single["NodeList"]))
    gres_of: dict[str, str] = {}
    for hosts, gres in per_node:
        for host in expand_hostlist(hosts):
            gres_of[host] = _plain(gres)
    task = single.get("ArrayTaskId", "")
    code, _, sig = single.get("ExitCode", "0:0").partition(":")
    user = single["UserId"]
    return {
        "job_id": _int(single["JobId"], "JobId"),
        "array_job_id": _int(single["ArrayJobId"], "ArrayJobId") if "ArrayJobId" in single else 0,
        "array_task_id": int(task) if task.isdigit() else None,
        "array_task_string": "" if task.isdigit() else task,
        "array_max_tasks": number(single.get("ArrayTaskThrottle"), 0),
        "name": single["JobName"],
        "user_name": user.split("(", 1)[0],
        "job_state": single["JobState"],
        "state_reason": single["Reason"],
        "priority": _int(single["Priority"], "Priority"),
        "nodes": ",".join(nodes),
        "required_nodes": _plain(single.get("ReqNodeList", "")),
        "gres_detail": [gres_of.get(n, "") for n in nodes] if gres_of else [],
        "restart_cnt": _int(single["Restarts"], "Restarts"),
        "comment": _plain(single.get("Comment", "")),
        "partition": _plain(single.get("Partition", "")),
        "submit_time": _epoch(single.get("SubmitTime", "")),
        "start_time": _epoch(single.get("StartTime", "")),
        "end_time": _epoch(single.get("EndTime", "")),
        # squeue --json of 22.05 gives the raw wait status: exit code in the high byte, signal in the low bits.
        "exit_code": (int(code) << 8 | int(sig)) if code.isdigit() and sig.isdigit() else 0,
        "tres_per_node": _plain(single.get("TresPerNode", "")),
        "current_working_directory": _plain(single.get("WorkDir", "")),
        "standard_output": _plain(single.get("StdOut", "")),
        "minimum_cpus_per_node": number(single.get("MinCPUsNode"), 0),
        "memory_per_node": _megabytes(single.get("MinMemoryNode", "")),
        "memory_per_cpu": _megabytes(single.get("MinMemoryCPU", "")),
        "account": _plain(single.get("Account", "")),
        "qos": _plain(single.get("QOS", "")),
    }


_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _megabytes(value: str) -> int:
    """scontrol's "1000M" / "4G" / "0" as MB (0 when absent or unreadable)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", value.strip())
    return int(float(m.group(1)) * _UNITS[m.group(2) or "M"]) if m else 0


def records(out: str) -> dict[str, Mapping[str, Any]]:
    """Every record of `scontrol show job -d -o` output by job id; a line that cannot be read raises
    ParseError (the caller refuses that read alone)."""
    found: dict[str, Mapping[str, Any]] = {}
    for line in out.splitlines():
        if line.strip():
            rec = record(line)
            found[str(rec["job_id"])] = rec
    return found
