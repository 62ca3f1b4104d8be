"""Co-held GPUs in the controller (controller/cohold.py) with a fake Slurm and protocol: a rotation between two
jobs on one GPU is a park and an unpark, the parked job holds its shard and is suspended to the policy, the
store remembers it across a restart, and the memory rule keeps a job whose state does not fit from parking."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.act import Actor
from slurm_gandiva.controller.cohold import co_hold_gpus, co_hold_view, same_place, slurm_placement, view_placement
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import GpuRef, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.slurm.base import HoldKind, SlurmNode
from slurm_gandiva.slurm.capabilities import SlurmCapabilities
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, pl, sjob
from tests.unit.controller.test_service import Toy

TOPO = Topology.uniform(1, 1, gpus_per_switch=1, sockets=1)
G0 = Placement((GpuRef("n1", 0),))
MB = 1 << 20


def test_whole_gpus_of_one_node_are_held_as_shards_only_with_co_holding_on() -> None:
    assert slurm_placement(G0, 1) == Placement(G0.gpus, shared=True)
    assert slurm_placement(G0, 0) == G0
    across = Placement((GpuRef("n1", 0), GpuRef("n2", 0)))
    assert slurm_placement(across, 99) == across  # across nodes: the requeue path only
    assert slurm_placement(pl("n1", 0, 1), 1) == pl("n1", 0, 1)  # shards of several GPUs not allowed there
    assert slurm_placement(pl("n1", 0, 1), 2) == Placement(pl("n1", 0, 1).gpus, shared=True)
    r2411 = SlurmCapabilities.for_release((24, 11, 5))
    assert co_hold_gpus(True, r2411) == 1 and co_hold_gpus(False, r2411) == 0
    assert co_hold_gpus(True, SlurmCapabilities.for_release((24, 11, 5), "", "CR_Core,MULTIPLE_SHARING_GRES_PJ")) > 8
    assert co_hold_gpus(True, SlurmCapabilities.for_release((22, 5, 8))) == 0  # no shard switching: off
    shards = Placement(G0.gpus, shared=True)
    assert same_place(G0, shards) and same_place(G0, G0) and not same_place(shards, G0)
    assert not same_place(pl("n1", 1), Placement(G0.gpus, shared=True))
    assert view_placement(shards, G0) == G0  # its open slice says whole: the policies see it whole
    assert view_placement(shards, None) == shards  # packed (or unknown): Slurm's shards


def test_a_job_parks_only_where_its_measured_state_fits_half_its_memory() -> None:
    nodes = [SlurmNode("n1", "IDLE", ("gpu",), "", "", memory=64_000)]
    running = {"a": G0, "b": pl("n1", 1), "c": pl("n1", 2, 3), "x": Placement((GpuRef("n1", 0), GpuRef("n2", 0)))}
    co = co_hold_view(
        running, {"p": pl("n1", 3)}, {"b": 600 * MB, "c": 400 * MB, "p": 10 * MB},
        {"a": 1000, "b": 1000, "c": 1000, "p": 1000, "x": 1000}, nodes, 4,
    )
    assert co.state_bytes == {"a": 0, "c": 200 * MB, "p": 10 * MB}  # b's 600 MB > 500: never parks again
    assert co.parked == {"p": pl("n1", 3)} and co.host_bytes == {"n1": 64_000 * MB}


def controller(tmp_path: Path, backend: FakeBackend, clock: list[float], protocol: FakeProtocol) -> Controller:
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 10\nco_hold = yes\n")
    return Controller(cfg, backend, Store(f"sqlite:///{tmp_path / 'g.db'}"), clock=lambda: clock[0],
                      policy=Toy(quantum=10), protocol=protocol, topology=TOPO,
                      progress_reader=lambda _p, _u: None)


def test_a_rotation_on_one_gpu_is_a_park_and_an_unpark_and_survives_a_restart(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=100.0), sjob("2", submit=101.0)], clock=lambda: clock[0])
    backend.caps = SlurmCapabilities.for_release((24, 11, 5))
    proto = FakeProtocol(backend)
    ctl = controller(tmp_path, backend, clock, proto)
    ctl.tick()
    assert proto.calls == [("resume", "1", Placement(G0.gpus, shared=True))]  # a shard of its GPU in Slurm
    clock[0] += 1
    rep = ctl.tick()
    assert rep.plan.decisions == () and rep.view is not None
    assert rep.view.job("1").placement == G0  # to the policy it holds the GPU whole: no unpack
    clock[0] += 11
    rep = ctl.tick()
    assert [(r.decision.action, r.decision.job_id, r.ok) for r in rep.results] == [
        (Action.PARK, "1", True), (Action.START, "2", True)]
    assert proto.calls[1:] == [("park", "1", None), ("resume", "2", Placement(G0.gpus, shared=True))]
    assert backend.job("1").running  # parked: Slurm still runs it, on its shard
    clock[0] += 1
    rep = ctl.tick()
    assert rep.view is not None and rep.view.co_hold is not None
    assert rep.view.job("1").state is JobState.SUSPENDED and rep.view.co_hold.parked == {"1": G0}
    assert ctl.store.get_job("1").state is JobState.SUSPENDED
    assert ctl.store.current_slice("1") is None
    # A restarted controller knows job 1 is parked from the store alone.
    ctl2 = controller(tmp_path, backend, clock, proto)
    clock[0] += 10
    rep = ctl2.tick()
    assert [(r.decision.action, r.decision.job_id, r.ok) for r in rep.results] == [
        (Action.PARK, "2", True), (Action.UNPARK, "1", True)]
    assert proto.calls[-2:] == [("park", "2", None), ("unpark", "1", None)]
    assert not [c for c in proto.calls if c[0] == "suspend"]  # never the requeue path
    assert ctl2.store.current_slice("1").placement == G0
    assert [f.kind for f in ctl2.reconcile()] == []  # nothing to adopt: the parked job is not "running"


def test_co_hold_is_yes_or_no_in_the_config() -> None:
    assert parse_config("co_hold = yes\n").co_hold and not parse_config("").co_hold
    with pytest.raises(ConfigError, match="co_hold must be yes or no"):
        parse_config("co_hold = sometimes\n")


def test_a_start_waits_for_the_park_on_its_gpu_and_a_parked_job_placed_elsewhere_is_migrated(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    jobs = [sjob("1", "RUNNING", hold=HoldKind.NONE), sjob("2"), sjob("3", "RUNNING", hold=HoldKind.NONE)]
    backend = FakeBackend([replace(jobs[0], shards={"n1": (0,)}), jobs[1], replace(jobs[2], shards={"n1": (1,)})])
    for jid in "123":
        store.upsert_job(JobSpec(jid, "alice", 1, 1, 1.0), at=1.0, state=JobState.RUNNING)
    store.open_slice("1", G0, 10.0)
    proto = FakeProtocol(backend, delay=0.3)
    entered: dict[str, float] = {}

    def on_call(op: str, jid: str) -> None:
        entered.setdefault(f"{op} {jid}", time.monotonic())

    proto.on_call = on_call
    act = Actor(backend, store, clock=time.time)
    act.protocol, act.co_hold, act.parked = proto, 1, frozenset({"3"})
    plan = Plan((
        Decision(Action.PARK, "1"), Decision(Action.START, "2", G0), Decision(Action.RESUME, "3", pl("n2", 0))
    ))
    res = act.execute(plan, {"1": G0, "3": pl("n1", 1)}, ties=False)
    assert all(r.ok for r in res), res
    assert entered["resume 2"] >= entered["park 1"] + 0.3  # not released ahead beside a job still computing
    assert ("migrate", "3", Placement((GpuRef("n2", 0),), shared=True)) in proto.calls  # requeued, then there
    assert store.get_job("1").state is JobState.SUSPENDED and store.current_slice("1") is None
    assert store.current_slice("2").placement == G0 and store.current_slice("3").placement == pl("n2", 0)


def test_a_job_that_declined_a_park_takes_its_later_turns_through_the_requeue_path(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=100.0), sjob("2", submit=101.0)], clock=lambda: clock[0])
    backend.caps = SlurmCapabilities.for_release((24, 11, 5))
    proto = FakeProtocol(backend)
    proto.decline = {"1"}  # e.g. its device state would not fit the host memory left to it
    ctl = controller(tmp_path, backend, clock, proto)
    ctl.tick()
    clock[0] += 11
    rep = ctl.tick()
    assert [(r.decision.action, r.decision.job_id) for r in rep.results] == [(Action.PARK, "1"), (Action.START, "2")]
    assert backend.job("1").pending  # it went the requeue path
    clock[0] += 11
    rep = ctl.tick()  # job 2 parks, job 1 comes back by a resume (it was requeued)
    assert [(r.decision.action, r.decision.job_id) for r in rep.results] == [
        (Action.PARK, "2"), (Action.RESUME, "1")]
    clock[0] += 11
    rep = ctl.tick()  # job 1's turn ends: a suspend now, never asked to park again
    assert (Action.SUSPEND, "1") in [(r.decision.action, r.decision.job_id) for r in rep.results]
    asked = [d.action for d in ctl.store.decisions(job_ids=["1"]) if d.action is Action.PARK]
    assert asked == [Action.PARK]  # only the first, declined, ask
