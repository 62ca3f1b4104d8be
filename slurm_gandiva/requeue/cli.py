"""Admin commands over the requeue protocol: `gandiva suspend|resume|migrate|resize`.

Like scontrol, these act on any user's job and so must run as root or the SlurmUser.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from slurm_gandiva.errors import BadRequest, PermissionDenied, SlurmError

if TYPE_CHECKING:
    from slurm_gandiva.model import Placement
    from slurm_gandiva.requeue.operations import OpResult
    from slurm_gandiva.requeue.protocol import RequeueProtocol
    from slurm_gandiva.slurm.base import SlurmBackend

JOBS_ROOT_ENV = "GANDIVA_JOBS_ROOT"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add suspend, resume, migrate and resize to the `gandiva` parser."""
    p = sub.add_parser("suspend", help="stop a job at a mini-batch boundary into an admin-held requeue")
    _common(p)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait before forcing (default 120)")
    p.set_defaults(func=_suspend)

    for name, helptext in (
        ("resume", "start or resume a held job on exactly these GPUs"),
        ("migrate", "suspend a job and resume it on these GPUs (same count)"),
    ):
        p = sub.add_parser(name, help=helptext)
        _common(p)
        p.add_argument("--node", required=True, help="node name, e.g. n2; n1,n2 for the same GPUs on each")
        p.add_argument("--gpus", required=True, type=_gpu_list, help="GPU indices on the node, e.g. 0,2")
        p.add_argument("--shared", action="store_true", help="take one shard of each GPU (packing)")
        p.add_argument("--timeout", type=float, default=120.0, help="suspend timeout in seconds (default 120)")
        p.set_defaults(func=_resume if name == "resume" else _migrate)

    p = sub.add_parser("resize", help="suspend a job and resume it on another GPU count")
    _common(p)
    p.add_argument("--gpus", required=True, type=_positive, help="the new GPU count")
    p.add_argument("--node", help="node to run on (default: the job's current node)")
    p.add_argument("--shared", action="store_true", help="take one shard of each GPU (packing)")
    p.add_argument("--timeout", type=float, default=120.0, help="suspend timeout in seconds (default 120)")
    p.set_defaults(func=_resize)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="Slurm job id")
    p.add_argument(
        "--jobs-root",
        default=os.environ.get(JOBS_ROOT_ENV),
        help=f"directory of the per-job state dirs, to check the wrapper's status (default ${JOBS_ROOT_ENV})",
    )
    p.add_argument("--signal", default="USR2",
                   help="signal that asks the wrapper to stop (default USR2; the job's own --signal)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="seconds to wait for RUNNING (default 60)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give GPU indices like 0,2") from None
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct GPU indices like 0,2")
    return gpus


def _signal(text: str) -> str:
    """The signal name Slurm takes; BadRequest (one line) for one a job cannot be suspended with."""
    from slurm_gandiva.requeue.contract import suspend_signal

    try:
        return suspend_signal(text).name.removeprefix("SIG")
    except ValueError as exc:
        raise BadRequest(f"--signal {text}: {exc}") from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a GPU count of at least 1")
    return n


def _protocol(args: argparse.Namespace) -> RequeueProtocol:
    from slurm_gandiva.requeue.protocol import RequeueProtocol
    from slurm_gandiva.slurm import make_backend

    sig = _signal(args.signal)
    return RequeueProtocol(
        make_backend(dict(os.environ)),
        signal_name=sig,
        suspend_timeout=args.timeout,
        start_timeout=args.start_timeout,
        jobs_root=args.jobs_root,
    )


def _placement(node: str, gpus: tuple[int, ...], shared: bool) -> Placement:
    """GPUs `gpus` of `node`; of each node for a comma-separated list (a job across nodes has the same GPUs
    on every node)."""
    from slurm_gandiva.model import GpuRef, Placement

    nodes = [n for n in node.split(",") if n]
    return Placement(tuple(GpuRef(n, g) for n in nodes for g in gpus), shared=shared)


def _report(args: argparse.Namespace, result: OpResult) -> int:
    from slurm_gandiva.requeue.operations import as_mapping

    if args.json:
        json.dump(as_mapping(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result.describe())
    return 0


def _run(args: argparse.Namespace, op: str, call: Callable[[], OpResult], backend: SlurmBackend) -> int:
    hint = f"`gandiva {op}` must run as root or the SlurmUser"
    try:
        result = call()
    except PermissionDenied as exc:
        raise PermissionDenied(f"{exc} ({hint})") from None
    except SlurmError as exc:
        if os.geteuid() != 0:  # job_submit.lua refuses a non-root caller with an unspecific error
            raise type(exc)(f"{exc} ({hint})") from None
        raise
    rc = _report(args, result)
    _refuse_failed_end(op, result, backend)
    return rc


def _refuse_failed_end(op: str, result: OpResult, backend: SlurmBackend) -> None:
    """A job that ended instead (Outcome.FINISHED) in anything but COMPLETED makes the verb fail (one line)."""
    from slurm_gandiva.errors import ProtocolError
    from slurm_gandiva.requeue.operations import Outcome

    if result.outcome is not Outcome.FINISHED:
        return
    state = ""
    with contextlib.suppress(SlurmError):
        state = backend.job(result.job_id).state
    if state != "COMPLETED":
        raise ProtocolError(
            f"job {result.job_id} ended{' ' + state if state else ''}: nothing to {op}; "
            f"see `sacct -j {result.job_id}` and its output file"
        )


def _suspend(args: argparse.Namespace) -> int:
    proto = _protocol(args)
    return _run(args, "suspend", lambda: proto.suspend(args.job), proto.backend)


def _resume(args: argparse.Namespace) -> int:
    proto = _protocol(args)
    placement = _placement(args.node, args.gpus, args.shared)
    return _run(args, "resume", lambda: proto.resume(args.job, placement), proto.backend)


def _migrate(args: argparse.Namespace) -> int:
    proto = _protocol(args)
    placement = _placement(args.node, args.gpus, args.shared)
    return _run(args, "migrate", lambda: proto.migrate(args.job, placement), proto.backend)


def _resize(args: argparse.Namespace) -> int:
    from slurm_gandiva.requeue.gres_plan import busy_gpus, choose_gpus
    from slurm_gandiva.slurm.gres import node_gpus

    proto = _protocol(args)
    snap = proto.backend.snapshot()
    job = next((j for j in snap.jobs if j.job_id == args.job), None)
    if job is None:
        from slurm_gandiva.errors import UnknownJob

        raise UnknownJob(f"no job {args.job}: check the id with squeue")
    node = args.node or (job.nodes[0] if len(job.nodes) == 1 else None)
    if node is None:
        raise BadRequest(f"job {args.job} has no single current node: give --node")
    slurm_node = next((n for n in snap.nodes if n.name == node), None)
    if slurm_node is None:
        raise BadRequest(f"no node {node}: see sinfo for the node names")
    current = tuple(job.gpus.get(node, ())) + tuple(job.shards.get(node, ()))
    gpus = choose_gpus(
        node_gpus(slurm_node.gres), busy_gpus(snap.jobs, node, exclude=args.job), args.gpus, current
    )
    placement = _placement(node, gpus, args.shared)
    return _run(args, "resize", lambda: proto.resize(args.job, placement), proto.backend)
