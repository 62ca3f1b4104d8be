"""The controller service: observe -> decide -> act -> record, on APScheduler jobs.

    ctl = Controller(config, backend, store)       # clock defaults to time.time (unix seconds)
    ctl.reconcile()                                # startup: settle the store with Slurm
    ctl.tick()                                     # one round, e.g. from a test or a demo
    ctl.run_forever()                              # reconcile, then tick / rotate / introspect until stop()

Scheduler jobs (coalesce): `tick` every `config.tick` s, `rotate` every `config.quantum` s (a tick that
always runs the policy, so time slices turn over even if a tick was skipped), and `introspect` every
`config.introspect` s (records measured rates, refreshes metrics). tick and rotate share one lock, so one
plan is carried out at a time; a tick that falls during a longer round waits for it (see `_schedule`).
Any exception in a job is logged and the loop goes on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, cast

from slurm_gandiva.config import ControllerConfig, load_config
from slurm_gandiva.controller.act import CRASH_ENV, Actor, ActResult
from slurm_gandiva.controller.arrays import array_members, array_places
from slurm_gandiva.controller.cohold import co_hold_gpus
from slurm_gandiva.controller.observe import Observation, ProgressReader
from slurm_gandiva.controller.observer import Observer
from slurm_gandiva.controller.reconcile import Finding, Reconciler
from slurm_gandiva.controller.tenants import (
    TENANTS_FILE,
    USAGE_FILE,
    TenantRow,
    restore_usage,
    save_usage,
    tenant_rows,
    write_tenants,
)
from slurm_gandiva.errors import ConfigError, GandivaError
from slurm_gandiva.model import ClusterView, Placement, Topology
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.requeue.operations import Operations
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.round import RoundInputs, backoff_delay, run_round
from slurm_gandiva.slurm.base import SlurmBackend, Snapshot
from slurm_gandiva.store.api import StoreApi
from slurm_gandiva.store.memo import MemoStore

log = logging.getLogger(__name__)

# How long a stopping controller waits for the starts its last rounds left running on (each ends within the
# protocol's start timeout; one cut short is finished by the next controller's recovery).
STOP_STARTS_S = 30.0
BACKOFF_EVENT = "backoff"  # a job's failed move, and how long it is not tried again (`gandiva squeue` REASON)
LIMIT_EVENT = "gpu-limit"  # a job that asks more GPUs than a limit over it allows (`gandiva squeue` REASON)


def make_configured_policy(cfg: ControllerConfig) -> Policy:
    """The policy the config names, with its [policy] parameters (ConfigError when unknown).

    A time-slicing policy (one whose quantum is not None) gets the config's `quantum` unless [policy]
    sets its own.
    """
    from slurm_gandiva.selector import check_params, make_policy

    try:
        params = check_params(cfg.policy, cfg.params)
        policy = make_policy(cfg.policy, **params)
        if "quantum" not in params and getattr(policy, "quantum", None) is not None:
            policy = make_policy(cfg.policy, **params, quantum=cfg.quantum)
    except ConfigError as exc:
        raise ConfigError(f"{cfg.source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{cfg.source}: policy {cfg.policy!r} rejects its parameters ({exc}); fix [policy]") from None
    if cfg.fairness == "shares":
        from slurm_gandiva.selector.fairshare import FairShare

        fair = FairShare(policy, half_life=cfg.fairness_half_life, steer_grows=cfg.fairness_steer_grows)
        return cast(Policy, fair)  # `name` is its inner's, read-only
    return policy


def load_topology(cfg: ControllerConfig) -> Topology:
    from slurm_gandiva.topology.file import read_topology

    if not cfg.topology_file.is_file():
        raise ConfigError(
            f"{cfg.source}: topology file {cfg.topology_file} does not exist; "
            "run `gandiva topology collect` (or devcluster up) to write it"
        )
    return read_topology(cfg.topology_file)


def check_partitions(cfg: ControllerConfig, backend: SlurmBackend) -> None:
    """ConfigError (one line) when a configured partition is not one of Slurm's."""
    if not cfg.partitions:
        return
    known = {p for n in backend.nodes() for p in n.partitions}
    missing = [p for p in cfg.partitions if p not in known]
    if missing:
        have = ", ".join(sorted(known)) or "none"
        raise ConfigError(
            f"{cfg.source}: partition {missing[0]!r} does not exist in Slurm (it has {have}); fix partitions"
        )


def check_database_of(cfg: ControllerConfig) -> str:
    """Whether the controller could open its store (see store.check_database), as a start would."""
    from slurm_gandiva.store import check_database

    if not cfg.database_url and not cfg.state_dir.is_dir():
        parent = next((d for d in cfg.state_dir.parents if d.exists()), Path("/"))
        if cfg.state_dir.exists() or not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{cfg.source}: state_dir {cfg.state_dir} cannot be created; fix state_dir")
        return f"state_dir {cfg.state_dir} and its database will be created"
    try:
        return check_database(cfg.db_url)
    except ConfigError as exc:
        raise ConfigError(f"{cfg.source}: {exc}") from None


@dataclass(frozen=True)
class Checked:
    """What `check_config` built and found: the policy and topology a start (or reload) would use."""

    config: ControllerConfig
    policy: Policy
    topology: Topology
    database: str


def check_config(cfg: ControllerConfig, backend: SlurmBackend, *, database: bool = True) -> Checked:
    """Everything a start validates, without starting: the policy and its parameters (types, ranges), the
    topology file, the partitions (against Slurm's) and, with `database`, the store. ConfigError (one line)
    on the first problem. `gandiva controller --check` and a SIGHUP reload both use it."""
    policy = make_configured_policy(cfg)
    topology = load_topology(cfg)
    check_partitions(cfg, backend)
    db = check_database_of(cfg) if database else ""
    return Checked(cfg, policy, topology, db)


@dataclass(frozen=True)
class TickReport:
    """What one tick saw and did."""

    at: float
    view: ClusterView | None
    plan: Plan
    results: tuple[ActResult, ...]
    findings: tuple[Finding, ...]
    error: str = ""


class Controller:
    """The live controller. `clock` gives unix seconds (the store's and Slurm's time base)."""

    def __init__(
        self,
        config: ControllerConfig,
        backend: SlurmBackend,
        store: StoreApi,
        clock: Callable[[], float] = time.time,
        *,
        policy: Policy | None = None,
        protocol: Operations | None = None,
        topology: Topology | None = None,
        progress_reader: ProgressReader | None = None,
        config_path: str | os.PathLike[str] | None = None,
        crash_at: str | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        # Rounds read the store through the controller's memory of it (store/memo.py): this process is
        # its only writer while it holds the controller lock.
        self._memo = store if isinstance(store, MemoStore) else MemoStore(store)
        self.store: StoreApi = self._memo
        store = self._memo
        self.clock = clock
        self.config_path = config_path
        self.policy = policy if policy is not None else make_configured_policy(config)
        self.topology = topology if topology is not None else load_topology(config)
        self.observer = Observer(backend, self._memo, clock, progress_reader)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._lock = threading.Lock()
        self._collect_s = 0.0  # how long the last collection between rounds took
        self._backoff: dict[str, float] = {}  # job id -> until when its failed moves are not retried
        self._failures: dict[str, int] = {}  # job id -> its failed moves in a row (the back-off grows with them)
        self._over_limit: dict[str, str] = {}  # job id -> why no GPU limit lets it start (recorded once)
        self._scheduler: Any = None
        self.metrics = _make_metrics()
        self._metrics_server: Any = None
        self.last_report: TickReport | None = None
        self.actor = Actor(
            backend,
            store,
            clock=clock,
            crash_at=crash_at if crash_at is not None else os.environ.get(CRASH_ENV),
            should_stop=self._stop.is_set,
            metrics=self.metrics,
        )
        self.protocol = protocol if protocol is not None else self._make_protocol()
        self.actor.protocol = self.protocol
        self.reconciler = self._make_reconciler()
        self._reconciled = False

    def _co_hold(self) -> int:
        """The most GPUs of a job held as shards (`cohold.co_hold_gpus`; 0: co-holding off), told the actor and
        the reconciler."""
        most = co_hold_gpus(self.config.co_hold, self.backend.capabilities())
        self.actor.co_hold = self.reconciler.co_hold = most
        return most

    def _make_protocol(self) -> Operations:
        """The requeue protocol. The actor and the reconciler name each job's own signal (`act.job_signal`);
        jobs without one are stopped with the configured signal."""
        from slurm_gandiva.requeue.protocol import RequeueProtocol
        from slurm_gandiva.slurm.coalesce import CoalescedReads

        return RequeueProtocol(
            self.backend,
            signal_name=self.config.signal,
            suspend_timeout=self.config.suspend_timeout,
            journal=self.actor.journal,
            jobs_root=self.config.job_root,
            reads=CoalescedReads(self.backend),  # the actor's threads' polls share queries
        )

    def _make_reconciler(self) -> Reconciler:
        rec = Reconciler(
            self.backend,
            self.store,
            partitions=self.config.partitions,
            jobs_root=self.config.job_root,
            clock=self.clock,
            stop_timeout=self.config.suspend_timeout,
            max_registrations=self.config.max_registrations,
        )
        rec.parked = self.observer.parked  # one memo of which jobs are parked
        return rec

    # -- observe --------------------------------------------------------------------------------------
    def observe(self, snap: Snapshot, starting: Mapping[str, Placement] | None = None) -> Observation:
        """The view of the managed, registered, unfinished jobs (`Observer.observe`); `starting`: the
        jobs being started after their round, and where (`Actor.starting`)."""
        return self.observer.observe(snap, self.reconciler.managed.of(snap), self.config, self.topology, starting)

    @property
    def file_problems(self) -> dict[str, str]:
        """Job id -> why its files were refused in the last round."""
        return self.observer.file_problems

    # -- the loop -------------------------------------------------------------------------------------
    def reconcile(self) -> tuple[Finding, ...]:
        """Startup: finish or roll back half-done decisions, then settle the store with Slurm."""
        with self._lock:
            self._co_hold()
            snap = self.backend.snapshot()
            found = self.reconciler.recover(snap, self.protocol)
            found += self.reconciler.settle(self.backend.snapshot())
            self._reconciled = True
            self.store.record_event("controller-start", None, f"reconciled: {len(found)} differences", self.clock())
            return found

    def tick(self) -> TickReport:
        """One round: observe -> decide -> act -> record. Never raises for a failing job or decision.

        Python's automatic cycle collection is paused for the round (`_no_collection`): with 10,000
        managed jobs a full collection walks the controller's few hundred thousand long-lived objects
        (0.1-0.2 s) and fell inside every other round. The scheduler's tick job collects right after the
        round instead (`collect_garbage`), in the time left before the next tick."""
        if not self._reconciled:
            self.reconcile()
        with self._lock, _no_collection():
            return self._tick()

    rotate = tick  # the quantum job: the policy sees slice ages and turns slices over

    def collect_garbage(self) -> None:
        """A full cycle collection, between rounds (see `tick`)."""
        t = time.perf_counter()
        gc.collect()
        self._collect_s = time.perf_counter() - t

    def _collect_before_next_tick(self) -> None:
        """`collect_garbage`, when it ends well before the next tick on the grid (twice the last one's
        time, and a quarter second, left) and no round runs yet (a tick that waited for the round before
        has the lock): a round is not made late by it (automatic collection, on between rounds, still
        runs)."""
        left = self.config.tick - time.time() % self.config.tick
        if left > 2 * self._collect_s + 0.25 and not self._lock.locked():
            self.collect_garbage()

    def _round_job(self) -> None:
        """The scheduler's tick (and rotate) job: one round, then the collection it put off."""
        try:
            self.tick()
        finally:
            self._collect_before_next_tick()

    def _rotate_job(self) -> None:
        try:
            self.rotate()
        finally:
            self._collect_before_next_tick()

    def _tick(self) -> TickReport:
        now = self.clock()
        findings: tuple[Finding, ...] = ()
        view: ClusterView | None = None
        try:
            self._note_failures(self.actor.ended_starts())
            self._co_hold()
            starting = self.actor.starting()
            snap = self.backend.snapshot()
            findings = self.reconciler.settle(snap, starting)
            if findings:
                snap = self.backend.snapshot()
            obs = self.observe(snap, starting)
            view = obs.view
            errs = view.consistency_errors()
            if errs:
                log.error("Slurm shows an inconsistent cluster: %s", "; ".join(errs))
            plan = self._round(obs)
            if self.config.round_log is not None:
                log_round(self.config.round_log, view, plan, int(self.config.round_log_max_mb * 1e6))
            bad = plan.apply(view).consistency_errors() if plan else []
            if bad and not errs:
                msg = "; ".join(bad)
                log.error("policy %s proposed an impossible plan, not acting: %s", self.policy.name, msg)
                self.store.record_event("bad-plan", None, msg, now)
                return self._report(TickReport(now, view, plan, (), findings, f"bad plan: {msg}"))
            held = {j.job_id: j.placement for j in view.running if j.placement is not None}
            parked = view.co_hold.parked if view.co_hold is not None else {}
            held.update(parked)  # a parked job holds a shard of its GPUs until it unparks or leaves them
            self.actor.parked = frozenset(parked)
            ties = self.backend.capabilities().requeue_keeps_gpu_indices
            last = self.observer.last_placements(plan) if ties and plan else {}
            groups, room = array_places(obs.managed) if plan else ({}, {})
            results = self.actor.execute(plan, held, last, ties=ties, groups=groups, room=room) if plan else ()
            self.observer.note_trials(view, results)
            self._note_failures(results)
            return self._report(TickReport(now, view, plan, results, findings))

        except Exception as exc:
            log.exception("tick failed; the next tick tries again")
            return self._report(TickReport(now, view, Plan(), (), findings, f"{type(exc).__name__}: {exc}"))

    @staticmethod
    def _after(rep: TickReport) -> ClusterView | None:
        """The view once the decisions that succeeded took effect."""
        if rep.view is None:
            return None
        done = tuple(r.decision for r in rep.results if r.ok)
        return Plan(done).apply(rep.view) if done else rep.view

    def _report(self, rep: TickReport) -> TickReport:
        self.last_report = rep
        try:
            after = self._after(rep)
            rows = self._tenant_table(after) if after is not None else None
            if self.metrics is not None:
                if after is not None:
                    self.metrics.observe_view(after)
                if rows is not None:
                    self.metrics.observe_tenants(rows)
                self.metrics.tick(max(0.0, self.clock() - rep.at))
                if rep.error:
                    self.metrics.error("tick")
        except Exception:
            log.exception("metrics update failed")
        return rep

    def _tenant_table(self, view: ClusterView) -> list[TenantRow]:
        """The round's per-tenant table (`tenant_rows`), written for `gandiva sshare`."""
        rows = tenant_rows(view, self.policy)
        try:
            write_tenants(self.config.state_dir / TENANTS_FILE, rows, view.now)
        except OSError as exc:
            log.debug("cannot write the tenant table: %s", exc)
        save_usage(self.config.state_dir / USAGE_FILE, self.policy)
        return rows

    def _round(self, obs: Observation) -> Plan:
        """The round's plan (`run_round`: the policy, then the rules of every round), what it kept back
        logged. The rules read the jobs' progress reports, the back-off table and the array tasks as Slurm
        counts them."""
        now = obs.view.now
        for jid in [j for j, until in self._backoff.items() if until <= now]:
            del self._backoff[jid]
        known = {j.job_id for j in obs.view.jobs}
        for jid in [j for j in self._failures if j not in known]:
            del self._failures[jid]
        inputs = RoundInputs(obs.claims, self._backoff, array_members(obs.managed), self.config.quantum)
        restore_usage(self.config.state_dir / USAGE_FILE, self.policy, now)  # a new policy's first round only
        out = run_round(self.policy, obs.view, inputs)
        if out.spared:
            log.info("jobs %s are finishing: not stopping them this tick", ", ".join(out.spared))
        if out.throttled:
            log.debug(
                "array throttle: not placing %s this round (%%MAX tasks of their array run)", ", ".join(out.throttled)
            )
        if out.held_back:
            log.info("not retrying failed moves yet for jobs %s", ", ".join(sorted(self._backoff)))
        if out.limited:
            log.debug("GPU limits: not placing %s this round (their account or QOS holds its GPUs)",
                      ", ".join(out.limited))
        self._note_over_limit(out.over_limit, now)
        return out.plan

    def _note_over_limit(self, over: Mapping[str, str], now: float) -> None:
        """Tell once (log and `gpu-limit` event: `gandiva squeue`'s REASON) of each job that a GPU limit
        keeps waiting for good, and again if the reason changes."""
        for jid, why in over.items():
            if self._over_limit.get(jid) != why:
                log.warning("job %s waits: %s (ask fewer GPUs, or another account or QOS)", jid, why)
                self.store.record_event(LIMIT_EVENT, jid, why, now)
        self._over_limit = dict(over)

    def _note_failures(self, results: tuple[ActResult, ...]) -> None:
        """Back off the jobs whose move failed (within the round, or a start that ran on after it and that
        Slurm refused or did not run in time), longer after each failure in a row (`backoff_delay`); the
        wait is recorded (`backoff` event: `gandiva squeue`'s REASON). A move that succeeded ends the row; a
        resume skipped for Slurm's requeue tie (`ActResult.tied`) waits one quantum, outside the row. A
        start Slurm's accounting held back has the tenants read again, so that the limit rule knows it."""
        now = self.clock()
        for r in results:
            jid = r.decision.job_id
            if r.decision.action is Action.SUSPEND or (r.decision_id is None and not r.tied):
                continue
            if r.ok:
                if not r.starting:
                    self._failures.pop(jid, None)
                continue
            if r.limited:  # a limit the last tenants read did not have: read them again for the next round
                self.observer.tenants.expire()
            if r.tied:
                # The round's placement, not the job, failed: one quantum (the next rotation places it
                # elsewhere), not a failure in a row that doubles its wait up to 16 quanta.
                delay = backoff_delay(1, self.config.quantum)
                detail = f"{r.decision.action.value} not tried for {delay:.0f} s, its GPUs go to others; {r.detail}"
            else:
                n = self._failures.get(jid, 0) + 1
                self._failures[jid] = n
                delay = backoff_delay(n, self.config.quantum)
                detail = (f"{r.decision.action.value} failed ({n} in a row): not tried again for {delay:.0f} s, "
                          f"its GPUs go to others meanwhile; {r.detail}")
            self._backoff[jid] = now + delay
            log.log(logging.INFO if r.tied else logging.WARNING, "job %s: %s", jid, detail)
            self.store.record_event(BACKOFF_EVENT, jid, detail, now)

    def introspect(self) -> int:
        """Record the running jobs' measured rates (by GPU count and locality); returns how many."""
        rep = self.last_report
        view = rep.view if rep is not None else None
        if view is None:
            return 0
        n = 0
        now = self.clock()
        for job in view.running:
            if job.measured_rate is None or job.placement is None:
                continue
            try:
                loc = view.topology.locality(job.placement.gpus)
                self.store.record_rate(job.job_id, job.placement.count, loc, job.measured_rate, now)
                n += 1
            except Exception:
                log.exception("job %s: could not record its rate", job.job_id)
        return n

    # -- service --------------------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT: finish the step in flight and stop; SIGHUP: re-read the config."""

        def on_term(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: stopping after the step in flight", signal.Signals(signum).name)
            self.stop()

        def on_hup(_signum: int, _frame: FrameType | None) -> None:
            self._reload.set()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)

    def stop(self) -> None:
        """Ask the loop to stop: decisions not yet started are dropped; the one in flight finishes."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_reload(self) -> None:
        self._reload.set()

    def reload(self) -> bool:
        """Re-read the config file; keep the old config when the new one is bad. True when applied."""
        if self.config_path is None:
            log.warning("reload: the controller was not started from a config file")
            return False
        try:
            cfg = load_config(self.config_path)
            if cfg.db_url != self.config.db_url:
                raise ConfigError(
                    f"{cfg.source}: the database changed ({self.config.db_url} -> {cfg.db_url}): "
                    "restart the controller to use another database"
                )
            checked = check_config(cfg, self.backend, database=False)  # the running store answers
            policy, topo = checked.policy, checked.topology
        except GandivaError as exc:
            log.error("reload refused, keeping the running config: %s", exc)
            self.store.record_event("config-reload-refused", None, str(exc), self.clock())
            return False
        with self._lock:
            old = self.config
            self.config, self.policy, self.topology = cfg, policy, topo
            proto: Any = self.protocol
            if hasattr(proto, "signal_name"):
                proto.signal_name = cfg.signal
                proto.suspend_timeout = cfg.suspend_timeout
            self.reconciler = self._make_reconciler()
        if self._scheduler is not None and (old.tick, old.quantum, old.introspect) != (
            cfg.tick, cfg.quantum, cfg.introspect
        ):
            self._schedule(self._scheduler, cfg)
        log.info("config reloaded from %s (policy %s)", self.config_path, cfg.policy)
        self.store.record_event("config-reload", None, f"policy {cfg.policy}, quantum {cfg.quantum:g}", self.clock())
        return True

    def _guarded(self, name: str, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            if self._stop.is_set():
                return
            try:
                fn()
            except Exception:
                log.exception("scheduler job %s failed; it runs again at its next time", name)
                if self.metrics is not None:
                    self.metrics.error(name)

        return run

    def _schedule(self, sched: Any, cfg: ControllerConfig) -> None:
        """(Re)schedule the jobs. Rounds fall on multiples of the tick in wall time (a fixed grid, as the
        simulator's ticks and Gandiva's rotations on multiples of the quantum): whether a job's end is
        seen at one tick or the next then does not hang on when the service started. A separate
        rotation job runs only when the ticks do not fall on every multiple of the quantum.

        A tick that falls while the round before still runs (one with actions past the tick) is not
        dropped: it waits for that round (the controller's lock) and runs as soon as it ends, late
        (`max_instances=2`: one waits at most; a round longer than two ticks still drops the ticks
        between). A round that ends before the next multiple of the tick leaves that tick on time."""
        sched.add_job(
            self._guarded("tick", self._round_job), _grid_trigger(cfg.tick), id="tick", replace_existing=True,
            max_instances=2,
        )
        if _multiple(cfg.quantum, cfg.tick):
            if sched.get_job("rotate") is not None:
                sched.remove_job("rotate")
        else:
            sched.add_job(
                self._guarded("rotate", self._rotate_job), _grid_trigger(cfg.quantum), id="rotate",
                replace_existing=True, max_instances=2,
            )
        sched.add_job(
            self._guarded("introspect", self.introspect), "interval", seconds=cfg.introspect, id="introspect",
            replace_existing=True,
        )

    def run_forever(self, *, metrics: bool = True) -> int:
        """Reconcile, then run the scheduler jobs until stop() (or SIGTERM); returns the exit code 0."""
        from apscheduler.schedulers.background import BackgroundScheduler

        if metrics and self.config.metrics_port:
            self._start_metrics()
        self.reconcile()
        sched = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        cfg = self.config
        self._schedule(sched, cfg)
        self._scheduler = sched
        sched.start()
        log.info(
            "controller running: policy %s, tick %g s, quantum %g s, partitions %s; %s on %s",
            cfg.policy, cfg.tick, cfg.quantum, ",".join(cfg.partitions) or "all",
            type(self.backend).__name__, self.backend.capabilities().describe(),
        )
        try:
            while not self._stop.is_set():
                self._stop.wait(0.5)
                if self._reload.is_set():
                    self._reload.clear()
                    self.reload()
        finally:
            sched.shutdown(wait=True)  # waits for the tick in flight, which stops after its current step
            if not self.actor.wait_started(timeout=STOP_STARTS_S):
                log.warning("stopping with starts still under way: the next controller settles them")
            self._scheduler = None
            self.store.record_event("controller-stop", None, "stopped", self.clock())
            if self._metrics_server is not None:
                self._metrics_server.stop()
                self._metrics_server = None
            log.info("controller stopped")
        return 0

    def _start_metrics(self) -> None:
        if self.metrics is None:
            log.warning("prometheus-client is not installed: no metrics endpoint")
            return
        try:
            self._metrics_server = self.metrics.serve(self.config.metrics_port, self.config.metrics_addr)
            log.info("metrics on http://%s:%d/metrics", self.config.metrics_addr, self._metrics_server.port)
        except OSError as exc:
            raise ConfigError(
                f"{self.config.source}: cannot serve metrics on port {self.config.metrics_port} ({exc}); "
                "pick a free metrics_port or 0 to turn it off"
            ) from None


def round_record(view: ClusterView, plan: Plan) -> dict[str, Any]:
    """What the policy saw of each job in one round and what it decided (a `round_log` line)."""

    def where(p: Placement | None) -> str:
        return str(p) if p is not None else ""

    jobs = []
    for j in view.jobs:
        left = j.remaining_time(j.gpus or j.spec.min_gpus)
        jobs.append({
            "job": j.job_id,
            "state": j.state.value,
            "gpus": where(j.placement),
            "submit": j.spec.submit_time,
            "progress": round(j.progress, 1),
            "service": round(j.attained_service, 2),
            "slice_start": j.slice_start,
            "last_run_end": j.last_run_end,
            "left_s": round(left, 2) if math.isfinite(left) else None,
            "held_indices": sorted(j.requeue_indices),
        })
    decisions = [
        {"job": d.job_id, "action": d.action.value, "gpus": where(d.placement), "reason": d.reason}
        for d in plan.decisions
    ]
    return {"at": view.now, "jobs": jobs, "decisions": decisions}


def log_round(path: Path, view: ClusterView, plan: Plan, max_bytes: int) -> None:
    """Append the round's record to `path` (JSON lines). When it would take the file past `max_bytes`, the
    file is first renamed to `<path>.1`, replacing the one before: the log keeps the latest rounds in at
    most two files of `max_bytes` each (a single larger round is written whole). A failure is logged,
    never raised."""
    try:
        line = (json.dumps(round_record(view, plan), sort_keys=True) + "\n").encode("utf-8")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
        with path.open("ab") as f:
            f.write(line)
    except (OSError, ValueError) as exc:
        log.warning("cannot write the round log %s: %s", path, exc)


def _make_metrics() -> Any:
    """H6's Prometheus metrics on a private registry (None when prometheus-client is missing)."""
    try:
        from slurm_gandiva.controller.metrics import Metrics
    except ImportError:
        return None
    return Metrics()


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """Automatic cycle collection off inside the block (as it was after it); reference counting still
    frees what the block drops."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _grid_trigger(seconds: float, now: float | None = None) -> Any:
    """An interval trigger that fires at the multiples of `seconds` in unix time."""
    import datetime

    from apscheduler.triggers.interval import IntervalTrigger

    now = time.time() if now is None else now
    first = math.ceil(now / seconds) * seconds
    start = datetime.datetime.fromtimestamp(first, datetime.timezone.utc)
    return IntervalTrigger(seconds=seconds, start_date=start, timezone=datetime.timezone.utc)


def _multiple(of: float, step: float) -> bool:
    """Whether `of` is a whole multiple of `step` (every multiple of `of` is one of `step`)."""
    n = round(of / step)
    return n >= 1 and abs(n * step - of) < 1e-6
