"""`gandiva controller`, `gandiva squeue`, `gandiva sshare` and `gandiva cancel`."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurm_gandiva.errors import GandivaError, PermissionDenied, UnknownJob

if TYPE_CHECKING:
    from slurm_gandiva.slurm.base import SlurmBackend


def register(sub: Any) -> None:
    """Add the controller's sub-commands to the `gandiva` parser."""
    p = sub.add_parser("controller", help="run the controller service (as root or SlurmUser)")
    p.add_argument("--config", "-c", help="config file (default: $GANDIVA_CONF, /etc/gandiva/gandiva.conf)")
    p.add_argument("--once", action="store_true", help="reconcile, run one tick, and exit")
    p.add_argument("--check", action="store_true", help="only validate the config and the privileges")
    p.set_defaults(func=cmd_controller)

    q = sub.add_parser("squeue", help="managed jobs: state, GPUs, slices, rate")
    q.add_argument("--config", "-c", help="config file (default: $GANDIVA_CONF, /etc/gandiva/gandiva.conf)")
    q.add_argument("-u", "--user", help="only this user's jobs")
    q.add_argument("--json", action="store_true", help="JSON output")
    q.set_defaults(func=cmd_squeue)

    t = sub.add_parser("sshare", help="tenants (account, user): share, entitled GPUs, held, waiting, GPU-hours "
                       "(ours and Slurm's)")
    t.add_argument("--config", "-c", help="config file (default: $GANDIVA_CONF, /etc/gandiva/gandiva.conf)")
    t.add_argument("--json", action="store_true", help="JSON output")
    t.set_defaults(func=cmd_sshare)

    c = sub.add_parser("cancel", help="cancel your own managed job, a job array (ARRAY) or one of its tasks "
                       "(ARRAY_TASK); root may cancel any")
    c.add_argument("job_ids", nargs="+", metavar="JOB")
    c.add_argument("--config", "-c", help="config file (for SLURM_CONF; optional)")
    c.set_defaults(func=cmd_cancel)


def _logging_to_stderr() -> None:
    import logging

    root = logging.getLogger()
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    # APScheduler logs every run of every job at INFO: keep the log for what the controller does.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def backend_line(backend: SlurmBackend) -> str:
    """Which backend talks to which Slurm, and what that Slurm does (for --check and the start log)."""
    return f"{type(backend).__name__} on {backend.capabilities().describe()}"


def cmd_controller(args: argparse.Namespace) -> int:
    from slurm_gandiva.config import check_privilege, load_config
    from slurm_gandiva.controller.service import Controller, check_config
    from slurm_gandiva.requeue.namespace import old_layout_note
    from slurm_gandiva.slurm import make_backend
    from slurm_gandiva.store import Store

    cfg = load_config(args.config)
    user = check_privilege(cfg)
    if args.check:
        env = {"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf is not None else None
        backend = make_backend(env)
        checked = check_config(cfg, backend)
        parts = ",".join(cfg.partitions) or "all partitions"
        print(
            f"{cfg.source}: ok (policy {cfg.policy}, quantum {cfg.quantum:g} s, {len(checked.topology.nodes)} "
            f"nodes, {parts}, {checked.database}, runs as {user}); {backend_line(backend)}"
        )
        note = old_layout_note(cfg.job_root)
        if note is not None:
            print(f"{cfg.source}: {note}")
        return 0
    _logging_to_stderr()
    env = {"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf is not None else None
    backend = make_backend(env)
    check_config(cfg, backend, database=False)  # opening the store below checks the database
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.db_url)
    lock = None
    try:
        lock = store.lock_controller()  # one controller per state: a second one refuses, naming the first
        ctl = Controller(cfg, backend, store, config_path=cfg.source)
        if args.once:
            ctl.reconcile()
            rep = ctl.tick()
            ctl.actor.wait_started()  # the round's starts that run on after it, before the lock is released
            for r in rep.results:
                print(f"{r.decision.job_id}\t{r.decision.action.value}\t{r.outcome.value}\t{r.detail}")
            return 1 if rep.error else 0
        ctl.install_signal_handlers()
        return ctl.run_forever()
    finally:
        if lock is not None:
            lock.release()
        store.close()


@dataclass(frozen=True)
class QueueRow:
    """One line of `gandiva squeue`."""

    job_id: str
    user: str
    name: str
    state: str
    gpus: str
    want: str
    slices: int
    rate: float | None
    progress: str
    reason: str = ""  # why the job's own files were refused, when they were

    def as_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id, "user": self.user, "name": self.name, "state": self.state,
            "gpus": self.gpus, "request": self.want, "slices": self.slices, "rate": self.rate,
            "progress": self.progress, "reason": self.reason,
        }


def queue_rows(cfg: Any, backend: Any, store: Any, user: str | None = None) -> list[QueueRow]:
    """Managed jobs from Slurm (state, GPUs) joined with the store (slices, rate) and progress files."""
    from pathlib import Path

    from slurm_gandiva.controller.arrays import array_window
    from slurm_gandiva.controller.claims import CLAIM_IGNORED
    from slurm_gandiva.controller.observe import held_placement, is_managed, slurm_state
    from slurm_gandiva.errors import JobFileError
    from slurm_gandiva.requeue.contract import JobFiles
    from slurm_gandiva.requeue.namespace import job_paths
    from slurm_gandiva.requeue.safe_read import owner_uids, read_job_progress

    snap = backend.snapshot()
    rows: list[QueueRow] = []
    managed = {sj.job_id: sj for sj in snap.jobs if is_managed(sj, cfg.partitions)}
    tracked, untracked = array_window(managed)
    for sj in managed.values():
        if sj.finished or (user and sj.user != user) or sj.job_id not in tracked:
            continue
        rec = store.get_job(sj.job_id)
        slices = store.slices(job_ids=[sj.job_id])
        state = slurm_state(sj, slices)
        placement = held_placement(sj) if sj.running else None
        rates = store.rates(sj.job_id)
        reason = ""
        try:  # the job's own file: never follow a link or wait on a FIFO there (squeue may run as root)
            if rec and rec.state_dir:
                root = Path(rec.state_dir)
            else:
                root = job_paths(cfg.job_root, sj.job_id, sj.comment, sj.user).state_dir
            prog = read_job_progress(JobFiles(root).progress, owner=sj.user)
        except JobFileError as exc:
            prog = None
            if os.geteuid() in owner_uids(sj.user):  # the reason is for who can act on it
                reason = str(exc)
        if rec is None and not reason and os.geteuid() in owner_uids(sj.user):
            reason = _registration_refusal(cfg, sj, snap.nodes)
        if rec is not None and not reason and os.geteuid() in owner_uids(sj.user):
            ignored = store.events(job_id=sj.job_id, kinds=[CLAIM_IGNORED])  # recorded once per job
            reason = ignored[-1].detail if ignored else ""
        if not reason and not sj.running:
            reason = _backoff_reason(store, sj.job_id, slices)
        rate = prog.samples_per_s if (prog is not None and sj.running and prog.samples_per_s > 0) else None
        if rate is None and rates:
            rate = rates[-1].rate
        if rec is not None:
            lo, hi = rec.spec.min_gpus, rec.spec.max_gpus
            want = f"{lo}" if lo == hi else f"{lo}:{hi}"
        else:
            want = "?"
        done = ""
        if prog is not None:
            done = f"{prog.samples}/{prog.total_samples}" if prog.total_samples else f"{prog.samples}"
        rows.append(
            QueueRow(sj.job_id, sj.user, sj.name, state.value, str(placement) if placement else "-", want,
                     len(slices), rate, done, reason)
        )
    for u in untracked.values():  # one line for an array's tail the controller does not track yet
        if not user or u.user == user:
            rows.append(QueueRow(u.job_id, u.user, u.name, "waiting", "-", "?", 0, None, "",
                                 f"{len(u.tasks)} tasks not yet tracked: they follow as the array's tasks run"))
    return rows


def _backoff_reason(store: Any, job_id: str, slices: Any) -> str:
    """The controller's last back-off of a waiting job (why its start is not tried now), or the GPU limit
    that keeps it waiting, unless the job ran since; "" when there is none."""
    from slurm_gandiva.controller.service import BACKOFF_EVENT, LIMIT_EVENT

    events = store.events(job_id=job_id, kinds=[BACKOFF_EVENT, LIMIT_EVENT])
    if not events:
        return ""
    last = max(events, key=lambda e: e.at)
    if any(s.start >= last.at for s in slices):
        return ""
    return str(last.detail)


def _registration_refusal(cfg: Any, sj: Any, nodes: Any) -> str:
    """Why the controller does not take a held job on (its spec asks for more than the cluster has), as
    registration decides it (reconcile.spec_refusal); "" when it would, or there is no spec yet."""
    from slurm_gandiva.controller.reconcile import spec_refusal
    from slurm_gandiva.errors import JobFileError
    from slurm_gandiva.requeue.namespace import job_paths
    from slurm_gandiva.requeue.spec import load_spec_file

    try:
        spec = load_spec_file(job_paths(cfg.job_root, sj.job_id, sj.comment, sj.user).spec, sj.job_id, sj.user)
    except JobFileError:
        return ""
    if spec is None:
        return ""
    return spec_refusal(spec.min_gpus, spec.max_gpus, sj.partition, nodes) or ""


def format_rows(rows: list[QueueRow]) -> str:
    head = ("JOBID", "USER", "NAME", "STATE", "GPUS", "REQ", "SLICES", "RATE", "PROGRESS", "REASON")
    table = [head] + [
        (r.job_id, r.user, r.name[:16], r.state, r.gpus, r.want, str(r.slices),
         f"{r.rate:.1f}/s" if r.rate is not None else "-", r.progress or "-", r.reason or "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)


def cmd_squeue(args: argparse.Namespace) -> int:
    from slurm_gandiva.config import load_config
    from slurm_gandiva.slurm import make_backend
    from slurm_gandiva.store import Store

    cfg = load_config(args.config)
    env = {"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf is not None else None
    store: Any
    try:
        store = Store(cfg.db_url, migrate_schema=False)
    except GandivaError as exc:
        print(f"gandiva: warning: no controller history ({exc})", file=sys.stderr)
        store = _NoHistory()
    try:
        rows = queue_rows(cfg, make_backend(env), store, args.user)
    finally:
        store.close()
    if args.json:
        print(json.dumps([r.as_json() for r in rows], indent=2))
    else:
        print(format_rows(rows))
    return 0


def cmd_sshare(args: argparse.Namespace) -> int:
    """The controller's per-tenant table of its last round (`<state_dir>/tenants.json`)."""
    from slurm_gandiva.config import load_config
    from slurm_gandiva.controller.tenants import TENANTS_FILE, format_tenants, read_tenants_file

    cfg = load_config(args.config)
    path = cfg.state_dir / TENANTS_FILE
    try:
        at, rows = read_tenants_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"gandiva: no tenant table in {path} ({exc}): is the controller running with this config?",
              file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps({"at": at, "tenants": [r.as_json() for r in rows]}, indent=2))
    else:
        print(f"as of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}")
        print(format_tenants(rows))
    return 0


class _NoHistory:
    """Stands in for the store when the database cannot be read: no records, no slices, no rates."""

    def get_job(self, _job_id: str) -> None:
        return None

    def slices(self, **_kw: object) -> tuple[()]:
        return ()

    def rates(self, _job_id: str) -> tuple[()]:
        return ()

    def events(self, **_kw: object) -> tuple[()]:
        return ()

    def close(self) -> None:
        pass


def caller_name() -> str:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_owner(job_user: str, job_id: str, caller: str, caller_uid: int) -> None:
    """Users act only on their own jobs; root may act on any."""
    if caller_uid != 0 and job_user != caller:
        raise PermissionDenied(
            f"job {job_id} belongs to {job_user}, not to you ({caller}): you can cancel only your own jobs"
        )


def cmd_cancel(args: argparse.Namespace) -> int:
    from slurm_gandiva.slurm import make_backend

    env: dict[str, str] | None = None
    if args.config:
        from slurm_gandiva.config import load_config

        cfg = load_config(args.config)
        env = {"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf is not None else None
    backend = make_backend(env)
    caller, uid = caller_name(), os.getuid()
    listed = backend.jobs()
    jobs = {j.job_id: j for j in listed}
    rc = 0
    for jid in args.job_ids:
        job = jobs.get(jid)
        tasks = [j for j in listed if j.array_id == jid] if job is None else []
        if job is None and not tasks:
            raise UnknownJob(f"no job {jid} in Slurm's queue: check the id with `gandiva squeue`")
        if tasks:  # a job array: all its tasks are its submitter's; one scancel cancels them all
            check_owner(tasks[0].user, jid, caller, uid)
            live = [t for t in tasks if not t.finished]
            if not live:
                print(f"gandiva: job array {jid} already ended: nothing to cancel", file=sys.stderr)
                continue
            backend.cancel(jid)
            print(f"cancelled job array {jid} ({len(live)} of its {len(tasks)} tasks were still queued or running)")
            continue
        assert job is not None
        check_owner(job.user, jid, caller, uid)
        if job.finished:
            print(f"gandiva: job {jid} already ended {job.state}: nothing to cancel", file=sys.stderr)
            if job.state not in ("COMPLETED", "CANCELLED"):
                rc = 1  # it ended in failure: say so in the exit status too
            continue
        backend.cancel(jid)
        left = confirm_cancel(backend, jid)
        if left is not None:
            print(f"gandiva: job {jid} is still {left} {CANCEL_CONFIRM_S:.0f} s after scancel: Slurm has not "
                  "cancelled it; run `gandiva cancel` again or ask your admin", file=sys.stderr)
            rc = 1
            continue
        print(f"cancelled job {jid}")
    return rc


CANCEL_CONFIRM_S = 30.0


def confirm_cancel(
    backend: SlurmBackend,
    job_id: str,
    *,
    timeout: float = CANCEL_CONFIRM_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Wait until Slurm shows `job_id` ended after a scancel, sending scancel again every 2 s while it still
    runs or waits: a cancel can be lost (one task of a job array, cancelled while the controller stops
    it, came back and was resumed to the end: seen on 22.05 and 25.11). None when it ended, else the
    state it is still in after `timeout`."""
    deadline = clock() + timeout
    sent = clock()
    while True:
        try:
            job = backend.job(job_id)
        except UnknownJob:
            return None
        if job.finished:
            return None
        now = clock()
        if now >= deadline:
            return job.state
        if job.state != "COMPLETING" and now - sent >= 2.0:
            backend.cancel(job_id)
            sent = now
        sleep(0.2)
