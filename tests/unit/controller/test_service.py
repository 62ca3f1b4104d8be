"""The Controller loop with a fake Slurm and protocol: tick, isolation, plan checks, stop, reload."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import ClusterView, GpuRef, JobState, Locality, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.slurm.base import SlurmJob
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.store import SliceEnd, Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


class Toy:
    """Starts waiting jobs on free GPUs of one node; suspends jobs whose slice is older than `quantum`."""

    name = "toy"

    def __init__(self, quantum: float = 1e9) -> None:
        self.quantum = quantum
        self.fail = False
        self.override: Plan | None = None

    def decide(self, view: ClusterView, now: float) -> Plan:
        if self.fail:
            raise RuntimeError("policy bug")
        if self.override is not None:
            return self.override
        free = {n.name: [g for g in view.free_gpus() if g.node == n.name] for n in view.topology.nodes}
        targets: dict[str, Placement | None] = {}
        for j in view.running:
            if j.slice_start is not None and now - j.slice_start >= self.quantum and view.waiting:
                targets[j.job_id] = None
                assert j.placement is not None
                for g in j.placement.gpus:
                    free[g.node].append(g)
        for j in view.waiting:
            for gpus in free.values():
                if len(gpus) >= j.spec.min_gpus:
                    targets[j.job_id] = Placement(tuple(gpus[: j.spec.min_gpus]))
                    del gpus[: j.spec.min_gpus]
                    break
        return Plan.from_targets(view, targets)


def make(
    tmp_path: Path, jobs: list[SlurmJob], policy: Toy | None = None, conf: str = ""
) -> tuple[Controller, FakeBackend, Store]:
    backend = FakeBackend(jobs)
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\nintrospect = 0.5\n{conf}")
    ctl = Controller(
        cfg,
        backend,
        store,
        policy=policy or Toy(),
        protocol=FakeProtocol(backend),
        topology=TOPO,
        progress_reader=lambda _p, _u: None,
    )
    return ctl, backend, store


def old(jid: str, gpus: str = "gres:gpu:1") -> SlurmJob:
    return sjob(jid, submit=time.time() - 600, tres=gpus)  # past the spec grace: plain sbatch jobs


def test_tick_registers_and_starts_jobs(tmp_path: Path) -> None:
    ctl, _backend, store = make(tmp_path, [old("1", "gres:gpu:2"), old("2", "gres:gpu:4"), old("3", "gres:gpu:4")])
    rep = ctl.tick()
    assert not rep.error
    started = {r.decision.job_id: r.decision.placement for r in rep.results if r.ok}
    assert set(started) == {"1", "2"}  # 2 + 4 GPUs on two 4-GPU nodes; job 3 waits
    assert len(store.slices()) == 2
    rep2 = ctl.tick()
    assert rep2.results == ()  # nothing changed, nothing to do
    assert {j.job_id: j.state.value for j in rep2.view.jobs} == {"1": "running", "2": "running", "3": "queued"}


def test_round_log_records_what_the_policy_saw_and_decided(tmp_path: Path) -> None:
    log = tmp_path / "rounds.jsonl"
    ctl, _backend, _store = make(
        tmp_path, [old("1", "gres:gpu:2"), old("2", "gres:gpu:4"), old("3", "gres:gpu:4")], conf=f"round_log = {log}"
    )
    ctl.tick()
    ctl.tick()
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert {j["job"]: j["state"] for j in first["jobs"]} == {"1": "queued", "2": "queued", "3": "queued"}
    assert sorted((d["job"], d["action"]) for d in first["decisions"]) == [("1", "start"), ("2", "start")]
    seen = {j["job"]: j for j in second["jobs"]}
    assert seen["1"]["state"] == "running" and seen["1"]["gpus"] == next(
        d["gpus"] for d in first["decisions"] if d["job"] == "1"
    )
    assert second["decisions"] == [] and second["at"] >= first["at"]
    # An unwritable log is a warning, never a failed round.
    log.unlink()
    log.mkdir()
    assert not ctl.tick().error


def test_round_log_is_rotated_by_size(tmp_path: Path) -> None:
    log = tmp_path / "rounds.jsonl"
    ctl, _backend, _store = make(tmp_path, [old("1"), old("2")], conf=f"round_log = {log}\nround_log_max_mb = 0.002")
    for _ in range(12):
        ctl.tick()
    rotated = log.with_name("rounds.jsonl.1")
    lines = rotated.read_text().splitlines() + log.read_text().splitlines()
    assert all(0 < p.stat().st_size <= 2000 for p in (log, rotated))
    ats = [json.loads(line)["at"] for line in lines]
    assert ats == sorted(ats) and 2 < len(ats) < 12  # the latest rounds, in order; the oldest dropped
    assert ats[-1] == ctl.last_report.view.now


def test_a_steady_round_reads_the_store_once_per_kind_of_record(tmp_path: Path) -> None:
    """The store's statements in a round with nothing to do do not grow with the number of jobs."""

    def statements(n: int) -> int:
        d = tmp_path / str(n)
        d.mkdir()
        ctl, _backend, store = make(d, [old(str(i)) for i in range(1, n + 1)])
        ctl.tick()  # registers them and starts 8 (two 4-GPU nodes)
        ctl.store.record_rate("1", 1, Locality.NODE, 5.0, time.time())
        assert ctl.tick().results == ()
        seen: list[str] = []
        sa.event.listen(store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
        rep = ctl.tick()
        assert rep.results == () and not rep.findings and not rep.error
        return len(seen)

    assert statements(3) == statements(30)


def test_time_slicing_rotates_and_keeps_history(tmp_path: Path) -> None:
    ctl, _backend, store = make(
        tmp_path, [old("1", "gres:gpu:4"), old("2", "gres:gpu:4"), old("3", "gres:gpu:4")], policy=Toy(quantum=0.3)
    )
    ctl.tick()
    time.sleep(0.35)
    rep = ctl.tick()
    acts = sorted((r.decision.action.value, r.decision.job_id) for r in rep.results)
    assert ("start", "3") in acts and any(a == "suspend" for a, _ in acts)
    reasons = [s.end_reason for s in store.slices() if s.end is not None]
    assert reasons and all(r is SliceEnd.QUANTUM for r in reasons)


def test_failing_policy_is_isolated(tmp_path: Path) -> None:
    pol = Toy()
    ctl, _b, _store = make(tmp_path, [old("1")], policy=pol)
    pol.fail = True
    rep = ctl.tick()
    assert "policy bug" in rep.error
    pol.fail = False
    assert [r.ok for r in ctl.tick().results] == [True]


def test_double_booking_plan_is_refused(tmp_path: Path) -> None:
    pol = Toy()
    ctl, backend, store = make(tmp_path, [old("1"), old("2")], policy=pol)
    ctl.reconcile()
    g = Placement((GpuRef("n1", 0),))
    pol.override = Plan((Decision(Action.START, "1", g), Decision(Action.START, "2", g)))
    rep = ctl.tick()
    assert rep.error.startswith("bad plan") and rep.results == ()
    assert store.slices() == () and backend.calls.count(("release", "1")) == 0
    assert [e.kind for e in store.events(kinds=["bad-plan"])] == ["bad-plan"]


def test_run_forever_ticks_until_stopped(tmp_path: Path) -> None:
    ctl, _b, store = make(tmp_path, [old("1"), old("2")])
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(ctl.run_forever(metrics=False)))
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and len(store.slices()) < 2:
        time.sleep(0.05)
    ctl.stop()
    t.join(timeout=10)
    assert out == [0] and not t.is_alive()
    assert len(store.slices()) == 2
    kinds = [e.kind for e in store.events()]
    assert "controller-start" in kinds and kinds[-1] == "controller-stop"


def test_sigterm_stops_and_sighup_requests_reload(tmp_path: Path) -> None:
    ctl, _b, _s = make(tmp_path, [])
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        ctl.install_signal_handlers()
        signal.raise_signal(signal.SIGHUP)
        assert ctl._reload.is_set() and not ctl.stopping
        signal.raise_signal(signal.SIGTERM)
        assert ctl.stopping
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_reload_keeps_old_config_when_new_one_is_bad(tmp_path: Path) -> None:
    ctl, _b, store = make(tmp_path, [])
    f = tmp_path / "gandiva.conf"
    f.write_text("quantum = -1\n")
    ctl.config_path = f
    assert ctl.reload() is False
    assert ctl.config.quantum == 1
    [e] = store.events(kinds=["config-reload-refused"])
    assert "gandiva.conf:1: quantum must be a positive number of seconds" in e.detail


def test_metrics_follow_the_loop(tmp_path: Path) -> None:
    ctl, _b, _s = make(tmp_path, [old("1"), old("2")])
    ctl.tick()
    text = ctl.metrics.exposition().decode()
    assert 'gandiva_jobs{state="running"} 2.0' in text
    assert "gandiva_slices_started_total 2.0" in text
    assert 'gandiva_decisions_total{action="start",outcome="succeeded"} 2.0' in text


def test_finishing_jobs_are_not_stopped_nor_their_gpus_given_away() -> None:
    from dataclasses import dataclass

    from slurm_gandiva.controller.claims import says_done
    from slurm_gandiva.model import Job, JobSpec, JobState
    from slurm_gandiva.selector.round import spare_finishing

    def finishing_jobs(progress: dict[str, P]) -> frozenset[str]:
        return frozenset(jid for jid, p in progress.items() if says_done(p))

    @dataclass(frozen=True)
    class P:
        samples: int
        total_samples: int | None
        samples_per_s: float = 1.0
        world_size: int = 1
        updated: float = 0.0
        state: str = "running"
        started: float | None = None

    g0, g1 = Placement((GpuRef("n1", 0),)), Placement((GpuRef("n1", 1),))
    jobs = (
        Job(JobSpec("1", "a", 1, 1, 0.0), JobState.RUNNING, g0),
        Job(JobSpec("2", "a", 1, 1, 0.0), JobState.RUNNING, g1),
        Job(JobSpec("3", "a", 1, 1, 0.0)),
        Job(JobSpec("4", "a", 1, 1, 0.0)),
    )
    view = ClusterView(TOPO, jobs, 0.0)
    plan = Plan((Decision(Action.SUSPEND, "1"), Decision(Action.SUSPEND, "2"),
                 Decision(Action.START, "3", g0), Decision(Action.START, "4", g1)))
    out, spared = spare_finishing(plan, view, finishing_jobs({"1": P(960, 960), "2": P(100, 960)}))
    assert [(d.action, d.job_id) for d in out.decisions] == [(Action.SUSPEND, "2"), (Action.START, "4")]
    assert spared == ("1",)
    assert spare_finishing(plan, view, finishing_jobs({"1": P(5, None, state="done")}))[0].for_job("3") is None
    assert spare_finishing(plan, view, finishing_jobs({}))[0] is plan


def test_a_failed_move_is_not_retried_for_a_quantum(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=0.0)], clock=lambda: clock[0])
    proto = FakeProtocol(backend, fail=frozenset({"1"}))
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\n")
    ctl = Controller(cfg, backend, store, lambda: clock[0], policy=Toy(), protocol=proto, topology=TOPO,
                     progress_reader=lambda _p, _u: None)
    ctl.tick()
    assert len(proto.calls) == 1
    clock[0] += 10
    ctl.tick()
    assert len(proto.calls) == 1  # backing off
    clock[0] += 25
    proto.fail.clear()
    assert [r.ok for r in ctl.tick().results] == [True]


def test_metrics_endpoint_serves_prometheus_text(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctl, _b, _s = make(tmp_path, [old("1")], conf=f"metrics_port = {port}\n")
    ctl._start_metrics()
    try:
        ctl.tick()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "gandiva_queue_length" in body and 'gandiva_jobs{state="running"} 1.0' in body
    finally:
        ctl._metrics_server.stop()


def test_rounds_fall_on_multiples_of_the_tick_in_wall_time() -> None:
    """The simulator decides on the same grid, and Gandiva's rotations (multiples of the quantum) are ticks."""
    import datetime

    from slurm_gandiva.controller.service import _grid_trigger, _multiple

    utc = datetime.timezone.utc
    now = 1_795_400_001.7
    trig = _grid_trigger(3.0, now)
    first = trig.get_next_fire_time(None, datetime.datetime.fromtimestamp(now, utc))
    assert first.timestamp() == 1_795_400_004.0  # the next multiple of 3 s
    later = trig.get_next_fire_time(first, datetime.datetime.fromtimestamp(now + 4.0, utc))
    assert later.timestamp() == 1_795_400_007.0  # on the grid (a late round is coalesced onto it)
    assert _multiple(30.0, 3.0) and _multiple(15.0, 5.0) and not _multiple(20.0, 3.0) and not _multiple(2.0, 5.0)


def test_no_automatic_cycle_collection_inside_a_round(tmp_path: Path) -> None:
    """A round runs with automatic collection off (it walked every long-lived object, 0.1-0.2 s of a
    10,000-job round); it is on again after the round, also after a failing one, and the tick job
    collects between rounds."""
    import gc
    from dataclasses import replace

    policy = Toy()
    ctl, _backend, store = make(tmp_path, [sjob("1")], policy)
    seen: list[bool] = []
    decide = policy.decide

    def watching(view: ClusterView, now: float) -> Plan:
        seen.append(gc.isenabled())
        return decide(view, now)

    policy.decide = watching  # type: ignore[method-assign]
    try:
        assert gc.isenabled()
        ctl.tick()
        assert seen == [False] and gc.isenabled()
        policy.fail = True
        assert ctl.tick().error  # the failure is reported, not raised
        assert gc.isenabled()
        gc.disable()  # a caller that turned it off keeps it off
        ctl.tick()
        assert not gc.isenabled()
        gc.enable()
        collected: list[int] = []
        gc.callbacks.append(lambda phase, info: collected.append(info["generation"]) if phase == "stop" else None)
        calls: list[float] = []
        real = ctl.collect_garbage

        def counted() -> None:
            calls.append(time.time())
            real()

        ctl.collect_garbage = counted  # type: ignore[method-assign]
        try:
            ctl._round_job()  # tick 0.2 s: the next tick is always too near for a collection
            assert calls == []
            ctl.config = replace(ctl.config, tick=3600.0)
            with ctl._lock:  # a round already runs (a late tick): no collection beside it
                ctl._collect_before_next_tick()
            assert calls == []
            ctl._round_job()
        finally:
            gc.callbacks.pop()
        assert len(calls) == 1 and 2 in collected  # the full collection put off from the round
    finally:
        gc.enable()
        store.close()


def test_a_waiting_jobs_inputs_are_kept_while_they_are_the_same_objects(tmp_path: Path) -> None:
    """observe keeps a slice-less job's JobInputs while its SlurmJob, record, rates, progress and trials
    are the very objects of the last round, makes them again when any is replaced, and its view is the
    one a controller without that memory sees."""
    from dataclasses import replace

    policy = Toy()
    policy.override = Plan()  # nothing is started: every job waits
    ctl, backend, store = make(tmp_path, [old("1"), old("2")], policy)
    try:
        ctl.tick()  # registers both
        ctl.tick()
        first = ctl.observer._inputs_memo["1"][-1]
        ctl.tick()
        assert ctl.observer._inputs_memo["1"][-1] is first
        managed = ctl.reconciler.managed
        snap = backend.snapshot()
        assert managed.of(snap) is managed.of(snap)  # worked out once per snapshot
        backend.set(replace(backend.job("1"), reason="Priority"))  # a new SlurmJob for job 1
        ctl.tick()
        memo = ctl.observer._inputs_memo
        assert memo["1"][-1] is not first and memo["1"][-1].slurm.reason == "Priority"
        second = ctl.observer._inputs_memo["2"][-1]
        ctl.store.set_job_state("2", JobState.QUEUED, at=time.time())  # a store write: a new record
        ctl.tick()
        assert ctl.observer._inputs_memo["2"][-1] is not second
        fresh = Controller(
            ctl.config, backend, store, policy=Toy(), protocol=FakeProtocol(backend), topology=TOPO,
            progress_reader=lambda _p, _u: None,
        )
        snap = backend.snapshot()
        assert ctl.observe(snap).view.jobs == fresh.observe(snap).view.jobs
        backend.set(replace(backend.job("2"), state="CANCELLED"))  # gone from the view: forgotten
        ctl.tick()
        assert "2" not in ctl.observer._inputs_memo
    finally:
        store.close()


def test_a_tick_that_falls_during_a_long_round_runs_when_it_ends(tmp_path: Path) -> None:
    """A round past the tick (one with slow actions) makes the next tick late, not dropped: the next
    round starts as soon as the long one ends, and rounds fall back onto the grid after it."""
    rounds: list[tuple[float, float]] = []

    class Slow(Toy):
        def decide(self, view: ClusterView, now: float) -> Plan:
            start = time.time()
            if len(rounds) == 1:
                time.sleep(1.4)  # the second round runs 1.4 ticks
            rounds.append((start, time.time()))
            return Plan()

    backend = FakeBackend([old("1")])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 2\nintrospect = 60\n")
    ctl = Controller(cfg, backend, store, policy=Slow(), protocol=FakeProtocol(backend), topology=TOPO,
                     progress_reader=lambda _p, _u: None)
    t = threading.Thread(target=lambda: ctl.run_forever(metrics=False))
    t.start()
    try:
        deadline = time.time() + 15
        while time.time() < deadline and len(rounds) < 4:
            time.sleep(0.05)
    finally:
        ctl.stop()
        t.join(timeout=10)
        store.close()
    assert len(rounds) >= 4, rounds
    (_s1, _e1), (s2, e2), (s3, _e3), (s4, _e4) = rounds[:4]
    assert abs(s2 - round(s2)) < 0.3  # on the grid
    assert s3 - e2 < 0.4  # the tick that fell during round 2 ran when it ended (dropped: 0.6 s later)
    assert abs(s4 - round(s4)) < 0.3 and s4 > e2  # back on the grid


def running_pair(
    tmp_path: Path, release: tuple[int, int, int]
) -> tuple[Controller, FakeBackend, Store, Toy, FakeProtocol]:
    """Jobs 1 and 2 started by a first round on Slurm `release`; job 1's start waits for a begin time."""
    pol = Toy()
    ctl, backend, store = make(tmp_path, [old("1"), old("2")], policy=pol)
    backend.caps = SlurmCapabilities.for_release(release)
    proto = ctl.actor.protocol
    assert isinstance(proto, FakeProtocol)
    ctl.reconcile()
    assert all(r.ok for r in ctl.tick().results)
    proto.later = {"1"}
    return ctl, backend, store, pol, proto


def test_a_start_waiting_for_its_begin_time_runs_on_after_the_round(tmp_path: Path) -> None:
    """A move back onto its own node waits for its old credential to lapse (24.11: no GPU-index ties): the
    round ends with the job set up and held, its decision still open. Until it runs the next rounds see it
    on its new GPUs and neither hold nor requeue it; then its decision succeeds and its new slice opens."""
    ctl, backend, store, pol, proto = running_pair(tmp_path, (24, 11, 5))
    before = store.current_slice("1")
    assert before is not None
    to = Placement((GpuRef(before.placement.gpus[0].node, 3),))
    pol.override = Plan((Decision(Action.MIGRATE, "1", to),))
    rep = ctl.tick()
    assert [(r.ok, r.starting) for r in rep.results] == [(True, True)]
    assert ctl.actor.starting() == {"1": to} and backend.job("1").state == "PENDING"
    assert store.current_slice("1") is None  # the old slice ended when the job stopped
    assert [d.job_id for d in store.open_intents()] == ["1"]
    pol.override = Plan()
    calls = len(backend.calls)
    rep = ctl.tick()
    assert not rep.error and not [f for f in rep.findings if f.job_id == "1"]
    seen = {j.job_id: j for j in rep.view.jobs}["1"]
    assert seen.state is JobState.RUNNING and seen.placement == to
    assert ("hold", "1") not in backend.calls[calls:]
    proto.gate.set()
    assert ctl.actor.wait_started(timeout=5)
    assert ctl.actor.starting() == {} and store.open_intents() == ()
    now = store.current_slice("1")
    assert now is not None and now.placement == to and backend.job("1").state == "RUNNING"
    job = store.get_job("1")
    assert job is not None and job.state is JobState.RUNNING


def test_starts_run_to_the_end_within_the_round_where_slurm_ties_gpu_indices(tmp_path: Path) -> None:
    """22.05 keeps a requeued job's old GPU indices: a later start must wait for it to run, so no start is
    left to run on after its round there."""
    ctl, _backend, _store, pol, proto = running_pair(tmp_path, (22, 5, 8))
    pol.override = Plan((Decision(Action.MIGRATE, "1", Placement((GpuRef("n2", 3),))),))
    rep = ctl.tick()
    assert [(r.ok, r.starting) for r in rep.results] == [(True, False)]
    assert proto.deferred == [] and ctl.actor.starting() == {}


def test_a_decision_on_a_job_still_starting_waits_for_that_start(tmp_path: Path) -> None:
    ctl, backend, _store, pol, proto = running_pair(tmp_path, (24, 11, 5))
    pol.override = Plan((Decision(Action.MIGRATE, "1", Placement((GpuRef("n2", 3),))),))
    ctl.tick()
    pol.override = Plan((Decision(Action.SUSPEND, "1"),))
    opened = threading.Timer(0.3, proto.gate.set)
    opened.start()
    rep = ctl.tick()
    assert [r.ok for r in rep.results] == [True]
    assert ctl.actor.wait_started(timeout=5)
    # The start ran to the end before the suspend was carried out, not after it.
    assert backend.job("1").state == "PENDING"
    assert [c[0] for c in proto.calls if c[1] == "1"][-2:] == ["migrate", "suspend"]
