"""SlurmBackend over pyslurm (Slurm's C API in-process): queries and job actions without a fork per call.

Optional: pyslurm is imported lazily, only when a `PyslurmBackend` is made, so the project works without it.
A pyslurm release builds against its own Slurm major release only (pyslurm 25.11.x <-> Slurm 25.11), and
libslurm keeps one configuration per process: the first backend binds the process to its SLURM_CONF, a second
backend for another cluster in the same process is refused (use the CLI backend there).

What runs where (pyslurm 25.11.2, read from its source):
- jobs(), job(), snapshot(), nodes(): `pyslurm.Jobs.load` / `pyslurm.Job.load` / `pyslurm.Nodes.load`.
- hold / release / update (node list, gres, begin time, time limit, name, comment, partition, excluded
  nodes): `Job.modify` with a `JobSubmitDescription` (hold = priority 0 by root: an admin hold, as
  `scontrol hold`); requeue_hold: `Job.requeue(hold=True)`; signal: `Job.send_signal(steps="batch"|"all")`;
  cancel: `Job.send_signal(SIGKILL)` after looking the job up (pyslurm itself hides an unknown job there).
- On the `sbatch` / `scancel` / `scontrol` / `squeue` CLI (a `CliBackend` kept inside):
  * submit(): sbatch has far more options than `JobSubmitDescription` models (and job_submit.lua, the
    environment, `#SBATCH` lines and `--as_user` are sbatch's own), so submissions stay on `sbatch`;
  * cancel(as_user=...): acting as another user needs a process of that user;
  * update() of a field this module does not map;
  * capabilities(): `scontrol show config`, once per backend, so both backends learn exactly the same;
  * the GPU indices of a job whose GPUs cannot be read from its request (below), and its reason where
    slurmctld gave a free-text description that does not name the reason (below): one
    `squeue --json --jobs=...` for all such jobs of a query.
- Not exposed by pyslurm 25.11's Job / Node objects, and how this backend gets them:
  * a job's per-node GRES detail (`gres_detail_str`, the GPU indices it holds): derived from its
    `tres_per_node` where every GPU / shard it asks for is typed with a per-GPU type `gK` (the layout
    gres.conf generation and the devcluster use: type gK is GPU K), since Slurm then allocates exactly those
    types on every node of the job; any other running job (untyped `gpu:2`, other types, no GPU in its
    per-node request: `--gpus`, `--gpus-per-task` and `tres_per_job` are not readable through pyslurm 25.11,
    whose TrackableResources parser drops "gres/gpu:N") and a job being torn down are read from squeue;
  * the job state's flags (`Job.state` is Slurm's one-word `job_state_string`, where a flag such as
    REQUEUED or SIGNALING hides the base state): mapped back to the base state squeue lists first;
  * the reason where slurmctld set a description (`Job.state_reason` prefers `state_desc`, and slurmctld
    keeps "job requeued in held state" when `scontrol hold` turns a requeue-held job's JobHeldUser into
    JobHeldAdmin, so the description cannot tell an admin hold from the owner's): read from squeue, but for
    "RaisedSignal:N(...)", which goes with its reason. Every suspended (requeue-held) job, and a job
    cancelled while it was, is such a job: queries that include them cost one squeue call more;
  * a node's `gres_used`: rebuilt in Slurm's own format from the jobs that hold GPUs on it;
  * a job's `std_out` as submitted: pyslurm gives the expanded path (".../123.out" where squeue prints
    ".../%j.out"); the project reads neither, and this is the one field where the backends differ.
Timeouts: libslurm's own (MessageTimeout, retries), not `timeout`, bound the pyslurm calls.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal as _signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any

from slurm_gandiva.errors import (
    ConfigError,
    InvalidRequest,
    PermissionDenied,
    SlurmError,
    SlurmUnreachable,
    UnknownJob,
)
from slurm_gandiva.model import Tenants
from slurm_gandiva.slurm import parse
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import SlurmJob, SlurmNode, Snapshot, SubmitRequest
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.slurm.cli_backend import CliBackend
from slurm_gandiva.slurm.gres import Gres, gpu_index, parse_gres, requested_gres, write_gres

PYSLURM_REQUIREMENT = "pyslurm==25.11.2"
_BOUND_ATTR = "_slurm_gandiva_conf"  # set on the pyslurm module: the slurm.conf libslurm was initialised with

# Slurm's errno values (slurm_errno.h, 25.11).
_ACCESS_DENIED = 2002
_USER_ID_MISSING = 2010
_INVALID_JOB_ID = 2017
_TRANSITION = 2020  # ESLURM_TRANSITION_STATE_NO_UPDATE: "Job can not be altered now, try again later"
_ALREADY_DONE = 2021
_JOB_FINISHED = 2084

# `job_state_string` returns a flag's name before the base state; these flags only occur on one base state.
_FLAG_BASE = {
    "REQUEUED": "PENDING",  # requeued, still being torn down (COMPLETING wins while it is)
    "REQUEUE_FED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "EXPEDITING": "PENDING",  # 25.11: a requeued job checked for --requeue=expedite
    "CONFIGURING": "RUNNING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",  # SIGSTOP / SIGCONT being delivered to a running job
    "STOPPED": "RUNNING",  # SIGSTOPped
}
_BASE_STATES = (
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "COMPLETING",
)
_REASON_WORD = re.compile(r"[A-Za-z0-9]+")
_HOLDS_GPUS = ("RUNNING", "SUSPENDED")
# update() fields this backend sets through Job.modify: scontrol's name (lower case) -> JobSubmitDescription.
_MODIFY_FIELDS = {
    "nodelist": "required_nodes",
    "reqnodelist": "required_nodes",
    "starttime": "begin_time",
    "begintime": "begin_time",
    "timelimit": "time_limit",
    "name": "name",
    "jobname": "name",
    "comment": "comment",
    "partition": "partitions",
    "excnodelist": "excluded_nodes",
}


def load_pyslurm(slurm_conf: str | None) -> Any:
    """Import pyslurm with libslurm initialised from `slurm_conf` (None: libslurm's default lookup).

    libslurm holds one configuration per process: if pyslurm is already initialised for another slurm.conf,
    ConfigError. ImportError / OSError (no pyslurm, or no libslurm of its release) -> ConfigError.
    """
    conf = os.path.abspath(slurm_conf) if slurm_conf else None
    if conf is None or not os.path.isfile(conf):
        # libslurm ends the whole process (fatal) on a slurm.conf it cannot read: never let it try.
        raise ConfigError(
            f"the pyslurm backend needs SLURM_CONF naming a readable slurm.conf (got {slurm_conf or 'none'}): "
            "set it, or use the CLI backend"
        )
    mod: Any = sys.modules.get("pyslurm")
    if mod is None:
        try:
            os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"  # read by pyslurm's import; init below, explicitly
            flags = sys.getdlopenflags()  # pyslurm's import sets RTLD_GLOBAL | RTLD_DEEPBIND for the process
            try:
                mod = importlib.import_module("pyslurm")
            finally:
                os.environ.pop("PYSLURM_DISABLE_AUTO_INIT", None)
                sys.setdlopenflags(flags)
        except (ImportError, OSError) as exc:
            raise ConfigError(
                f"pyslurm is not usable here ({str(exc).splitlines()[0]}): install {PYSLURM_REQUIREMENT} against "
                "Slurm 25.11 and put Slurm's lib/ on LD_LIBRARY_PATH, or use the CLI backend"
            ) from None
        mod.slurm_init(conf)
        setattr(mod, _BOUND_ATTR, conf)
    elif not hasattr(mod, _BOUND_ATTR):
        # Imported by someone else: pyslurm's own import initialised libslurm from the environment.
        env_conf = os.environ.get("SLURM_CONF")
        setattr(mod, _BOUND_ATTR, os.path.abspath(env_conf) if env_conf else None)
    bound = getattr(mod, _BOUND_ATTR)
    if conf is not None and bound != conf:
        raise ConfigError(
            f"pyslurm in this process already talks to the Slurm of {bound or 'the default slurm.conf'}, not "
            f"{conf}: libslurm holds one configuration per process; use the CLI backend for the second cluster"
        )
    return mod


def pyslurm_release(mod: ModuleType) -> tuple[int, int]:
    """The Slurm major.minor the installed pyslurm was built for (its libslurm API version)."""
    api = getattr(mod, "slurm_api_version", None)
    if callable(api):
        with contextlib.suppress(Exception):
            major, minor, *_ = api()
            return int(major), int(minor)
    m = re.match(r"(\d+)\.(\d+)", str(getattr(mod, "__version__", "")))
    if not m:
        raise ConfigError("cannot tell which Slurm release the installed pyslurm is for: reinstall it")
    return int(m.group(1)), int(m.group(2))


def running_release(mod: ModuleType) -> tuple[int, int, int]:
    """The running slurmctld's release, asked through pyslurm (slurm_load_ctl_conf)."""
    try:
        conf = mod.slurmctld.Config.load()
    except Exception as exc:
        raise _rpc_error("read slurmctld's config", exc) from None
    from slurm_gandiva.slurm.capabilities import parse_version

    return parse_version(str(conf.version))


def _rpc_error(what: str, exc: BaseException) -> SlurmError:
    """A pyslurm exception -> the project's hierarchy, with the same one-line advice as the CLI backend."""
    if isinstance(exc, SlurmError):
        return exc
    errno = getattr(exc, "errno", None)
    msg = " ".join(str(getattr(exc, "msg", None) or exc).split()) or type(exc).__name__
    low = msg.lower()
    if errno == _INVALID_JOB_ID or "invalid job id" in low:
        return UnknownJob(f"{what}: {msg}: check the job id with `squeue` (finished jobs vanish after MinJobAge)")
    if errno in (_ACCESS_DENIED, _USER_ID_MISSING) or "permission denied" in low or "not authorized" in low:
        return PermissionDenied(f"{what}: {msg}: only the job's owner, root or the gandiva controller may do this")
    if (isinstance(errno, int) and (
        1000 <= errno < 1100 or 1800 <= errno < 1900 or 5000 <= errno < 5100 or 6000 <= errno < 6100
    )) or any(s in low for s in ("unable to contact slurm controller", "socket timed out", "connection refused",
                                "zero bytes were transmitted", "munge")):
        return SlurmUnreachable(f"{what}: {msg}: is slurmctld running? try `gandiva devcluster status`")
    return InvalidRequest(f"{what}: Slurm refused the request ({msg})")


def _job_id(job_id: str) -> str:
    jid = str(job_id).strip()
    if not re.fullmatch(r"\d+(_\d+)?", jid):
        raise InvalidRequest(f"bad job id {job_id!r}: a job id is a number like 1234")
    return jid


def _num(value: Any) -> int:
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _memory_per_node(raw: Any) -> int:
    """MB a pyslurm job needs on each node: memory_per_node, else memory_per_cpu times its CPUs per node."""
    per_node = _num(getattr(raw, "memory_per_node", 0))
    if per_node > 0:
        return per_node
    return _num(getattr(raw, "memory_per_cpu", 0)) * max(1, _num(getattr(raw, "min_cpus_per_node", 0)))


def base_state(word: str) -> str | None:
    """Slurm's `job_state_string` word -> the base state squeue --json lists first; None: cannot tell."""
    w = word.upper()
    if w in _BASE_STATES:
        return w
    return _FLAG_BASE.get(w)


def reason_of(text: str) -> str | None:
    """pyslurm's `state_reason` -> the reason enum's name, as squeue --json prints it; None where it is a
    description slurmctld set (`Job.state_reason` prefers `state_desc`), which does not say the reason: a
    requeue-held job keeps "job requeued in held state" after `scontrol hold` made its reason JobHeldAdmin."""
    if not text:
        return "None"
    if text.startswith("RaisedSignal:"):
        return "RaisedSignal"  # "RaisedSignal:15(Terminated)": set with its reason as the job ends, and final
    return text if _REASON_WORD.fullmatch(text) else None


def gres_of(gres: Mapping[str, Any]) -> str:
    """pyslurm's gres dict ({"gres/gpu:g0": 1} or {"gpu:g0": 1}) back to Slurm's string ("gres/gpu:g0:1")."""
    items = []
    for key, val in gres.items():
        count = val.get("count") if isinstance(val, Mapping) else val
        items += [replace(g, count=_num(count)) for g in parse_gres(key)]
    return write_gres(items, prefix="gres/" if any(k.startswith("gres/") for k in gres) else "")


def typed_allocation(tres_per_node: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(gpu indices, shard indices) a running job holds on EACH of its nodes, read from its per-node request
    when every GPU / shard item is typed gK; None when the request does not say (untyped, other types)."""
    gpus: set[int] = set()
    shards: set[int] = set()
    for g in parse_gres(tres_per_node):
        if g.name not in ("gpu", "shard"):
            continue
        k = gpu_index(g.type)
        if k is None or (g.name == "gpu" and g.count != 1):
            return None
        if g.count > 0:
            (gpus if g.name == "gpu" else shards).add(k)
    return tuple(sorted(gpus)), tuple(sorted(shards))


class PyslurmBackend:
    """The SlurmBackend over pyslurm (see the module docstring for what stays on the CLI and why).

    `env` is the environment the CLI parts run with and names the cluster (SLURM_CONF); pyslurm is bound to
    the same slurm.conf. ConfigError if pyslurm cannot be used here.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        capabilities: SlurmCapabilities | None = None,
        cli: CliBackend | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.env = dict(env or {})
        self.timeout = timeout
        self._clock = clock
        self._sleep = sleep
        conf = self.env.get("SLURM_CONF") or os.environ.get("SLURM_CONF")
        # libslurm cuts a job array's task list at SLURM_BITSTR_LEN (64 characters by default), read from the
        # process's environment when it first unpacks jobs (see CliBackend for the commands').
        os.environ["SLURM_BITSTR_LEN"] = "0"
        self._ps = load_pyslurm(conf)
        self.cli = cli or CliBackend(self.env, timeout=timeout, clock=clock, capabilities=capabilities)

    # ----- queries -----
    def capabilities(self) -> SlurmCapabilities:
        """As the CLI backend learns them (`scontrol show config`, asked once): the same object either way."""
        return self.cli.capabilities()

    def _load_jobs(self) -> list[Any]:
        try:
            jobs = self._ps.Jobs.load(preload_passwd_info=True)
        except Exception as exc:
            raise _rpc_error("load jobs", exc) from None
        return list(jobs.values())

    def _load_nodes(self) -> list[Any]:
        try:
            nodes = self._ps.Nodes.load()
        except Exception as exc:
            raise _rpc_error("load nodes", exc) from None
        return list(nodes.values())

    def jobs(self) -> tuple[SlurmJob, ...]:
        """Every job slurmctld knows, finished ones included (as `squeue --states=all`)."""
        return self._convert(self._load_jobs())

    def nodes(self) -> tuple[SlurmNode, ...]:
        jobs = self.jobs()
        return self._nodes(self._load_nodes(), jobs)

    def snapshot(self) -> Snapshot:
        jobs = self.jobs()
        nodes = self._nodes(self._load_nodes(), jobs)
        return Snapshot(jobs=jobs, nodes=nodes, taken_at=self._clock())

    def job(self, job_id: str) -> SlurmJob:
        jid = _job_id(job_id)
        if "_" in jid:
            return self.cli.job(jid)  # an array task named as A_T: squeue resolves it
        found = self._convert([self._load_one(jid)])  # a task's own numeric id reads as its A_T
        if not found:  # a job array's record that stands for no task any more
            raise UnknownJob(f"job {jid} not found: check the id with `squeue` (finished jobs vanish after MinJobAge)")
        return found[0]

    def _load_one(self, jid: str) -> Any:
        """pyslurm.Job.load (slurm_load_job: this job alone); UnknownJob as the CLI backend words it."""
        try:
            return self._ps.Job.load(int(jid))
        except Exception as exc:
            err = _rpc_error(f"job {jid}", exc)
            if isinstance(err, UnknownJob):
                raise UnknownJob(
                    f"job {jid} not found: check the id with `squeue` (finished jobs vanish after MinJobAge)"
                ) from None
            raise err from None

    def _convert(self, raws: Iterable[Any]) -> tuple[SlurmJob, ...]:
        out: list[tuple[SlurmJob, ...] | None] = []
        # position -> (Slurm's id of the record, the names it stands for), for the records squeue must complete
        ask: dict[int, tuple[str, tuple[str, ...]]] = {}
        for raw in raws:
            names = array_names(raw)
            job = self._job(raw) if names is not None else None
            if job is None or names is None:
                array = _num(raw.array_id)
                # pyslurm reads task 0 as "no task": such a record is task 0 or a finished meta record
                ask[len(out)] = (str(raw.id), names if names is not None else (f"{array}_0",))
                out.append(None)
            elif not names:
                out.append((job,))
            else:
                limit = _num(raw.array_tasks_parallel)
                array_id = str(_num(raw.array_id))
                out.append(tuple(replace(job, job_id=n, array_id=array_id, array_max_tasks=limit) for n in names))
        if ask:
            by_id = {j.job_id: j for j in self._cli_jobs(sorted({i for i, _ in ask.values()}, key=int))}
            for pos, (jid, names) in ask.items():
                if names:
                    out[pos] = tuple(by_id[n] for n in names if n in by_id)
                    continue
                got = by_id.get(jid)
                if got is None:  # gone between the two queries: read it once more alone
                    got = self.cli.job(jid)
                out[pos] = (got,)
        seen: set[str] = set()
        jobs: list[SlurmJob] = []
        for group in out:
            for j in group or ():
                if j.job_id not in seen:  # squeue lists a task once more when asked for its array's record
                    seen.add(j.job_id)
                    jobs.append(j)
        return tuple(jobs)

    def _cli_jobs(self, ids: list[str]) -> tuple[SlurmJob, ...]:
        """The given jobs from squeue --json (one call)."""
        try:
            text = self.cli._run(["squeue", "--json", "--states=all", f"--jobs={','.join(ids)}"], "squeue")
            return parse.parse_squeue(parse.load_json(text, "squeue"))
        except parse.SlurmQueryError:
            return ()  # e.g. one of them vanished: the caller asks for each alone
        except parse.ParseError as exc:
            raise SlurmError(f"{exc}: report this with your Slurm version (`squeue --version`)") from None

    def _job(self, raw: Any) -> SlurmJob | None:
        """One pyslurm Job -> SlurmJob, or None where only squeue can say (see the module docstring)."""
        word = _text(raw.state)
        state = base_state(word)
        reason = reason_of(_text(raw.state_reason))
        if state is None or reason is None:
            return None
        tres_per_node = gres_of(raw.gres_per_node or {})
        alloc = parse.expand_hostlist(_text(raw.allocated_nodes))
        gpus: dict[str, tuple[int, ...]] = {}
        shards: dict[str, tuple[int, ...]] = {}
        if state == "COMPLETING" and alloc:
            return None  # being torn down: whether Slurm still lists its GPUs, only squeue says
        if state in _HOLDS_GPUS and alloc:
            derived = typed_allocation(tres_per_node)
            if derived is None or not any(derived):
                # Untyped or other types, or no GPU in the per-node request (a --gpus / --gpus-per-task job's
                # request is not readable through pyslurm 25.11): only squeue's gres detail says.
                return None
            g, s = derived
            gpus = {n: g for n in alloc if g}
            shards = {n: s for n in alloc if s}
        priority = raw.priority
        hold = parse.hold_kind(state, reason, -1 if priority is None else _num(priority))
        nodes = alloc or parse.expand_hostlist(_text(raw.required_nodes))
        exit_code: int | None = None
        if state not in ("PENDING", "RUNNING"):
            sig = _num(raw.exit_code_signal)
            exit_code = 128 + sig if sig else _num(raw.exit_code)
        return SlurmJob(
            job_id=str(raw.id),
            name=_text(raw.name),
            user=_text(raw.user_name),
            state=state,
            reason=reason,
            hold=hold,
            nodes=nodes,
            gpus=gpus,
            shards=shards,
            restart_count=_num(raw.requeue_count),
            comment=_text(raw.comment),
            partition=_text(raw.partition),
            submit_time=float(_num(raw.submit_time)),
            start_time=float(_num(raw.start_time)),
            end_time=float(_num(raw.end_time)),
            exit_code=exit_code,
            tres_per_node=tres_per_node,
            work_dir=_text(raw.working_directory),
            std_out=_text(raw.standard_output),
            min_cpus_per_node=_num(getattr(raw, "min_cpus_per_node", 0)),
            min_memory_per_node=_memory_per_node(raw),
            account=_text(getattr(raw, "account", "")),
            qos=_text(getattr(raw, "qos", "")),
        )

    def _nodes(self, raws: Iterable[Any], jobs: tuple[SlurmJob, ...]) -> tuple[SlurmNode, ...]:
        out = []
        for raw in raws:
            name = _text(raw.name)
            gres = gres_of(raw.configured_gres or {})
            out.append(SlurmNode(
                name=name,
                state=_text(raw.state) or "UNKNOWN",
                partitions=tuple(_text(p) for p in (raw.partitions or ())),
                gres=gres,
                gres_used=gres_used(gres, name, jobs),
                cpus=_num(raw.total_cpus),
                sockets=_num(raw.sockets),
                memory=_num(getattr(raw, "real_memory", 0)),
                alloc_cpus=_num(getattr(raw, "allocated_cpus", 0)),
                alloc_memory=_num(getattr(raw, "allocated_memory", 0)),
            ))
        return tuple(sorted(out, key=lambda n: n.name))

    # ----- actions -----
    def _handle(self, jid: str) -> Any:
        """A pyslurm Job handle for actions (no query). Array tasks ("A_T") never come here: a task not split
        off its array has no job id of its own, so their actions go through the CLI, which names them A_T."""
        return self._ps.Job(int(jid))

    def _act(self, what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as exc:
            raise _rpc_error(what, exc) from None

    def submit(self, req: SubmitRequest) -> str:
        """`sbatch` (the CLI backend): see the module docstring."""
        return self.cli.submit(req)

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        sig = signal_name.strip().upper().removeprefix("SIG")
        if not re.fullmatch(r"[A-Z0-9]+", sig):
            raise InvalidRequest(f"bad signal name {signal_name!r}: use a name like USR2")
        try:
            num = int(sig) if sig.isdigit() else int(getattr(_signal, f"SIG{sig}"))
        except AttributeError:
            raise InvalidRequest(f"bad signal name {signal_name!r}: use a name like USR2") from None
        jid = _job_id(job_id)
        if "_" in jid:
            self.cli.signal(jid, sig, batch_only=batch_only)
            return
        job = self._handle(jid)
        what = f"signal {sig} to job {jid}"
        deadline = self._clock() + self.timeout
        wait = 0.1
        while True:
            try:
                job.send_signal(num, steps="batch" if batch_only else "all")
                return
            except Exception as exc:
                errno = getattr(exc, "errno", None)
                if errno in (_ALREADY_DONE, _JOB_FINISHED):
                    # pyslurm passes "already done" over in silence for signals; scancel reports it: so do we.
                    raise InvalidRequest(f"{what}: Slurm refused the request (Job/step already completing or "
                                         "completed)") from None
                if errno != _TRANSITION or self._clock() + wait > deadline:
                    raise _rpc_error(what, exc) from None
            # A SIGSTOP / SIGCONT still being delivered to the job's nodes (JOB_SIGNALING) refuses the next one
            # until slurmctld's agent is done; scancel sends again on this answer, and so do we, sooner.
            self._sleep(wait)
            wait = min(wait * 2, 2.0)

    def requeue_hold(self, job_id: str) -> None:
        jid = _job_id(job_id)
        if "_" in jid:
            self.cli.requeue_hold(jid)
            return
        job = self._handle(jid)
        self._act(f"requeuehold job {jid}", lambda: job.requeue(hold=True))

    def hold(self, job_id: str) -> None:
        """priority 0 (an admin hold when the caller is root / SlurmUser), as `scontrol hold`."""
        jid = _job_id(job_id)
        if "_" in jid:
            self.cli.hold(jid)
            return
        job = self._handle(jid)
        self._act(f"hold job {jid}", job.hold)

    def release(self, job_id: str) -> None:
        jid = _job_id(job_id)
        if "_" in jid:
            self.cli.release(jid)
            return
        job = self._handle(jid)
        self._act(f"release job {jid}", job.release)

    def update(self, job_id: str, **fields: str) -> None:
        """As `scontrol update jobid=JOB k=v ...`: the mapped fields in one `Job.modify`, a `gres=` change
        through `_set_gres` (replace exactly, read back), any other field through `scontrol update`."""
        if not fields:
            return
        jid = _job_id(job_id)
        if "_" in jid:
            self.cli.update(jid, **fields)
            return
        changes: dict[str, Any] = {}
        other: dict[str, str] = {}
        gres: str | None = None
        for key, value in fields.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z_]*", key) or key.lower() in ("jobid", "tresspernode",
                                                                                "trespernode"):
                raise InvalidRequest(f"bad job field {key!r} for scontrol update (set GPUs with gres=...)")
            if any(c.isspace() for c in str(value)) or not str(value):
                raise InvalidRequest(f"bad value {value!r} for {key}: no whitespace, not empty")
            low = key.lower()
            if low == "gres":
                gres = str(value)
            elif low in _MODIFY_FIELDS:
                changes[_MODIFY_FIELDS[low]] = _modify_value(low, str(value), self._clock)
            else:
                other[key] = str(value)
        if gres is not None:
            self._set_gres(jid, gres)
        if changes:
            self._modify(jid, f"update job {jid}", **changes)
        if other:
            self.cli.update(jid, **other)

    def _modify(self, jid: str, what: str, **changes: Any) -> None:
        try:
            desc = self._ps.JobSubmitDescription(**changes)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"{what}: {exc}") from None
        job = self._handle(jid)
        self._act(what, lambda: job.modify(desc))

    def _set_gres(self, jid: str, gres: str) -> None:
        """Replace a pending job's gres with exactly `gres` and read it back (as the CLI backend does). The
        releases pyslurm exists for (25.11) replace a gres request and switch gpu <-> shard in one update
        (`SlurmCapabilities.gres_kind_switch`, not `gres_update_merges`); on others this refuses."""
        new = requested_gres(gres)
        if not new:
            raise InvalidRequest(f"bad gres {gres!r}: use e.g. gpu:g0:1,gpu:g2:1 or shard:g1:1")
        state, tres = self._state_and_gres(jid)
        if state != "PENDING":
            raise InvalidRequest(f"job {jid} is {state}: hold it (held requeue) before changing its GPUs")
        if requested_gres(tres) == new:
            return
        what = f"set gres of job {jid}"
        caps = self.capabilities()
        if caps.gres_update_merges or not caps.gres_kind_switch:
            raise InvalidRequest(f"{what}: Slurm {caps.release_text} merges gres updates: use the CLI backend")
        self._modify(jid, what, gres_per_node=gres)
        now = requested_gres(self._state_and_gres(jid)[1])
        if now != new:
            raise SlurmError(f"{what}: Slurm kept {sorted(now)} instead of {sorted(new)}: do not release the job")

    def _state_and_gres(self, jid: str) -> tuple[str, str]:
        """A job's base state (or pyslurm's word where it hides it) and tres_per_node, from pyslurm alone
        (no squeue for the reason: these two are all a gres update needs)."""
        if "_" in jid:
            job = self.cli.job(jid)
            return job.state, job.tres_per_node
        raw = self._load_one(jid)
        word = _text(raw.state)
        return base_state(word) or word, gres_of(raw.gres_per_node or {})

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        """As scancel JOB: a job that already finished counts as cancelled, an unknown one is UnknownJob
        (pyslurm's own cancel passes it over). As another user: `scancel` run as that user."""
        jid = _job_id(job_id)
        if as_user is not None or "_" in jid:
            self.cli.cancel(jid, as_user=as_user)
            return
        job = self.job(jid)  # UnknownJob, as scancel says "Invalid job id specified"
        if job.array_id:  # a job array (its id) or a task by its own id: scancel knows both
            self.cli.cancel(jid)
            return
        if job.finished:
            return
        handle = self._ps.Job(int(job.job_id))
        self._act(f"cancel job {jid}", handle.cancel)

    def tenants(self) -> Tenants:
        """As the CLI backend reads them (sacctmgr and sshare)."""
        return self.cli.tenants()

    def user_associations(self, user: str) -> UserAssociations | None:
        """As the CLI backend reads them (sacctmgr)."""
        return self.cli.user_associations(user)


def array_names(raw: Any) -> tuple[str, ...] | None:
    """The jobs a pyslurm Job record stands for, as `parse.array_jobs` names them: () for a job that is no
    array task (its own id), ("A_T",) for a task, one name per task for the array's pending meta record; None
    where pyslurm cannot tell (it reads task 0 as no task: task 0, or a finished meta record)."""
    array = _num(raw.array_id)
    if array <= 0:
        return ()
    task = raw.array_task_id
    if task is not None:
        return (f"{array}_{_num(task)}",)
    waiting = _text(raw.array_tasks_waiting)
    if not waiting:
        return None
    if waiting.rstrip().endswith("..."):  # never read as "the tasks past the cut are gone"
        raise SlurmError(f"libslurm cut job array {array}'s task list short: run with SLURM_BITSTR_LEN=0")
    try:
        tasks, _ = parse.parse_array_spec(waiting)
    except ValueError:
        return None
    return tuple(f"{array}_{t}" for t in tasks)


def _modify_value(field: str, value: str, clock: Callable[[], float]) -> Any:
    if field in ("starttime", "begintime") and re.fullmatch(r"now(\+\d+)?", value.lower()):
        return int(clock()) + int(value[4:] or 0)  # as scontrol: now[+seconds] on the whole-second clock
    if field in ("nodelist", "reqnodelist", "excnodelist", "partition"):
        return ",".join(value.split(","))
    return value


def gres_used(configured: str, node: str, jobs: Iterable[SlurmJob]) -> str:
    """A node's used GRES in sinfo's format ("gpu:g0:1(IDX:0),gpu:g1:0(IDX:N/A),shard:g2:1(1/2)"), from the
    jobs holding GPUs on it, for per-GPU typed gres (gpu:gK:1, shard:gK:n); other layouts: ""."""
    gpu_busy: set[int] = set()
    shard_busy: dict[int, int] = {}
    for j in jobs:
        if not j.running and j.state != "SUSPENDED":
            continue
        gpu_busy.update(j.gpus.get(node, ()))
        per = {g.type: g.count for g in parse_gres(j.tres_per_node) if g.name == "shard"}
        for i in j.shards.get(node, ()):
            shard_busy[i] = shard_busy.get(i, 0) + per.get(f"g{i}", 1)
    out = []
    for g in parse_gres(configured):
        k = gpu_index(g.type)
        if k is None:
            return ""
        if g.name == "gpu":
            used = 1 if k in gpu_busy else 0
            out.append(Gres("gpu", g.type, used, f"IDX:{k if used else 'N/A'}"))
        elif g.name == "shard":
            used = shard_busy.get(k, 0)
            out.append(Gres("shard", g.type, used, f"{used}/{g.count}"))
        else:
            out.append(Gres(g.name, g.type, 0))
    return write_gres(out)
