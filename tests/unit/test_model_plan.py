"""The domain model and the plan's pure transition."""

from __future__ import annotations

import pytest

from slurm_gandiva.model import (
    ClusterView,
    GpuRef,
    Job,
    JobSpec,
    JobState,
    Locality,
    Placement,
    RateTable,
    Topology,
    TrialKind,
)
from slurm_gandiva.plan import Action, Decision, Plan
from tests.helpers import TWO_BY_FOUR, gp


def job(
    jid: str, state: JobState = JobState.QUEUED, placement: Placement | None = None, lo: int = 1, hi: int = 1
) -> Job:
    return Job(JobSpec(jid, "alice", lo, hi, 0.0, total_work=100.0), state=state, placement=placement)


def test_locality_classes() -> None:
    assert TWO_BY_FOUR.locality(gp("n1", 0, 1).gpus) is Locality.SWITCH
    assert TWO_BY_FOUR.locality(gp("n1", 0, 2).gpus) is Locality.NODE  # 2 sockets x 1 switch each
    four_sockets = Topology.uniform(1, 4, gpus_per_switch=1, sockets=2)
    assert four_sockets.locality(gp("n1", 0, 1).gpus) is Locality.SOCKET
    assert TWO_BY_FOUR.locality([GpuRef("n1", 0), GpuRef("n2", 0)]) is Locality.CROSS_NODE


def test_placement_is_canonical_and_rejects_duplicates() -> None:
    assert gp("n1", 3, 1) == gp("n1", 1, 3)
    assert str(Placement((GpuRef("n2", 1), GpuRef("n1", 0)))) == "n1:0,n2:1"
    with pytest.raises(ValueError):
        Placement((GpuRef("n1", 0), GpuRef("n1", 0)))


def test_rate_table_interpolates_and_never_invents_speedup() -> None:
    rt = RateTable({(1, Locality.SWITCH): 10.0, (4, Locality.NODE): 30.0, (4, Locality.CROSS_NODE): 20.0})
    assert rt.throughput(1) == 10.0
    assert rt.throughput(4) == 30.0
    assert rt.throughput(4, Locality.CROSS_NODE) == 20.0
    assert rt.throughput(2) == pytest.approx(10.0 + (30.0 - 10.0) / 3)
    assert rt.throughput(8) == 30.0  # no evidence beyond 4 GPUs
    assert RateTable().throughput(3) == 3.0


def test_from_targets_derives_actions() -> None:
    view = ClusterView(
        TWO_BY_FOUR,
        (
            job("q"),
            job("s", JobState.SUSPENDED),
            job("r", JobState.RUNNING, gp("n1", 0)),
            job("m", JobState.RUNNING, gp("n1", 1)),
            job("z", JobState.RUNNING, gp("n1", 2), hi=2),
            job("p", JobState.RUNNING, gp("n1", 3)),
            job("done", JobState.DONE),
        ),
    )
    plan = Plan.from_targets(
        view,
        {
            "q": gp("n2", 0),
            "s": gp("n2", 1),
            "r": None,
            "m": gp("n2", 2),
            "z": gp("n1", 2, 1),
            "p": gp("n1", 3, shared=True),
            "done": gp("n2", 3),
        },
        trials={"p": TrialKind.PACK},
    )
    actions = {d.job_id: d.action for d in plan.decisions}
    assert actions == {
        "q": Action.START,
        "s": Action.RESUME,
        "r": Action.SUSPEND,
        "m": Action.MIGRATE,
        "z": Action.RESIZE,
        "p": Action.PACK,
    }
    # Suspends come first so GPUs are freed before they are taken.
    assert plan.decisions[0].action is Action.SUSPEND
    after = plan.apply(view, now=5.0)
    assert after.consistency_errors() == []
    assert after.job("s").times_scheduled == 1 and after.job("s").slice_start == 5.0
    assert after.job("r").state is JobState.SUSPENDED and after.job("r").last_run_end == 5.0
    assert after.job("r").last_gpus == view.job("r").placement.gpus
    trial = after.job("p").trial
    assert trial is not None and trial.kind is TrialKind.PACK and trial.previous == gp("n1", 3)
    assert after.job("m").slice_start is None  # a migration continues the running slice


def test_consistency_catches_double_booking_and_whole_plus_shard() -> None:
    view = ClusterView(
        TWO_BY_FOUR,
        (
            job("a", JobState.RUNNING, gp("n1", 0)),
            job("b", JobState.RUNNING, gp("n1", 0, shared=True)),
            job("c", JobState.RUNNING, gp("n1", 1, 2), hi=1),
        ),
    )
    errs = view.consistency_errors()
    assert any("whole and as shards" in e for e in errs)
    assert any("outside its range" in e for e in errs)


def test_plan_rejects_two_decisions_for_one_job() -> None:
    with pytest.raises(ValueError):
        Plan((Decision(Action.SUSPEND, "a"), Decision(Action.SUSPEND, "a")))
