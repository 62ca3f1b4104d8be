"""A move Slurm refuses or that does not start in time is backed off (issue 29, item 3): the job waits
longer after each failure in a row, with a REASON in `gandiva squeue`, and its GPUs go to others meanwhile;
a start that runs on after its round and then fails counts like one that failed within it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.service import BACKOFF_EVENT, Controller
from slurm_gandiva.errors import LimitRefusal, ProtocolError
from slurm_gandiva.model import Placement, Topology
from slurm_gandiva.requeue.operations import Op, OpResult, Outcome, Step, StepRecord
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob
from tests.unit.controller.test_service import Toy

TOPO = Topology.uniform(2, 4)


def _controller(tmp_path: Path, backend: FakeBackend, proto: FakeProtocol, clock: list[float]) -> tuple[
        Controller, Store]:
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\n")
    ctl = Controller(cfg, backend, store, lambda: clock[0], policy=Toy(), protocol=proto, topology=TOPO,
                     progress_reader=lambda _p, _u: None)
    return ctl, store


def test_a_failing_start_backs_off_longer_each_time_and_its_gpus_go_to_others(tmp_path: Path) -> None:
    clock = [1000.0]
    # Three 4-GPU jobs on two 4-GPU nodes; job 1 (the oldest) can never start.
    backend = FakeBackend([sjob(j, submit=float(j), tres="gres:gpu:4") for j in ("1", "2", "3")],
                          clock=lambda: clock[0])
    proto = FakeProtocol(backend, fail=frozenset({"1"}))
    ctl, store = _controller(tmp_path, backend, proto, clock)
    ctl.tick()
    assert sorted(c[1] for c in proto.calls) == ["1", "2"] and backend.job("2").state == "RUNNING"
    clock[0] += 5
    ctl.tick()  # job 1 waits for its back-off: job 3 gets the GPUs the policy would have kept for job 1
    assert sorted(c[1] for c in proto.calls) == ["1", "2", "3"] and backend.job("3").state == "RUNNING"
    for j in ("2", "3"):  # the two jobs end: job 1 alone is left
        backend.set(sjob(j, "COMPLETED", tres="gres:gpu:4"))
    tries = []
    for _ in range(60):  # 300 s, a tick every 5 s
        clock[0] += 5
        before = len(proto.calls)
        ctl.tick()
        if len(proto.calls) > before:
            tries.append(clock[0])
    assert tries == [1030.0, 1090.0, 1210.0]  # 30 s, then 60 s, then 120 s after each failure
    events = store.events(job_id="1", kinds=[BACKOFF_EVENT])
    assert len(events) == 4 and "(4 in a row): not tried again for 240 s" in events[-1].detail
    assert "injected failure" in events[-1].detail
    cfg = parse_config(f"state_dir = {tmp_path}\npartitions = gpu\n")
    (row,) = [r for r in queue_rows(cfg, backend, store) if r.job_id == "1"]
    assert "start failed (4 in a row): not tried again for 240 s" in row.reason
    # It starts once it can; a later failure backs off one quantum again.
    proto.fail.clear()
    clock[0] = 1210.0 + 240.0
    assert [r.ok for r in ctl.tick().results] == [True]
    (row,) = [r for r in queue_rows(cfg, backend, store) if r.job_id == "1"]
    assert row.reason == ""
    assert "1" not in ctl._failures  # the row of failures ended
    store.close()


class RefusedLater(FakeProtocol):
    """Sets a start up and leaves its wait to run on after the round; that wait fails as Slurm's would (with
    `error(job_id)`: by default a start Slurm did not run in time)."""

    def __init__(self, backend: FakeBackend, error: Callable[[str], Exception] | None = None) -> None:
        super().__init__(backend)
        self.error = error or (lambda j: ProtocolError(f"job {j} did not start within 60 s (still PENDING, "
                                                       "BadConstraints)"))

    def resume(self, job_id: str, placement: Placement, *, until_free: Callable[[], None] | None = None,
               defer: bool = False) -> OpResult:
        self._enter("resume", job_id, placement)

        def rest() -> OpResult:
            raise self.error(job_id)

        return OpResult(job_id, Op.RESUME, Outcome.STARTING, (StepRecord(Step.SET_PLACEMENT, 0.0),), placement,
                        "", rest)


def test_a_start_that_fails_after_its_round_is_backed_off_too(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=1.0, tres="gres:gpu:4")], clock=lambda: clock[0])
    proto = RefusedLater(backend)
    ctl, store = _controller(tmp_path, backend, proto, clock)
    assert [(r.ok, r.starting) for r in ctl.tick().results] == [(True, True)]
    assert ctl.actor.wait_started(timeout=5)
    clock[0] += 5
    ctl.tick()  # notes the failed start: not tried again for a quantum
    clock[0] += 20
    ctl.tick()
    assert len(proto.calls) == 1
    (event,) = store.events(job_id="1", kinds=[BACKOFF_EVENT])
    assert "BadConstraints" in event.detail and "not tried again for 30 s" in event.detail
    clock[0] += 11
    ctl.tick()
    assert len(proto.calls) == 2
    store.close()


def test_a_start_held_back_by_a_limit_has_the_tenants_read_again_at_once(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=1.0, tres="gres:gpu:4")], clock=lambda: clock[0])
    held_back = RefusedLater(backend, lambda j: LimitRefusal(f"job {j}: Slurm's accounting holds it back (QOSGrpGRES)"))
    ctl, store = _controller(tmp_path, backend, held_back, clock)
    ctl.config = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\naccounting_refresh = 600\n")

    def reads() -> int:
        return len([c for c in backend.calls if c[0] == "tenants"])

    ctl.tick()
    assert ctl.actor.wait_started(timeout=5)
    n = reads()
    clock[0] += 5
    ctl.tick()  # notes the refused start
    clock[0] += 5
    ctl.tick()  # reads Slurm's limits again, not 600 s later
    assert reads() == n + 1
    (event,) = store.events(job_id="1", kinds=[BACKOFF_EVENT])
    assert "QOSGrpGRES" in event.detail
    clock[0] += 5
    ctl.tick()
    assert reads() == n + 1  # and then as configured
    store.close()


def test_a_resume_skipped_for_a_tie_waits_one_quantum_each_time_but_one_skipped_for_anothers_failure_not(
        tmp_path: Path) -> None:
    from slurm_gandiva.controller.act import ActResult
    from slurm_gandiva.plan import Action, Decision
    from slurm_gandiva.store import Outcome as StoreOutcome

    clock = [1000.0]
    backend = FakeBackend([sjob("1", submit=1.0, tres="gres:gpu:4")], clock=lambda: clock[0])
    ctl, store = _controller(tmp_path, backend, FakeProtocol(backend), clock)
    tied = ActResult(Decision(Action.RESUME, "3"), StoreOutcome.FAILED, "skipped: Slurm ties it", tied=True)
    other = ActResult(Decision(Action.RESUME, "4"), StoreOutcome.FAILED, "skipped: its GPUs are still held")
    ctl._note_failures((tied, other))
    assert set(ctl._backoff) == {"3"} and ctl._backoff["3"] == 1030.0
    # The round placed it where Slurm would not start it, not the job's fault: a second skip in a row waits
    # one quantum again (a failure in a row would wait 60 s), and the row of real failures is left as it is.
    clock[0] = 1030.0
    ctl._note_failures((tied,))
    assert ctl._backoff["3"] == 1060.0 and "3" not in ctl._failures
    (event,) = store.events(job_id="3", kinds=[BACKOFF_EVENT])[-1:]
    assert "not tried for 30 s" in event.detail and "in a row" not in event.detail
    failed = ActResult(Decision(Action.RESUME, "3"), StoreOutcome.FAILED, "Slurm refused", decision_id=7)
    ctl._note_failures((failed,))
    assert ctl._failures["3"] == 1 and ctl._backoff["3"] == 1060.0  # a real failure: one quantum, the row starts
    store.close()
