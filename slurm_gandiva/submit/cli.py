"""`gandiva sbatch`: submit a job the controller owns, as the calling user.

Where things are found (first that applies):
  jobs root: --jobs-root, $GANDIVA_JOBS_ROOT, <dir of $SLURM_CONF>/../jobs (a devcluster), the controller's
             config ($GANDIVA_CONF or /etc/gandiva/gandiva.conf: jobs_dir), /var/lib/gandiva/jobs
  topology:  --topology, $GANDIVA_TOPOLOGY, <dir of $SLURM_CONF>/../topology.json, the controller's config
             (topology_file, when it exists), else the GPUs Slurm reports

Memory (where the controller runs with co_hold = yes): a job taking turns on GPUs may wait parked, its device
state (parameters, gradients, optimizer state) moved into its host memory, so ask --mem (per node) for what
it uses on the host plus that state. A job whose state would not fit declines the park and takes its turns
by checkpoint and requeue instead (slower switches, nothing lost); one whose state exceeds half its --mem
is not asked to park again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from slurm_gandiva.errors import BadRequest, ConfigError, GandivaError
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.contract import JOB_MARK, StateDirError, ensure_state_dir
from slurm_gandiva.requeue.namespace import job_comment, make_private_dir
from slurm_gandiva.requeue.spec import SubmitSpec, write_specs_in
from slurm_gandiva.slurm.base import SlurmBackend, SlurmNode, SubmitRequest
from slurm_gandiva.slurm.gres import gres_gpu_count
from slurm_gandiva.submit.accounts import check_account
from slurm_gandiva.submit.request import (
    ARRAY_ENV,
    USAGE,
    ClusterLimits,
    SbatchRequest,
    array_tasks,
    check_environment,
    parse_request,
    validate,
)

DEFAULT_JOBS_ROOT = "/var/lib/gandiva/jobs"
SYSTEM_CONFIG = "/etc/gandiva/gandiva.conf"
JOBS_ROOT_ENV = "GANDIVA_JOBS_ROOT"
TOPOLOGY_ENV = "GANDIVA_TOPOLOGY"
if TYPE_CHECKING:
    from slurm_gandiva.config import ControllerConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # prefix_chars="+" so that every sbatch option (which we do not know in advance) reaches the handler.
    p = subparsers.add_parser(
        "sbatch",
        help="submit a job that the gandiva controller schedules (sbatch options pass through)",
        description=__doc__ + "\n" + USAGE,
        prefix_chars="+",
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, help="[sbatch options] [--gpus N|MIN:MAX] -- CMD ...")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    req = parse_request(args.argv)
    if req.help:
        print(__doc__)
        print(USAGE)
        return 0
    from slurm_gandiva.slurm import make_backend

    env = dict(os.environ)
    job_id = submit(req, backend=make_backend(env), env=env, user=_current_user(), now=time.time)
    print(job_id if req.parsable else f"Submitted batch job {job_id}")
    return 0


@dataclass(frozen=True)
class Resolved:
    """Where the submission's files are."""

    jobs_root: Path
    topology: Path | None
    signal: str | None = None  # the controller's suspend signal, when its config was read
    partitions: tuple[str, ...] = ()  # the partitions the controller manages, when its config was read


def resolve_paths(req: SbatchRequest, env: Mapping[str, str]) -> Resolved:
    """The jobs root (must exist) and the topology file (None: ask Slurm), per the module doc."""
    cluster_dir = Path(env["SLURM_CONF"]).parent.parent if env.get("SLURM_CONF") else None
    if cluster_dir is not None and not (cluster_dir / "jobs").is_dir():
        cluster_dir = None  # not a devcluster layout
    from slurm_gandiva.config import CONFIG_ENV

    # A devcluster's layout gives the paths; its controller's config is read when named ($GANDIVA_CONF).
    cfg = _controller_config(env) if cluster_dir is None or env.get(CONFIG_ENV) else None
    jobs = req.jobs_root or env.get(JOBS_ROOT_ENV)
    if jobs is None:
        if cluster_dir is not None:
            jobs = str(cluster_dir / "jobs")
        elif cfg is not None:
            jobs = str(cfg.job_root)
        else:
            jobs = DEFAULT_JOBS_ROOT
    jobs_root = Path(jobs)
    if not jobs_root.is_dir():
        raise ConfigError(
            f"jobs root {jobs_root} does not exist: pass --jobs-root DIR or set {JOBS_ROOT_ENV} "
            "(ask your admin for the controller's jobs directory)"
        )
    topo = req.topology or env.get(TOPOLOGY_ENV)
    if topo is None and cluster_dir is not None and (cluster_dir / "topology.json").is_file():
        topo = str(cluster_dir / "topology.json")
    if topo is None and cfg is not None and cfg.topology_file.is_file():
        topo = str(cfg.topology_file)
    return Resolved(jobs_root.absolute(), Path(topo) if topo else None, cfg.signal if cfg is not None else None,
                    cfg.partitions if cfg is not None else ())


def _controller_config(env: Mapping[str, str]) -> ControllerConfig | None:
    """The controller's config when one is readable ($GANDIVA_CONF, else /etc/gandiva/gandiva.conf)."""
    from slurm_gandiva.config import CONFIG_ENV, load_config

    path = env.get(CONFIG_ENV) or SYSTEM_CONFIG
    try:
        readable = Path(path).is_file() and os.access(path, os.R_OK)
    except OSError:  # a directory on the way the user may not search
        readable = False
    if not readable:
        return None  # absent, or readable by the controller only
    return load_config(path)


def limits_from(topology: Topology | None, nodes: Sequence[SlurmNode]) -> ClusterLimits:
    """GPUs per node from the topology file (else from Slurm's configured gres); Slurm's partitions, and its
    CPUs and memory per node."""
    partitions: dict[str, list[str]] = {}
    for n in nodes:
        for p in n.partitions:
            partitions.setdefault(p, []).append(n.name)
    if topology is not None:
        node_gpus = {n.name: len(n.gpus) for n in topology.nodes}
    else:
        node_gpus = {n.name: gres_gpu_count(n.gres) for n in nodes}
    return ClusterLimits(node_gpus, {p: tuple(ns) for p, ns in partitions.items()},
                         node_cpus={n.name: n.cpus for n in nodes}, node_memory={n.name: n.memory for n in nodes})


def sbatch_options(req: SbatchRequest, name: str, comment: str = JOB_MARK) -> list[str]:
    """The full sbatch option list: the user's pass-through options, then the ones gandiva always sets
    (`comment`: the mark, `gandiva:<private directory>`)."""
    opts = list(req.sbatch_options)
    if req.job_name is None:
        opts.append(f"--job-name={name}")
    if req.array is not None:
        opts.append(f"--array={req.array}")
    opts += [
        f"--comment={comment}",
        "--hold",
        "--requeue",
        "--open-mode=append",
        "--nodes=1",
        "--ntasks=1",
    ]
    # No --gres on purpose: the job stays held (--hold, and job_submit.lua for marked jobs) until the
    # controller sets node list and per-GPU typed gres (gpu:g0:1,... or shard:g0:1,...) and releases it.
    # Slurm 22.05 cannot switch a job between gpu and shard, nor turn an untyped gpu:N into typed gres
    # reliably, so any gres given here would fix the job's kind and lose exact placement and packing.
    # The GPU range lives in the spec file (MIN:MAX).
    return opts


def default_name(command: Sequence[str]) -> str:
    """The job name sbatch would not guess: the script a Python command runs, else the program."""
    for word in command[1:]:
        if word.endswith(".py"):
            return Path(word).name
    return Path(command[0]).name if command else "gandiva"


def submit(
    req: SbatchRequest,
    *,
    backend: SlurmBackend,
    env: Mapping[str, str],
    user: str,
    now: Callable[[], float],
    check_command: bool = True,
    stderr: TextIO | None = None,
) -> str:
    """Validate, render, sbatch (held, marked), make the job's state directory, write the spec file; returns
    the job id. A job array (--array, or sbatch's $SBATCH_ARRAY_INX) is one sbatch; each task "ARRAY_TASK"
    is a managed job of its own with its own state directory and spec, made here without a Slurm call per
    task; the array's id is returned.

    Nothing reaches Slurm unless validation passed (the account and QOS against the user's associations
    too: submit/accounts.py). First a private directory is made under the jobs root
    (`namespace.make_private_dir`: exclusive, unguessable, 0700, the user's), named in the job's comment;
    the state directory <private>/<job id> (0700) and the spec <private>/<job id>.json go in it, so
    nothing another user plants in the jobs root is in their way. A state directory or spec that still
    cannot be made cancels the job, one line says why.
    """
    from slurm_gandiva.submit.render import render_script, signal_name

    check_environment(env)
    if req.array is None and env.get(ARRAY_ENV):
        req = replace(req, array=env[ARRAY_ENV])
    tasks = array_tasks(req.array)[0] if req.array is not None else None
    paths = resolve_paths(req, env)
    topology = None
    if paths.topology is not None:
        from slurm_gandiva.topology.file import read_topology

        topology = read_topology(paths.topology)
    nodes = backend.nodes()  # read-only: for partitions (and GPUs when there is no topology file)
    limits = replace(limits_from(topology, nodes), managed=paths.partitions)
    validate(req, limits, check_command=check_command, env=env)
    check_account(req, backend, user, env, stderr or sys.stderr)
    sig = signal_name(req.signal or paths.signal or "USR2")
    name = req.job_name if req.job_name is not None else default_name(req.command)
    spec = SubmitSpec(
        job_id="",
        user=user,
        min_gpus=req.gpus.min,
        max_gpus=req.gpus.max,
        model=req.model,
        total_samples=req.total_samples,
        name=name,
        partition=req.partition or "",
        signal=sig,
        submitted=now(),
        command=req.command,
    )
    try:
        private = make_private_dir(paths.jobs_root, user)
    except OSError as exc:
        raise BadRequest(
            f"cannot create a job directory in {paths.jobs_root} ({exc.strerror or exc}): check that the jobs "
            "root is writable (mode 1777)"
        ) from None
    script = render_script(spec, str(private))
    options = tuple(sbatch_options(req, name, job_comment(private.name)))
    try:
        job_id = backend.submit(SubmitRequest(script=script, options=options))
    except BaseException:
        with contextlib.suppress(OSError):
            private.rmdir()
        raise

    def cancel() -> None:
        try:
            backend.cancel(job_id)
        except GandivaError as cancel_exc:
            print(f"gandiva: warning: could not cancel job {job_id}: {cancel_exc}", file=stderr or sys.stderr)

    ids = [f"{job_id}_{t}" for t in tasks] if tasks is not None else [job_id]
    what = f"job array {job_id} (all {len(ids)} tasks)" if tasks is not None else f"job {job_id}"
    try:
        for jid in ids:
            ensure_state_dir(private / jid)
    except StateDirError as exc:
        cancel()
        raise BadRequest(f"{exc}; {what} was cancelled") from None
    try:
        write_specs_in(private, (spec.with_job_id(jid) for jid in ids), durable=tasks is None)
    except OSError as exc:
        cancel()
        raise BadRequest(
            f"could not write the job spec in {private} ({exc.strerror}); {what} was cancelled: check the "
            "jobs root's filesystem (full? read-only?)"
        ) from None
    return job_id


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name
