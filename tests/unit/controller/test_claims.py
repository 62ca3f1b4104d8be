"""What a job says of itself buys it nothing beyond what the controller measures (issue 29, item 2): a
claim of finishing spares it for a bounded time, a contradicted claim is ignored and recorded once, and a
report with a bad number is refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.claims import CLAIM_IGNORED, ClaimJudge
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.errors import JobFileError
from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Locality, Placement, RateTable, Topology
from slurm_gandiva.plan import Plan
from slurm_gandiva.requeue.contract import Progress
from slurm_gandiva.requeue.safe_read import read_job_progress
from slurm_gandiva.selector.round import FINISH_MARGIN_S
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

TOPO = Topology.uniform(1, 1)
G0 = Placement((GpuRef("n1", 0),))
QUANTUM = 60.0


def report(samples: int, total: int | None = 1000, *, rate: float = 10.0, state: str = "running") -> Progress:
    return Progress(step=1, epoch=0, samples=samples, total_samples=total, batch_time_avg=0.1, samples_per_s=rate,
                    world_size=1, updated=1.0, state=state)


def running(now: float) -> ClusterView:
    return ClusterView(TOPO, (Job(JobSpec("1", "u", 1, 1, 0.0), JobState.RUNNING, G0),), now)


def test_a_liar_is_spared_no_longer_than_the_bound_and_recorded_once() -> None:
    judge = ClaimJudge()
    lie = report(1000, state="done")  # says done from its first report on
    seen = [judge.judge(running(t), {"1": lie}, QUANTUM, t) for t in (100.0, 110.0, 100.0 + FINISH_MARGIN_S, 200.0)]
    assert [set(v.standing) for v in seen] == [{"1"}, {"1"}, set(), set()]
    assert [set(v.ignored) for v in seen] == [set(), set(), {"1"}, {"1"}]
    assert [set(v.new) for v in seen] == [set(), set(), {"1"}, set()]  # recorded once
    assert "longer than it may be spared" in seen[2].ignored["1"]


def test_an_honest_finishing_job_is_spared_through_its_shutdown() -> None:
    judge = ClaimJudge()
    t, samples = 0.0, 0
    while samples < 1000:  # 10 samples/s, read every 5 s
        v = judge.judge(running(t), {"1": report(samples)}, QUANTUM, t)
        assert not v.ignored
        t, samples = t + 5.0, samples + 50
    for dt in (0.0, 5.0, 20.0):  # done; its shutdown (checkpoint, exit) takes 20 s
        v = judge.judge(running(t + dt), {"1": report(1000, state="done")}, QUANTUM, t + dt)
        assert set(v.standing) == {"1"} and not v.ignored


@pytest.mark.parametrize(
    ("before", "after", "why"),
    [
        (None, report(10, state="done"), "says it is done at 10 of 1000"),
        (report(100), report(1000), "jumped from 100 to 1000 in 5 s"),
    ],
)
def test_a_claim_the_measurements_contradict_is_ignored_at_once(
    before: Progress | None, after: Progress, why: str
) -> None:
    judge = ClaimJudge()
    if before is not None:
        assert not judge.judge(running(0.0), {"1": before}, QUANTUM, 0.0).ignored
    v = judge.judge(running(5.0), {"1": after}, QUANTUM, 5.0)
    assert not v.standing and why in v.ignored["1"] and v.new == v.ignored
    v = judge.judge(running(10.0), {"1": replace(after, samples=1000, state="done")}, QUANTUM, 10.0)
    assert set(v.ignored) == {"1"} and not v.new  # a liar stays one; recorded once


def test_a_report_that_finishes_within_the_policy_grace_is_bounded_too() -> None:
    """samples = total - 1 at a huge claimed rate is not "done", but the policy would keep the job running at
    every rotation (its finish grace): that is a claim too, bounded the same way."""
    judge = ClaimJudge()
    near = report(999, rate=1e6)
    job = Job(JobSpec("1", "u", 1, 1, 0.0, total_work=1000.0), JobState.RUNNING, G0, progress=999.0,
              rates=RateTable().with_rate(1, Locality.NODE, 1e6))
    seen = [judge.judge(ClusterView(TOPO, (job,), t), {"1": near}, QUANTUM, t) for t in (0.0, 29.0, 31.0)]
    assert [set(v.ignored) for v in seen] == [set(), set(), {"1"}]  # its measured finish (now) plus the margin
    assert not any(v.standing for v in seen)  # not "done": the round's own sparing is not for it


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("samples", -5, "samples = -5"),
        ("samples_per_s", float("nan"), "non-finite"),
        ("samples_per_s", float("inf"), "non-finite"),
        ("total_samples", 10**30, "total_samples"),
        ("samples", float("inf"), "infinity"),
        ("samples_per_s", 1e15, "samples_per_s"),
        ("world_size", -1, "world_size"),
        ("updated", -1.0, "updated"),
        ("state", "finished!", "state"),
    ],
)
def test_a_report_with_a_bad_number_is_refused(tmp_path: Path, field: str, value: object, why: str) -> None:
    data = json.loads(report(5).to_json())
    data[field] = value
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(data))  # NaN, Infinity: what json.dumps writes and json.loads reads back
    with pytest.raises(JobFileError, match=why):
        read_job_progress(path, owner=path.stat().st_uid)
    path.write_text(report(5).to_json())
    assert read_job_progress(path, owner=path.stat().st_uid) == report(5)


class Rotate:
    """Stops every running job whenever a job waits, and starts the first waiting job on the free GPU."""

    name = "rotate"
    quantum = None

    def decide(self, view: ClusterView, now: float) -> Plan:
        targets: dict[str, Placement | None] = {j.job_id: None for j in view.running}
        if view.waiting:
            targets[view.waiting[0].job_id] = G0
        else:
            targets = {}
        return Plan.from_targets(view, targets)


def test_the_controller_stops_a_liar_after_the_bound_and_says_why(tmp_path: Path) -> None:
    clock = [1000.0]
    liar = sjob("1", "RUNNING", hold=HoldKind.NONE, gpus={"n1": (0,)}, submit=0.0, start=900.0)
    backend = FakeBackend([liar, sjob("2", submit=1.0)])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = {QUANTUM:g}\n")
    lie = report(1000, state="done")
    ctl = Controller(cfg, backend, store, lambda: clock[0], policy=Rotate(), protocol=FakeProtocol(backend),
                     topology=TOPO, progress_reader=lambda p, _u: lie if p.parent.name == "1" else None)
    for _ in range(3):  # within the bound: spared, "2" waits
        rep = ctl.tick()
        assert rep.error == "" and not [r for r in rep.results if r.decision.job_id == "1"]
        clock[0] += 10.0
    clock[0] += FINISH_MARGIN_S
    rep = ctl.tick()
    assert rep.error == "" and {r.decision.job_id for r in rep.results if r.ok} >= {"1", "2"}
    ignored = store.events(kinds=[CLAIM_IGNORED])
    assert [e.job_id for e in ignored] == ["1"]
    rows = {r.job_id: r for r in queue_rows(cfg, backend, store)}
    assert "longer than it may be spared" in rows["1"].reason
