"""SlurmBackend over the Slurm CLI (sbatch, squeue/sinfo --json, scontrol, scancel): any Slurm >= 21.08."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from slurm_gandiva.errors import (
    AccountingUnavailable,
    InvalidRequest,
    PermissionDenied,
    SlurmError,
    SlurmUnreachable,
    UnknownJob,
)
from slurm_gandiva.model import Tenants
from slurm_gandiva.slurm import accounting, parse, scontrol_text
from slurm_gandiva.slurm.base import SlurmJob, SlurmNode, Snapshot, SubmitRequest
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.slurm.gres import parse_gres, requested_gres, write_gres

_UNREACHABLE = (
    "unable to contact slurm controller",
    "unable to establish slurm connection",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "communication connection failure",
    "slurm_receive_msg",
    "could not establish a configuration source",
    "can't open config file",
    "unable to process configuration file",
    "munge",
    "unexpected message received",  # scontrol hold/release/update when slurmctld is down (22.05)
)
_UNKNOWN_JOB = ("invalid job id", "invalid job_id", "job not found")
_DENIED = (
    "access/permission denied",
    "permission denied",
    "unspecified error",
    "not authorized",
    "user not authorized",
    "managed by the gandiva controller",
)
_ALREADY_DONE = ("already completing or completed", "job is already finished")
_FIELD = re.compile(r"[A-Za-z][A-Za-z_]*")
# `squeue -O` fields that change whenever anything the controller reads of a job changes. None of them is
# free text a user chooses (no name, comment or paths), so a line cannot be forged by a job: each line is
# only a fingerprint, and the job itself is read from squeue --json when its fingerprint changes. Not the
# priority: multifactor priorities change every pending job each PriorityCalcPeriod; a hold or release
# changes the Reason.
_FINGERPRINT = (
    "JobID", "ArrayJobID", "ArrayTaskID", "State", "Reason", "UserName", "Partition", "SubmitTime", "StartTime",
    "EndTime", "RestartCnt", "NodeList", "ReqNodes", "tres-per-node", "exit_code",
)
# Above this share of changed jobs one unfiltered squeue --json is cheaper than a long --jobs= list.
_FULL_READ_SHARE = 0.25
# Where squeue --json ignores --jobs (22.05), one `scontrol show job ID` costs about as much as this many jobs
# of an unfiltered squeue --json: fewer jobs than that per id in the queue, and everything is read as JSON.
_TEXT_READ_JOBS = 40


def _classify(what: str, stderr: str, rc: int) -> SlurmError:
    msg = " ".join(stderr.strip().split()) or f"exit status {rc}"
    low = msg.lower()
    if any(s in low for s in _UNKNOWN_JOB):
        return UnknownJob(f"{what}: {msg}: check the job id with `squeue` (finished jobs vanish after MinJobAge)")
    if any(s in low for s in _DENIED):
        return PermissionDenied(f"{what}: {msg}: only the job's owner, root or the gandiva controller may do this")
    if any(s in low for s in _UNREACHABLE):
        return SlurmUnreachable(f"{what}: {msg}: is slurmctld running? try `gandiva devcluster status`")
    return InvalidRequest(f"{what}: Slurm refused the request ({msg})")


class CliBackend:
    """Talks to Slurm through its commands, run as argv lists with a timeout.

    `env` is added to the caller's environment for every command (typically SLURM_CONF). `capabilities`
    fixes what the running Slurm can do (tests); by default it is asked from slurmctld once, when needed.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        capabilities: SlurmCapabilities | None = None,
    ) -> None:
        # SLURM_BITSTR_LEN=0: Slurm's commands otherwise cut a job array's task list at 64 characters
        # ("0-1,3-5,...,57-71...") and the tasks past the cut could not be told apart from gone ones.
        self.env = {**dict(env or {}), "SLURM_BITSTR_LEN": "0"}
        self.timeout = timeout
        self._clock = clock
        self._caps = capabilities
        # job id (Slurm's own, one per record) -> (its fingerprint line, the jobs its JSON record stands for)
        self._known: dict[str, tuple[str, tuple[SlurmJob, ...]]] = {}

    # ----- plumbing -----
    def _run(
        self,
        argv: Sequence[str],
        what: str,
        *,
        stdin: str | None = None,
        as_user: str | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        full = list(argv)
        if as_user is not None:
            try:
                target_uid = pwd.getpwnam(as_user).pw_uid
            except KeyError:
                raise InvalidRequest(f"{what}: no such user {as_user!r}: create it or pick another") from None
            if target_uid != os.geteuid():
                if os.geteuid() != 0:
                    raise PermissionDenied(f"{what}: only root can act as user {as_user}: run as root")
                full = ["runuser", "-u", as_user, "--", *full]
        env = {**os.environ, **self.env, **(extra_env or {})}
        try:
            proc = subprocess.run(
                full, input=stdin, env=env, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError:
            raise SlurmUnreachable(
                f"{what}: {full[0]} not found: install the Slurm client (bash scripts/setup.sh)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(
                f"{what}: no answer within {self.timeout:g}s: is slurmctld running? try `gandiva devcluster status`"
            ) from None
        if proc.returncode != 0:
            raise _classify(what, proc.stderr or proc.stdout, proc.returncode)
        return proc.stdout

    # ----- queries -----
    def capabilities(self) -> SlurmCapabilities:
        """The running slurmctld's release and behaviours, from `scontrol show config` (asked once)."""
        if self._caps is None:
            out = self._run(["scontrol", "show", "config"], "scontrol show config")
            self._caps = SlurmCapabilities.from_config(out)
        return self._caps

    def jobs(self) -> tuple[SlurmJob, ...]:
        """Every job slurmctld knows, finished ones included (newer squeue shows only active jobs by default;
        22.05's squeue --json ignores filters and always lists every job)."""
        return self._squeue()

    def _squeue(self, *filters: str) -> tuple[SlurmJob, ...]:
        """`squeue --json --states=all FILTERS`, parsed; a filter naming a job slurmctld does not know: ()."""
        return self._parse_records(list(self._squeue_records(*filters).values()))

    def nodes(self) -> tuple[SlurmNode, ...]:
        out = self._run(["sinfo", "--json"], "sinfo")
        try:
            return parse.parse_sinfo(parse.load_json(out, "sinfo"))
        except parse.SlurmQueryError as exc:
            raise SlurmUnreachable(f"{exc}: is slurmctld running? try `gandiva devcluster status`") from None
        except parse.ParseError as exc:
            raise SlurmError(f"{exc}: report this with your Slurm version (`sinfo --version`)") from None

    def snapshot(self) -> Snapshot:
        """Every job and node. Jobs come from a cheap `squeue -O` listing of fingerprints; squeue --json is
        asked only for the jobs whose fingerprint changed since the last snapshot (every job, where Slurm's
        squeue --json ignores filters), the others are the jobs parsed then. At 10,000 jobs the listing
        takes 0.2 s where squeue --json takes 6 s and prints 77 MB."""
        jobs = self._current_jobs()
        nodes = self.nodes()
        return Snapshot(jobs=jobs, nodes=nodes, taken_at=self._clock())

    def _current_jobs(self) -> tuple[SlurmJob, ...]:
        listing = self._fingerprints()
        if listing is None:
            return self._read_all(None)
        changed = [rid for rid, line in listing.items() if self._known.get(rid, ("",))[0] != line]
        if changed:
            if len(changed) > _FULL_READ_SHARE * len(listing):
                return self._read_all(listing)
            if self.capabilities().squeue_json_filters:
                records = self._squeue_records(f"--jobs={','.join(changed)}")
            else:
                found = self._text_records(changed) if self._per_id_reads(len(changed), len(listing)) else None
                if found is None:
                    return self._read_all(listing)
                records = found
            fresh = {rid: rec for rid, rec in records.items() if rid in listing}
            if not fresh.keys() >= set(changed):  # gone between the two calls: one consistent read instead
                return self._read_all(None)
            for rid, rec in fresh.items():
                self._known[rid] = (listing[rid], self._parse_records([rec]))
        for rid in self._known.keys() - listing.keys():
            del self._known[rid]
        return tuple(j for rid in listing for j in self._known[rid][1])

    def _read_all(self, listing: Mapping[str, str] | None) -> tuple[SlurmJob, ...]:
        """Every job from one squeue --json; remembered under `listing`'s fingerprints when given (a record
        the listing did not have is remembered with none: read again next time)."""
        records = self._squeue_records()
        self._known = {
            rid: ((listing or {}).get(rid, ""), self._parse_records([rec])) for rid, rec in records.items()
        }
        return tuple(j for entry in self._known.values() for j in entry[1])

    def _fingerprints(self) -> dict[str, str] | None:
        """Job id -> its `squeue -O` line, in squeue's order; None if a line cannot be read (then the
        caller reads everything as JSON)."""
        fmt = ",".join(f"{f}:|" for f in _FINGERPRINT)
        # --array: one line per array task. Without it squeue folds an array's pending tasks into one line,
        # those with a record of their own (a suspended task) included, and such a record would go unseen.
        # A record still holding several tasks prints a line for each, under its own id: joined.
        out = self._run(["squeue", "--noheader", "--array", "--states=all", f"--Format={fmt}"], "squeue")
        # An array's never-run tasks share its record: its lines are gathered and joined once (joining
        # them one by one copied the growing string for every task, quadratic: 0.1-3 s at 10,000 tasks).
        lines: dict[str, list[str]] = {}
        for line in out.splitlines():
            rid = line.split("|", 1)[0].strip()
            if not rid.isdigit():
                return None
            same = lines.get(rid)
            if same is None:
                lines[rid] = [line]
            else:
                same.append(line)
        return {rid: ls[0] if len(ls) == 1 else "\n".join(ls) for rid, ls in lines.items()}

    def _squeue_records(self, *filters: str) -> dict[str, Mapping[str, Any]]:
        """squeue --json's job records by job id, unparsed ({} when a filter names no job Slurm knows)."""
        out = self._run(["squeue", "--json", "--states=all", *filters], "squeue")
        try:
            doc = parse.load_json(out, "squeue")
            parse.parse_squeue({**doc, "jobs": []})  # Slurm's reported errors, and the shape, only
        except parse.SlurmQueryError as exc:
            if filters and any(s in str(exc).lower() for s in _UNKNOWN_JOB):
                return {}
            raise SlurmUnreachable(f"{exc}: is slurmctld running? try `gandiva devcluster status`") from None
        except parse.ParseError as exc:
            raise SlurmError(f"{exc}: report this with your Slurm version (`squeue --version`)") from None
        jobs = doc.get("jobs")
        if not isinstance(jobs, list):
            raise SlurmError("squeue --json has no 'jobs' list: report this with your Slurm version")
        return {str(parse.number(r.get("job_id"), 0)): r for r in jobs if isinstance(r, Mapping)}

    @staticmethod
    def _parse_records(records: Sequence[Mapping[str, Any]]) -> tuple[SlurmJob, ...]:
        try:
            return parse.parse_squeue({"jobs": list(records)})
        except parse.ParseError as exc:
            raise SlurmError(f"{exc}: report this with your Slurm version (`squeue --version`)") from None

    def _text_records(self, job_ids: Iterable[str]) -> dict[str, Mapping[str, Any]] | None:
        """`scontrol show job -d -o ID` for each id, as squeue --json records by Slurm's job id (an id Slurm
        does not know adds none; an array's id adds its tasks); None if a record cannot be read (a job's
        free-text fields can make it ambiguous: `scontrol_text`), and the caller reads JSON instead."""
        found: dict[str, Mapping[str, Any]] = {}
        for jid in job_ids:
            try:
                out = self._run(["scontrol", "show", "job", "-d", "-o", _job_id(jid)], f"scontrol show job {jid}")
            except UnknownJob:
                continue
            try:
                found.update(scontrol_text.records(out))
            except parse.ParseError:
                return None
        return found

    def _per_id_reads(self, count: int, queue: int) -> bool:
        """Whether `count` jobs of a queue of `queue` records are cheaper read one `scontrol show job` each
        than by one whole-queue squeue --json, where squeue --json ignores --jobs."""
        return not self.capabilities().squeue_json_filters and count * _TEXT_READ_JOBS < queue

    def job(self, job_id: str) -> SlurmJob:
        job_id = _job_id(job_id)
        if self.capabilities().squeue_json_filters:
            found = self._squeue(f"--jobs={job_id}")
        else:
            # 22.05's squeue --json ignores --jobs and prints every job: scontrol reads the one.
            records = self._text_records([job_id])
            found = self._parse_records(list(records.values())) if records is not None else self.jobs()
        for j in found:
            if j.job_id == job_id:
                return j
        raise UnknownJob(f"job {job_id} not found: check the id with `squeue` (finished jobs vanish after MinJobAge)")

    def read_jobs(self, job_ids: Iterable[str]) -> dict[str, SlurmJob]:
        """Several jobs with one squeue --json; the ids Slurm does not know are left out. A filter naming an
        unknown job may answer for none. Where squeue --json ignores --jobs (22.05) and lists every job, a few
        jobs of a long queue are read with one `scontrol show job` each instead."""
        want = {_job_id(j) for j in job_ids}
        if not want:
            return {}
        found: tuple[SlurmJob, ...] | None = None
        if self.capabilities().squeue_json_filters:
            found = self._squeue(f"--jobs={','.join(sorted(want))}")
        elif self._per_id_reads(len(want), len(self._known)):  # the queue as of the last snapshot
            records = self._text_records(sorted(want))
            if records is not None:
                found = self._parse_records(list(records.values()))
        if found is None:
            found = self.jobs()
        return {j.job_id: j for j in found if j.job_id in want}

    # ----- actions -----
    def submit(self, req: SubmitRequest) -> str:
        argv = ["sbatch", "--parsable", "--requeue", "--open-mode=append", *req.options]
        out = self._run(argv, "sbatch", stdin=req.script, as_user=req.as_user, extra_env=req.env)
        first = out.strip().splitlines()[-1] if out.strip() else ""
        job_id = first.split(";", 1)[0].strip()
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {out.strip()!r}, not a job id: check the sbatch options")
        return job_id

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        sig = signal_name.strip().upper().removeprefix("SIG")
        if not re.fullmatch(r"[A-Z0-9]+", sig):
            raise InvalidRequest(f"bad signal name {signal_name!r}: use a name like USR2")
        scope = "--batch" if batch_only else "--full"
        jid = _job_id(job_id)
        what = f"signal {sig} to job {jid}"
        if "_" in jid:
            self._signal_array_task(["scancel", "--verbose", f"--signal={sig}", scope, jid], what)
            return
        self._run(["scancel", f"--signal={sig}", scope, jid], what)

    def _signal_array_task(self, argv: list[str], what: str) -> None:
        """scancel --signal for one task of a job array. While other tasks of its array wait, slurmctld signals
        the task and answers "Job can not be altered now" all the same (job_str_signal gives every signal but
        SIGKILL to an array with pending tasks that answer; every supported release), and scancel then sends
        it again every 5-14 s for a minute and a half. Its verbose "transitional state, retrying" therefore
        means sent: scancel is stopped there. A running task has a record of its own and is signalled; one
        that does not run is not, which the caller sees in the job's state, as for any job."""
        env = {**os.environ, **self.env}
        try:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise SlurmUnreachable(f"{what}: scancel not found: install Slurm (bash scripts/setup.sh)") from None
        timer = threading.Timer(self.timeout, proc.kill)
        timer.start()
        lines: list[str] = []
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                low = line.lower()
                if "state, retrying" in low and ("transitional" in low or "transistional" in low):
                    proc.kill()
                    proc.wait()
                    return
                if not line.startswith("scancel: ") or "error" in low:
                    lines.append(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        if rc < 0:
            raise SlurmUnreachable(f"{what}: no answer within {self.timeout:g}s: is slurmctld running?")
        if rc != 0:
            raise _classify(what, "".join(lines), rc)

    def requeue_hold(self, job_id: str) -> None:
        self._run(["scontrol", "requeuehold", _job_id(job_id)], f"requeuehold job {job_id}")

    def hold(self, job_id: str) -> None:
        self._run(["scontrol", "hold", _job_id(job_id)], f"hold job {job_id}")

    def release(self, job_id: str) -> None:
        self._run(["scontrol", "release", _job_id(job_id)], f"release job {job_id}")

    def update(self, job_id: str, **fields: str) -> None:
        """scontrol update jobid=JOB k=v ...; a `gres=` change goes through `_set_gres` (see there)."""
        if not fields:
            return
        jid = _job_id(job_id)
        args = []
        gres: str | None = None
        for key, value in fields.items():
            if not _FIELD.fullmatch(key) or key.lower() in ("jobid", "tresspernode", "trespernode"):
                raise InvalidRequest(f"bad job field {key!r} for scontrol update (set GPUs with gres=...)")
            if any(c.isspace() for c in str(value)) or not str(value):
                raise InvalidRequest(f"bad value {value!r} for {key}: no whitespace, not empty")
            if key.lower() == "gres":
                gres = str(value)
            else:
                args.append(f"{key}={value}")
        if gres is not None:
            self._set_gres(jid, gres)
        if args:
            self._run(["scontrol", "update", f"jobid={jid}", *args], f"update job {jid}")

    def _set_gres(self, jid: str, gres: str) -> None:
        """Replace a pending job's gres with exactly `gres` (e.g. "gpu:g0:1,gpu:g2:1").

        Where Slurm MERGES a gres update into the job's earlier typed gres (22.05: gpu:g1 then gpu:g2,gpu:g3
        runs on g1,g2,g3), clearing TresPerNode first makes the update a replacement for whole GPUs; there
        clearing a job's shards crashes slurmctld when it schedules the job (divide error: "job_spec lacks
        GRES counter") and a switch between gpu and shard is refused, so a job without gres may get
        anything, gpu -> gpu is cleared and replaced, shards may only be kept or added to, and anything
        else is refused here, before Slurm is touched. Where Slurm replaces the request and switches kinds
        (`SlurmCapabilities.gres_kind_switch`), the update is one `scontrol update`. Either way the result
        is read back and must be exactly `gres`.
        """
        new = requested_gres(gres)
        if not new:
            raise InvalidRequest(f"bad gres {gres!r}: use e.g. gpu:g0:1,gpu:g2:1 or shard:g1:1")
        job = self.job(jid)
        if not job.pending:
            raise InvalidRequest(f"job {jid} is {job.state}: hold it (held requeue) before changing its GPUs")
        old = requested_gres(job.tres_per_node)
        if old == new:
            return
        what = f"set gres of job {jid}"
        caps = self.capabilities()
        old_kinds = {k for k, _ in old}
        new_kinds = {k for k, _ in new}
        if not caps.gres_kind_switch:
            if old and old_kinds != new_kinds:
                raise InvalidRequest(
                    f"{what}: Slurm {caps.release_text} cannot switch a job between whole GPUs and shards "
                    f"({job.tres_per_node} -> {gres}); submit managed jobs without --gres so their first "
                    "placement can be either"
                )
            if "shard" in old_kinds and not old <= new:
                raise InvalidRequest(
                    f"{what}: Slurm {caps.release_text} cannot take shards away from a job ({job.tres_per_node} "
                    f"-> {gres}): clearing them crashes slurmctld; keep the job's shards or only add to them"
                )
        clear = caps.gres_update_merges and bool(old) and "shard" not in old_kinds
        if clear:
            self._run(["scontrol", "update", f"jobid={jid}", "TresPerNode="], f"{what} (clear)")
        try:
            self._run(["scontrol", "update", f"jobid={jid}", f"gres={gres}"], what)
        except SlurmError:
            if clear:
                # Never leave a cleared job behind: released like that it would run without GPUs.
                restore = write_gres(parse_gres(job.tres_per_node))
                with contextlib.suppress(SlurmError):
                    self._run(["scontrol", "update", f"jobid={jid}", f"gres={restore}"], f"{what} (restore)")
            raise
        now = requested_gres(self.job(jid).tres_per_node)
        if now != new:
            raise SlurmError(f"{what}: Slurm kept {sorted(now)} instead of {sorted(new)}: do not release the job")

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        """scancel JOB; a job that already finished counts as cancelled."""
        try:
            self._run(["scancel", _job_id(job_id)], f"cancel job {job_id}", as_user=as_user)
        except InvalidRequest as exc:
            if not any(s in str(exc).lower() for s in _ALREADY_DONE):
                raise

    def tenants(self) -> Tenants:
        """Shares and GPU limits from two `sacctmgr` listings, Slurm's decayed usage from `sshare`
        (slurm/accounting.py); AccountingUnavailable when slurmdbd does not answer or accounting is off.
        sshare failing alone (no multifactor priority) leaves the usage out."""
        try:
            assoc = self._run(list(accounting.ASSOC_ARGV), "sacctmgr show associations")
            qos = self._run(list(accounting.QOS_ARGV), "sacctmgr show qos")
        except SlurmError as exc:
            raise AccountingUnavailable(
                f"cannot read accounts from slurmdbd ({exc}): is slurmdbd running and AccountingStorageType "
                "accounting_storage/slurmdbd? (`sacctmgr show associations` must work)"
            ) from None
        try:
            usage: str | None = self._run(list(accounting.SSHARE_ARGV), "sshare")
        except SlurmError:
            usage = None
        return accounting.read_tenants(assoc, qos, usage)

    def user_associations(self, user: str) -> accounting.UserAssociations | None:
        """`user`'s accounts and their QOS (one sacctmgr call, as that user may make it); None when the
        cluster has no accounting; AccountingUnavailable when slurmdbd does not answer."""
        try:
            out = self._run(list(accounting.user_assoc_argv(user)), "sacctmgr show user withassoc")
        except SlurmError as exc:
            if accounting.ACCOUNTING_OFF in str(exc):
                return None
            raise AccountingUnavailable(f"cannot read the associations of user {user} from slurmdbd ({exc})") \
                from None
        return accounting.parse_user_associations(user, out)


def _job_id(job_id: str) -> str:
    jid = str(job_id).strip()
    if not re.fullmatch(r"\d+(_\d+)?", jid):
        raise InvalidRequest(f"bad job id {job_id!r}: a job id is a number like 1234")
    return jid
