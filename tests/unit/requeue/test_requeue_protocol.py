"""The requeue protocol against an in-memory Slurm: step order, idempotence, escalation, verification."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slurm_gandiva.errors import BadRequest, LimitRefusal, PermissionDenied, ProtocolError
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.gres_plan import GresKind, busy_gpus, choose_gpus, gres_for, gres_kind
from slurm_gandiva.requeue.operations import (
    Op,
    Outcome,
    Phase,
    Step,
    StepEvent,
    StepEventKind,
    StepRecord,
    as_mapping,
    phase,
)
from slurm_gandiva.requeue.protocol import RELEASE_LEAD_S, RequeueProtocol
from slurm_gandiva.slurm.base import HoldKind
from tests.unit.requeue.requeue_fakes import FakeClock, FakeJob, FakeSlurm


def place(node: str, *gpus: int, shared: bool = False) -> Placement:
    return Placement(tuple(GpuRef(node, g) for g in gpus), shared=shared)


def ran(result_steps: tuple[StepRecord, ...], skipped: bool = False) -> list[Step]:
    return [s.step for s in result_steps if s.skipped is skipped]


def test_suspend_running_job_signals_waits_and_admin_holds(
    proto: RequeueProtocol, slurm: FakeSlurm, events: list[StepEvent]
) -> None:
    slurm.add(FakeJob("7"))
    res = proto.suspend("7")
    assert res.outcome is Outcome.SUSPENDED and not res.escalated
    assert ran(res.steps) == [Step.SIGNAL, Step.WAIT_REQUEUE, Step.WAIT_CHECKPOINT, Step.ADMIN_HOLD]
    assert slurm.called("signal") == [("signal", "7", "USR2")]
    assert slurm.called("requeue_hold") == []  # the wrapper did it, not root
    job = slurm.job("7")
    assert job.hold is HoldKind.ADMIN and phase(job) is Phase.HELD
    assert "reported suspended" in (res.step(Step.WAIT_CHECKPOINT) or pytest.fail()).detail
    # The wait took about as long as the fake wrapper needed, and the journal saw every step start and end.
    wait = res.step(Step.WAIT_REQUEUE)
    assert wait is not None and 0.4 <= wait.seconds <= 1.0
    kinds = [(e.step, e.kind) for e in events]
    assert kinds[:2] == [(Step.SIGNAL, StepEventKind.START), (Step.SIGNAL, StepEventKind.END)]
    assert all(e.job_id == "7" and e.op is Op.SUSPEND for e in events)
    assert "admin-hold" in res.describe() and "total" in res.describe()


def test_each_operation_sends_the_signal_it_names(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7"))
    slurm.add(FakeJob("8", gpus=(1,)))
    slurm.add(FakeJob("9", gpus=(2,)))
    res = proto.suspend("7", signal="ALRM")
    assert res.outcome is Outcome.SUSPENDED
    assert (res.step(Step.SIGNAL) or pytest.fail()).detail == "SIGALRM to the batch shell"
    assert proto.migrate("8", place("n1", 3), signal="XCPU").outcome is Outcome.RUNNING
    assert proto.suspend("9").outcome is Outcome.SUSPENDED  # none named: the protocol's own
    assert [c[2] for c in slurm.called("signal")] == ["ALRM", "XCPU", "USR2"]


def test_suspend_twice_is_a_no_op(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7"))
    proto.suspend("7")
    n = len(slurm.calls)
    again = proto.suspend("7")
    assert again.outcome is Outcome.SUSPENDED
    assert len(slurm.calls) == n, "an already suspended job must not be signalled or held again"
    assert ran(again.steps) == []


def test_suspend_after_crash_between_requeue_and_admin_hold(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(
        FakeJob("7", state="PENDING", reason="job_requeued_in_held_state", hold=HoldKind.USER, restart_count=1, gpus=())
    )
    assert phase(slurm.job("7")) is Phase.REQUEUED
    res = proto.suspend("7")
    assert ran(res.steps) == [Step.ADMIN_HOLD]
    assert slurm.called("signal") == []
    assert slurm.job("7").hold is HoldKind.ADMIN


def test_suspend_of_a_pending_unheld_job_just_holds_it(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("8", state="PENDING", gpus=(), begin=5000.0))
    res = proto.suspend("8")
    assert res.outcome is Outcome.SUSPENDED and ran(res.steps) == [Step.ADMIN_HOLD]
    assert phase(slurm.job("8")) is Phase.QUEUED_HELD


def test_suspend_escalates_when_the_job_ignores_the_signal(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    slurm.add(FakeJob("9", on_signal="ignore"))
    t0 = clock()
    res = proto.suspend("9")
    assert res.outcome is Outcome.ESCALATED and res.escalated
    assert clock() - t0 >= 10.0  # waited the whole suspend timeout first
    assert slurm.called("requeue_hold") == [("requeue_hold", "9", "")]
    assert ran(res.steps) == [Step.SIGNAL, Step.WAIT_REQUEUE, Step.ESCALATE, Step.ADMIN_HOLD]
    assert "lost" in res.detail and "lost" in res.describe()
    assert slurm.job("9").hold is HoldKind.ADMIN


def test_job_that_finishes_instead_is_reported_finished(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("10", on_signal="finish"))
    res = proto.suspend("10")
    assert res.outcome is Outcome.FINISHED
    assert "COMPLETED" in res.detail and "done" in res.detail
    assert slurm.called("hold") == [] and slurm.called("requeue_hold") == []


def test_stale_status_file_is_not_taken_for_a_fresh_suspend(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("11", on_signal="suspend-silent"))
    slurm.write_status("11", "suspended")  # left over from an earlier slice
    res = proto.suspend("11")
    assert res.outcome is Outcome.SUSPENDED
    detail = (res.step(Step.WAIT_CHECKPOINT) or pytest.fail()).detail
    assert "no fresh status.json" in detail


def test_resume_sets_exact_gpus_clears_begin_time_and_releases(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    slurm.add(FakeJob("7", req_gres=""))  # submitted without --gres: the first placement is exact
    proto.suspend("7")
    res = proto.resume("7", place("n2", 0, 2))
    assert res.outcome is Outcome.RUNNING and res.placement == place("n2", 0, 2)
    assert ran(res.steps) == [Step.SET_PLACEMENT, Step.RELEASE, Step.WAIT_RUNNING, Step.VERIFY]
    # No credential to wait for: the requeue's begin time is cleared in the placement's own update.
    assert [c[2] for c in slurm.called("update")] == [
        "gres=gpu:g0:1,gpu:g2:1 nodelist=n2 numnodes=1-1 numtasks=1 starttime=now",
    ]
    job = slurm.job("7")
    assert job.running and dict(job.gpus) == {"n2": (0, 2)}
    # Without starttime=now the job would have waited out the ~120 s requeue BeginTime.
    wait = res.step(Step.WAIT_RUNNING)
    assert wait is not None and wait.seconds < 1.0


def test_a_resume_released_ahead_waits_until_free_and_is_held_again_when_its_gpus_stay_taken(
    proto: RequeueProtocol, slurm: FakeSlurm
) -> None:
    """until_free runs after the release (the job is set up and released while its GPUs' holder stops)
    and before the wait for RUNNING; when it raises, the job is held again and the error passes on."""
    slurm.add(FakeJob("7", req_gres=""))
    proto.suspend("7")
    seen: list[str] = []
    res = proto.resume("7", place("n2", 0), until_free=lambda: seen.append(slurm.job("7").reason))
    assert res.outcome is Outcome.RUNNING and len(seen) == 1
    assert ran(res.steps) == [
        Step.SET_PLACEMENT, Step.RELEASE, Step.WAIT_FREE, Step.WAIT_RUNNING, Step.VERIFY,
    ]
    slurm.add(FakeJob("8", req_gres=""))
    proto.suspend("8")

    def taken() -> None:
        raise ProtocolError("skipped: its GPUs are still held by a job that failed to stop")

    holds = len(slurm.called("hold"))
    with pytest.raises(ProtocolError, match="failed to stop"):
        proto.resume("8", place("n2", 1), until_free=taken)
    job = slurm.job("8")
    assert job.pending and job.hold is HoldKind.ADMIN and len(slurm.called("hold")) == holds + 1


def test_resume_shared_uses_shards(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres=""))
    res = proto.resume("7", place("n1", 3, shared=True))
    assert res.outcome is Outcome.RUNNING
    assert slurm.called("update")[0][2] == "gres=shard:g3:1 nodelist=n1 numnodes=1-1 numtasks=1 starttime=now"
    assert dict(slurm.job("7").shards) == {"n1": (3,)}


def test_whole_gpu_jobs_are_never_packed_and_are_not_stopped_for_nothing(
    proto: RequeueProtocol, slurm: FakeSlurm
) -> None:
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres="gpu:g3:1"))
    with pytest.raises(ProtocolError, match=r"booked on whole GPUs.*stays as it is"):
        proto.resume("7", place("n1", 3, shared=True))
    slurm.add(FakeJob("8", node="n1", gpus=(0, 1), req_gres="gpu:2"))
    with pytest.raises(ProtocolError, match="booked on whole GPUs"):
        proto.migrate("8", place("n1", 0, 1, shared=True))
    assert slurm.calls == [] and slurm.job("8").running  # refused before the signal, not after
    assert phase(slurm.job("7")) is Phase.QUEUED_HELD


def test_any_gpu_job_gets_exactly_the_gpus_asked_for(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    # Submitted with an untyped count (as `gandiva sbatch` does): the first placement makes it exact.
    slurm.add(FakeJob("7", node="n1", gpus=(0, 1), req_gres="gpu:2"))
    res = proto.migrate("7", place("n2", 1, 3))
    assert res.placement == place("n2", 1, 3) and dict(slurm.job("7").gpus) == {"n2": (1, 3)}
    assert slurm.called("update")[0][2] == "gres=gpu:g1:1,gpu:g3:1 nodelist=n2 numnodes=1-1 numtasks=1 starttime=now"
    # Shrink to a GPU it did not have, then grow elsewhere: each time exactly what was asked.
    assert proto.resize("7", place("n2", 0)).placement == place("n2", 0)
    assert dict(slurm.job("7").gpus) == {"n2": (0,)}
    assert proto.resize("7", place("n1", 2, 3)).placement == place("n1", 2, 3)
    assert dict(slurm.job("7").gpus) == {"n1": (2, 3)} and slurm.job("7").restart_count == 3


def test_packed_job_keeps_its_shards_and_may_add_more(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres=""))
    assert proto.resume("7", place("n1", 1, shared=True)).outcome is Outcome.RUNNING
    res = proto.migrate("7", place("n1", 1, 2, shared=True))
    assert res.outcome is Outcome.RUNNING and dict(slurm.job("7").shards) == {"n1": (1, 2)}
    n = len(slurm.calls)
    with pytest.raises(ProtocolError, match=r"cannot take shards away.*include \[1, 2\]"):
        proto.migrate("7", place("n2", 2, shared=True))
    with pytest.raises(ProtocolError, match="booked on shards"):
        proto.migrate("7", place("n1", 1, 2))
    assert len(slurm.calls) == n and slurm.job("7").running
    # Another node, same GPUs: fine.
    assert proto.migrate("7", place("n2", 1, 2, shared=True)).placement == place("n2", 1, 2, shared=True)


def test_a_start_slurms_accounting_holds_back_fails_at_once_and_is_held_again(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres="",
                      limit="QOSGrpGRES"))
    t0 = clock()
    with pytest.raises(LimitRefusal, match=r"QOSGrpGRES.*held again"):
        proto.resume("7", place("n1", 0))
    assert clock() - t0 < 2.0  # not the 5-s start timeout: the limit lifts only when usage or limits change
    job = slurm.job("7")
    assert job.hold is HoldKind.ADMIN and not job.accounting_limited  # held again: its reason is the hold now
    # Waiting on GPUs ("Resources") is not a limit: that start waits out its timeout.
    slurm.add(FakeJob("8", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres=""))
    slurm.add(FakeJob("9", node="n1", gpus=(1,)))
    t0 = clock()
    with pytest.raises(ProtocolError, match="did not start within 5 s") as err:
        proto.resume("8", place("n1", 1))
    assert not isinstance(err.value, LimitRefusal) and clock() - t0 >= 5.0


@pytest.mark.parametrize(("reason", "limited"), [
    ("QOSGrpGRES", True), ("AssocGrpGRES", True), ("QOSMaxGRESPerUser", True), ("AssocMaxJobsLimit", True),
    ("InvalidQOS", True), ("AccountNotAllowed", True), ("Resources", False), ("Priority", False),
    ("JobHeldAdmin", False), ("BeginTime", False),
])
def test_which_pending_reasons_are_accountings(reason: str, limited: bool) -> None:
    slurm = FakeSlurm(FakeClock())
    slurm.add(FakeJob("7", state="PENDING", reason=reason, gpus=()))
    assert slurm.job("7").accounting_limited is limited
    slurm.add(FakeJob("8", state="RUNNING", reason=reason))
    assert not slurm.job("8").accounting_limited


def test_resume_is_idempotent_once_running(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", node="n1", gpus=(0, 1)))
    n = len(slurm.calls)
    res = proto.resume("7", place("n1", 0, 1))
    assert res.outcome is Outcome.RUNNING and ran(res.steps) == [] and len(slurm.calls) == n
    with pytest.raises(ProtocolError, match="migrate"):
        proto.resume("7", place("n2", 0, 1))


def test_resume_rerun_after_a_crash_mid_way(slurm: FakeSlurm, clock: FakeClock, tmp_path: Path) -> None:
    slurm.add(
        FakeJob(
            "7",
            state="PENDING",
            hold=HoldKind.ADMIN,
            reason="JobHeldAdmin",
            gpus=(),
            restart_count=1,
            begin=clock() + 120,
            req_gres="gpu:g1:1",
        )
    )

    class Died(Exception):
        pass

    def dying_journal(e: StepEvent) -> None:
        if e.step is Step.RELEASE and e.kind is StepEventKind.START:
            raise Died

    crashing = RequeueProtocol(slurm, clock=clock, sleep=clock.sleep, journal=dying_journal)
    with pytest.raises(Died):
        crashing.resume("7", place("n2", 1))
    job = slurm.job("7")
    assert phase(job) is Phase.HELD  # placement set, still held: safe to redo
    res = RequeueProtocol(slurm, clock=clock, sleep=clock.sleep).resume("7", place("n2", 1))
    assert res.outcome is Outcome.RUNNING and dict(slurm.job("7").gpus) == {"n2": (1,)}


def test_resume_of_a_released_pending_job_holds_it_first(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", state="PENDING", gpus=(), begin=99999.0, restart_count=1, req_gres=""))
    assert phase(slurm.job("7")) is Phase.RELEASED
    res = proto.resume("7", place("n1", 2))
    assert ran(res.steps)[:2] == [Step.ADMIN_HOLD, Step.SET_PLACEMENT]
    assert res.outcome is Outcome.RUNNING


def test_resume_fails_when_slurm_gives_other_gpus(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(
        FakeJob(
            "7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), give_wrong_gpus=True, req_gres=""
        )
    )
    with pytest.raises(ProtocolError, match="not on"):
        proto.resume("7", place("n1", 0))


def test_resume_times_out_on_busy_gpus_and_holds_again(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("1", node="n1", gpus=(0,)))
    slurm.add(FakeJob("7", state="PENDING", hold=HoldKind.ADMIN, reason="JobHeldAdmin", gpus=(), req_gres=""))
    with pytest.raises(ProtocolError, match=r"did not start .* Resources"):
        proto.resume("7", place("n1", 0))
    assert slurm.job("7").hold is HoldKind.ADMIN and slurm.job("7").pending


def test_migrate_suspends_then_resumes_elsewhere(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", node="n1", gpus=(2, 3), req_gres="gpu:g2:1,gpu:g3:1"))
    res = proto.migrate("7", place("n2", 2, 3))
    assert res.op is Op.MIGRATE and res.outcome is Outcome.RUNNING
    assert ran(res.steps) == [
        Step.SIGNAL,
        Step.WAIT_REQUEUE,
        Step.WAIT_CHECKPOINT,
        Step.ADMIN_HOLD,
        Step.SET_PLACEMENT,
        Step.RELEASE,
        Step.WAIT_RUNNING,
        Step.VERIFY,
    ]
    assert dict(slurm.job("7").gpus) == {"n2": (2, 3)} and slurm.job("7").restart_count == 1
    # Re-running the same migrate is a no-op.
    n = len(slurm.calls)
    assert proto.migrate("7", place("n2", 2, 3)).outcome is Outcome.RUNNING and len(slurm.calls) == n


def test_a_job_back_on_the_node_it_left_begins_only_after_its_old_credential_lapsed(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    """slurmd refuses (and slurmctld then fails the job for good) a launch dated in the second its old
    incarnation was killed there: a move back onto that node gets a begin time in the first whole second
    after the stop (with the skew margin), set before the release; a later resume begins now."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    clock.t = 1000.6
    res = proto.migrate("7", place("n1", 1))
    assert res.outcome is Outcome.RUNNING
    begin = res.step(Step.CLEAR_BEGIN) or pytest.fail("no clear-begin step")
    assert "starttime=now+" in begin.detail and "credential" in begin.detail
    stopped = slurm.jobs_["7"].end  # the fake's requeue moment, whole seconds
    begin_at = slurm.jobs_["7"].begin
    assert begin_at >= math.floor(stopped + proto.credential_margin) + 1
    # Released just ahead of the begin time, so that slurmctld's next tick (not the one after) starts it.
    assert begin_at - RELEASE_LEAD_S - 0.01 <= slurm.released_at["7"] < begin_at
    proto.suspend("7")
    clock.sleep(60.0)
    res = proto.resume("7", place("n1", 2))
    assert (res.step(Step.CLEAR_BEGIN) or pytest.fail()).skipped
    assert "starttime=now" in (res.step(Step.SET_PLACEMENT) or pytest.fail()).detail


def test_the_credential_guard_counts_from_the_read_that_saw_the_job_stopped(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    """Slurm revoked the credential before the read that showed the job requeued was answered: the guard's
    second follows that read, not the end of the suspend half (a slow admin hold here crosses a second),
    which would hold a pack back on its own node a whole second longer."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    slurm.hold_takes = 0.6
    clock.t = 1000.0
    res = proto.migrate("7", place("n1", 1))
    assert res.outcome is Outcome.RUNNING
    seen = res.step(Step.WAIT_REQUEUE) or pytest.fail("no wait-requeue step")
    held = res.step(Step.ADMIN_HOLD) or pytest.fail("no admin-hold step")
    # Seen requeued before 1000.75 (0.25 s margin), admin-held only after 1001.
    assert seen.seconds < 0.7 and held.seconds >= 0.6
    assert 1001 <= slurm.jobs_["7"].begin < 1002


def test_a_job_that_slurmctlds_pass_skips_at_its_begin_time_is_asked_for_again(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    """slurmctld's pass at a begin time's own second reads the coarse clock, still a second behind, and skips
    the job; no pass follows unless asked for. The protocol asks with a no-op update after the begin time."""
    slurm.coarse_passes = True
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    clock.t = 1000.6
    res = proto.migrate("7", place("n1", 1))
    assert res.outcome is Outcome.RUNNING
    assert "no-op update" in (res.step(Step.WAIT_RUNNING) or pytest.fail()).detail
    begin_at = slurm.jobs_["7"].begin
    nudges = [c for c in slurm.called("update") if c[2] == "starttime=now"]
    assert nudges and slurm.jobs_["7"].asked >= begin_at


def test_a_moves_resume_half_starts_from_the_admin_held_view(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    """Once admin-held only the controller changes the job: the resume half does not read it again (each
    read waits for a shared squeue); the admin hold's own check is the last read before the new placement."""
    slurm.add(FakeJob("7", node="n1", gpus=(0, 1)))
    slurm.log_reads = True
    assert proto.migrate("7", place("n2", 0, 1)).outcome is Outcome.RUNNING
    kinds = [c[0] for c in slurm.calls]
    hold = kinds.index("hold")
    assert kinds[hold + 1 : kinds.index("update", hold)] == ["job"]


def test_a_move_to_another_node_may_begin_at_once(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    """The new node's slurmd never saw the job's old credential: nothing to wait for."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    res = proto.migrate("7", place("n2", 0))
    assert res.outcome is Outcome.RUNNING
    assert (res.step(Step.CLEAR_BEGIN) or pytest.fail()).skipped
    assert "starttime=now" in (res.step(Step.SET_PLACEMENT) or pytest.fail()).detail


def test_without_its_own_record_of_the_stop_the_protocol_goes_by_slurms_end_time(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock, tmp_path: Path
) -> None:
    """A controller restarted right after a suspend knows neither the stop time nor the node: it trusts
    Slurm's end time (whole seconds; the revocation may fall in the next second) and guards every node."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    proto.suspend("7")
    ended = slurm.jobs_["7"].end
    fresh = RequeueProtocol(slurm, clock=clock, sleep=clock.sleep, wall=clock, jobs_root=tmp_path)
    res = fresh.resume("7", place("n2", 0))
    assert res.outcome is Outcome.RUNNING
    assert "starttime=now+" in (res.step(Step.CLEAR_BEGIN) or pytest.fail()).detail
    assert slurm.jobs_["7"].begin >= ended + 2


def test_resize_changes_gpu_count(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", node="n1", gpus=(0, 1)))
    assert proto.resize("7", place("n1", 0)).outcome is Outcome.RUNNING
    assert dict(slurm.job("7").gpus) == {"n1": (0,)}
    res = proto.resize("7", place("n1", 0, 1))
    assert dict(slurm.job("7").gpus) == {"n1": (0, 1)} and slurm.job("7").restart_count == 2
    assert as_mapping(res)["outcome"] == "running"


def test_a_move_reports_when_its_job_has_stopped(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    """on_stopped comes once, after the admin hold (the job holds no GPU) and before the resume half."""
    slurm.add(FakeJob("7", node="n1", gpus=(2, 3), req_gres="gpu:g2:1,gpu:g3:1"))
    seen: list[tuple[str, bool]] = []

    def stopped() -> None:
        j = slurm.job("7")
        seen.append((j.state, j.hold is HoldKind.ADMIN))

    res = proto.resize("7", place("n2", 2), on_stopped=stopped)
    assert res.outcome is Outcome.RUNNING
    assert seen == [("PENDING", True)]
    held = proto.resize("7", place("n2", 2, 3), on_stopped=stopped)  # runs: stops again, one call more
    assert held.outcome is Outcome.RUNNING and len(seen) == 2


def test_migrate_of_a_job_that_finishes_stops_there(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", on_signal="finish"))
    res = proto.migrate("7", place("n2", 0, 1))
    assert res.outcome is Outcome.FINISHED and slurm.called("update") == []


def test_permission_denied_propagates(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.root = False
    slurm.add(FakeJob("7"))
    with pytest.raises(PermissionDenied):
        proto.suspend("7")
    assert phase(slurm.job("7")) is Phase.REQUEUED  # only the owner's hold: re-run as root to finish


def test_a_placement_across_nodes_takes_the_same_gpus_on_each_node(proto: RequeueProtocol, slurm: FakeSlurm) -> None:
    slurm.add(FakeJob("7", req_gres=""))
    with pytest.raises(BadRequest, match="same GPU indices on each"):
        proto.resume("7", Placement((GpuRef("n1", 0), GpuRef("n2", 1))))
    with pytest.raises(BadRequest, match="whole GPUs"):
        proto.resume("7", Placement((GpuRef("n1", 0), GpuRef("n2", 0)), shared=True))
    assert slurm.calls == []
    proto.suspend("7")
    across = Placement((GpuRef("n1", 2), GpuRef("n1", 3), GpuRef("n2", 2), GpuRef("n2", 3)))
    res = proto.resume("7", across)
    assert res.outcome is Outcome.RUNNING and res.placement == across
    assert slurm.called("update")[0][2] == "gres=gpu:g2:1,gpu:g3:1 nodelist=n1,n2 numnodes=2-2 numtasks=2"


def test_phase_table() -> None:
    clock = FakeClock()
    s = FakeSlurm(clock)
    cases = [
        (FakeJob("a"), Phase.RUNNING),
        (FakeJob("b", state="COMPLETING"), Phase.STOPPING),
        (FakeJob("c", state="PENDING", hold=HoldKind.ADMIN, restart_count=2), Phase.HELD),
        (FakeJob("d", state="PENDING", hold=HoldKind.ADMIN), Phase.QUEUED_HELD),
        (FakeJob("e", state="PENDING", hold=HoldKind.USER), Phase.REQUEUED),
        (FakeJob("f", state="PENDING", reason="job_requeued_in_held_state"), Phase.REQUEUED),
        (FakeJob("g", state="PENDING", reason="BeginTime"), Phase.RELEASED),
        (FakeJob("h", state="FAILED"), Phase.FINISHED),
    ]
    for fj, want in cases:
        s.add(fj)
        assert phase(s.job(fj.job_id)) is want, fj.job_id


def test_gres_and_gpu_choice_helpers() -> None:
    assert gres_for(place("n1", 2, 0)) == "gpu:g0:1,gpu:g2:1"
    assert gres_for(place("n1", 1, shared=True)) == "shard:g1:1"
    assert gres_kind("") is GresKind.NONE
    assert gres_kind("gres:gpu:g0:1,gres:gpu:g2:1") is GresKind.GPU
    assert gres_kind("gres:gpu:2") is GresKind.UNTYPED
    assert gres_kind("gres:shard:g1:1") is GresKind.SHARD
    assert gres_kind("gres/gpu:0") is GresKind.NONE
    assert choose_gpus((0, 1, 2, 3), {1}, 2, prefer=(3,)) == (0, 3)
    with pytest.raises(BadRequest, match="free"):
        choose_gpus((0, 1), {0}, 2)
    clock = FakeClock()
    s = FakeSlurm(clock)
    s.add(FakeJob("1", node="n1", gpus=(0, 1)))
    s.add(FakeJob("2", node="n1", gpus=(3,), shared=True))
    assert busy_gpus(s.jobs(), "n1") == {0, 1, 3}
    assert busy_gpus(s.jobs(), "n1", exclude="1") == {3}


def test_a_deferred_pack_returns_starting_before_the_release_and_its_rest_starts_it(
    proto: RequeueProtocol, slurm: FakeSlurm, clock: FakeClock
) -> None:
    """`defer`: a job that may only begin after its old credential lapses is set up (placement, begin time)
    and left held; the result is STARTING, and its `rest()` releases it, waits until it runs and verifies."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    clock.t = 1000.0
    res = proto.migrate("7", place("n1", 1), defer=True)
    assert res.outcome is Outcome.STARTING and res.rest is not None
    assert not slurm.called("release")
    assert slurm.jobs_["7"].state == "PENDING" and slurm.jobs_["7"].begin >= 1001
    assert [s.step for s in res.steps][-2:] == [Step.SET_PLACEMENT, Step.CLEAR_BEGIN]
    final = res.rest()
    assert final.outcome is Outcome.RUNNING and final.placement == place("n1", 1)
    assert slurm.called("release") and slurm.jobs_["7"].state == "RUNNING"
    assert [s.step for s in final.steps][-3:] == [Step.RELEASE, Step.WAIT_RUNNING, Step.VERIFY]
    assert final.step(Step.SIGNAL) is not None  # one result for the whole operation


def test_without_a_begin_time_to_wait_for_defer_returns_once_the_job_is_released(
    proto: RequeueProtocol, slurm: FakeSlurm
) -> None:
    """A move to another node may begin at once: it is released, and `rest()` waits for Slurm's start."""
    slurm.add(FakeJob("7", node="n1", gpus=(0,), req_gres="gpu:g0:1"))
    res = proto.migrate("7", place("n2", 1), defer=True)
    assert res.outcome is Outcome.STARTING and res.rest is not None
    assert [s.step for s in res.steps][-1] is Step.RELEASE and res.step(Step.WAIT_RUNNING) is None
    assert slurm.jobs_["7"].state == "PENDING" and slurm.jobs_["7"].hold is HoldKind.NONE
    final = res.rest()
    assert final.outcome is Outcome.RUNNING and slurm.jobs_["7"].state == "RUNNING"
    assert [s.step for s in final.steps][-2:] == [Step.WAIT_RUNNING, Step.VERIFY]
