"""act: intent before acting, concurrent suspends, isolation of failures, slices with reasons."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.controller.act import Actor
from slurm_gandiva.errors import ProtocolError
from slurm_gandiva.model import JobSpec, JobState
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.requeue.operations import Op, Step, StepEvent, StepEventKind
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store import Outcome, SliceEnd, Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, pl, sjob


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'g.db'}")
    yield s
    s.close()


def setup(store: Store, running: dict[str, tuple[str, tuple[int, ...]]], waiting: list[str]) -> FakeBackend:
    jobs = []
    for jid, (node, idx) in running.items():
        jobs.append(sjob(jid, "RUNNING", hold=HoldKind.NONE, gpus={node: idx}))
        store.upsert_job(JobSpec(jid, "alice", 1, 4, 1.0), at=1.0, state=JobState.RUNNING)
        store.open_slice(jid, pl(node, *idx), 10.0)
    for jid in waiting:
        jobs.append(sjob(jid))
        store.upsert_job(JobSpec(jid, "alice", 1, 4, 1.0), at=1.0)
    return FakeBackend(jobs)


def actor(backend: FakeBackend, store: Store, proto: FakeProtocol) -> Actor:
    a = Actor(backend, store, clock=time.time)
    a.protocol = proto
    return a


def test_intent_is_recorded_before_acting_and_outcome_after(store: Store) -> None:
    backend = setup(store, {}, ["1"])
    proto = FakeProtocol(backend)
    seen: list[tuple[str, Action]] = []
    proto.on_call = lambda op, jid: seen.extend((i.job_id, i.action) for i in store.open_intents())
    res = actor(backend, store, proto).execute(Plan((Decision(Action.START, "1", pl("n1", 0, 1)),)))
    assert seen == [("1", Action.START)]
    assert res[0].ok and store.open_intents() == ()
    [d] = store.decisions(job_ids=["1"])
    assert d.outcome is Outcome.SUCCEEDED
    cur = store.current_slice("1")
    assert cur is not None and cur.placement == pl("n1", 0, 1)
    assert store.get_job("1").state is JobState.RUNNING


def test_suspends_run_concurrently(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0,)), "2": ("n1", (1,)), "3": ("n2", (0,))}, [])
    proto = FakeProtocol(backend, delay=1.0)  # one after the other: 3 s; at once: 1 s, whatever the load adds
    plan = Plan(tuple(Decision(Action.SUSPEND, j) for j in ("1", "2", "3")))
    t0 = time.monotonic()
    res = actor(backend, store, proto).execute(plan)
    took = time.monotonic() - t0
    assert all(r.ok for r in res)
    assert took < 2.0, f"3 suspends of 1 s took {took:.2f} s: not concurrent"
    for jid in ("1", "2", "3"):
        [s] = store.slices(job_ids=[jid])
        assert s.end_reason is SliceEnd.QUANTUM
        assert store.get_job(jid).state is JobState.SUSPENDED


def test_starts_run_concurrently(store: Store) -> None:
    backend = setup(store, {}, ["1", "2", "3", "4"])
    proto = FakeProtocol(backend, delay=1.0)
    plan = Plan(tuple(Decision(Action.START, j, pl("n1", int(j) - 1)) for j in ("1", "2", "3", "4")))
    t0 = time.monotonic()
    res = actor(backend, store, proto).execute(plan)
    took = time.monotonic() - t0
    assert [r.decision.job_id for r in res] == ["1", "2", "3", "4"] and all(r.ok for r in res)
    assert took < 2.5, f"4 starts of 1 s took {took:.2f} s: not concurrent"
    assert all(store.current_slice(j) is not None for j in ("1", "2", "3", "4"))


def test_a_start_on_gpus_a_migrating_job_holds_waits_for_the_migration(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0, 2))}, ["2"])
    proto = FakeProtocol(backend, delay=0.3)
    order: list[tuple[str, str, float]] = []
    proto.on_call = lambda op, jid: order.append((op, jid, time.monotonic()))
    plan = Plan(
        (
            Decision(Action.MIGRATE, "1", pl("n1", 0, 1)),
            Decision(Action.START, "2", pl("n1", 2)),  # job 1's GPU until it has moved
        )
    )
    res = actor(backend, store, proto).execute(plan, {"1": pl("n1", 0, 2)})
    assert all(r.ok for r in res)
    assert [(op, jid) for op, jid, _ in order] == [("migrate", "1"), ("resume", "2")]
    assert order[1][2] - order[0][2] >= 0.3, "the start did not wait for the migration to finish"


def test_a_start_on_a_moving_jobs_gpus_begins_when_that_job_has_stopped(store: Store) -> None:
    """A pack or migrate frees its GPUs half-way (suspended, before it starts again elsewhere): a start on
    them begins then, not after the move's slower second half; the round takes the move's time, not both."""
    backend = setup(store, {"1": ("n1", (0,))}, ["2"])
    proto = FakeProtocol(backend, delay=0.1)
    proto.resume_delay = 1.5  # the move's second half: far longer than anything a loaded machine adds
    at: dict[tuple[str, str], float] = {}
    proto.on_call = lambda op, jid: at.setdefault((op, jid), time.monotonic())  # type: ignore[assignment]
    plan = Plan((Decision(Action.MIGRATE, "1", pl("n1", 1)), Decision(Action.START, "2", pl("n1", 0))))
    res = actor(backend, store, proto).execute(plan, {"1": pl("n1", 0)}, ties=False)  # ties: the test below
    assert all(r.ok for r in res)
    began = proto.ran_at["2"] - at[("migrate", "1")]
    assert 0.1 <= began < 1.5, f"the start ran {began:.2f} s after the move began, not at its stop (0.1 s)"
    assert proto.ran_at["2"] < proto.ran_at["1"], "the start waited for the whole move"
    assert store.current_slice("2") is not None and store.current_slice("1") is not None


def test_a_move_that_stopped_and_then_failed_does_not_block_its_old_gpus(store: Store) -> None:
    """Its job is suspended (it holds nothing): the start on its old GPU goes ahead."""
    backend = setup(store, {"1": ("n1", (0,))}, ["2"])
    proto = FakeProtocol(backend, delay=0.05)
    proto.resume_delay = 0.05
    real_run = proto._run

    def failing_resume(op: Op, job_id: str, placement: object, **kw: object) -> object:
        if job_id == "1":
            raise ProtocolError("job 1 did not start within 60 s")
        return real_run(op, job_id, placement, **kw)  # type: ignore[arg-type]

    proto._run = failing_resume  # type: ignore[method-assign,assignment]
    plan = Plan((Decision(Action.MIGRATE, "1", pl("n1", 1)), Decision(Action.START, "2", pl("n1", 0))))
    res = actor(backend, store, proto).execute(plan, {"1": pl("n1", 0)}, ties=False)
    assert [r.ok for r in res] == [False, True]
    assert store.get_job("1").state is JobState.SUSPENDED


def test_a_tie_still_waits_for_the_tied_move_to_run_again() -> None:
    """22.05: job 1 (old GPU index 0) goes to n2:1; job 2 may take n2:0 only once 1 runs again."""
    from slurm_gandiva.controller.act import _tie_dependencies

    held = {"1": pl("n1", 0)}
    plan = [Decision(Action.MIGRATE, "1", pl("n2", 1)), Decision(Action.START, "2", pl("n2", 0))]
    assert _tie_dependencies(plan, held, {}) == [set(), {0}]


def test_a_resume_that_slurm_would_never_start_is_skipped_at_once_and_backed_off(store: Store) -> None:
    """22.05: job 3 last ran on n1:1, which job 10 holds and keeps; resumed to n1:0 it would wait on Resources
    until job 10 stops (the round blocked for the start timeout). It is skipped with the reason, no Slurm
    call; a resume there once the holder is suspended in the same plan, or onto its own index, goes ahead."""
    from slurm_gandiva.controller.act import _tie_conflicts

    held = {"10": pl("n1", 1), "2": pl("n1", 0)}
    last = {"3": pl("n1", 1)}
    plan = [Decision(Action.SUSPEND, "2"), Decision(Action.RESUME, "3", pl("n1", 0))]
    (why,) = _tie_conflicts(plan, held, last).values()
    assert "old GPU index 1" in why and "job 10" in why
    assert _tie_conflicts([*plan, Decision(Action.SUSPEND, "10")], held, last) == {}
    assert _tie_conflicts([Decision(Action.MIGRATE, "10", pl("n2", 1)), plan[1]], held, last) == {}
    assert _tie_conflicts([Decision(Action.RESUME, "3", pl("n2", 0))], held, last) == {}  # another node
    # Through the actor: no protocol call for it, and its result says why and is backed off like a failure.
    backend = setup(store, {"10": ("n1", (1,)), "2": ("n1", (0,))}, ["3"])
    proto = FakeProtocol(backend)
    res = actor(backend, store, proto).execute(Plan(tuple(plan)), held, last, ties=True)
    assert [(r.decision.job_id, r.ok, r.tied) for r in res] == [("2", True, False), ("3", False, True)]
    assert [c[1] for c in proto.calls] == ["2"]
    res = actor(backend, store, proto).execute(Plan((plan[1],)), {"10": pl("n1", 1)}, last, ties=False)
    assert res[0].ok  # where Slurm does not tie indices, nothing is skipped


def test_dependencies_name_the_decisions_holding_a_target_and_allow_cycles() -> None:
    from slurm_gandiva.controller.act import _dependencies

    held = {"1": pl("n1", 0), "2": pl("n1", 1), "3": pl("n1", 2)}
    chain = [
        Decision(Action.MIGRATE, "1", pl("n1", 1)),  # waits for 2
        Decision(Action.MIGRATE, "2", pl("n1", 3)),
        Decision(Action.START, "4", pl("n2", 0)),
    ]
    assert _dependencies(chain, held)[0] == [{1}, set(), set()]
    swap = [Decision(Action.MIGRATE, "1", pl("n1", 1)), Decision(Action.MIGRATE, "2", pl("n1", 0))]
    assert _dependencies(swap, held)[0] == [{1}, {0}]  # a cycle: execute runs it in plan order
    stop = [Decision(Action.SUSPEND, "3"), Decision(Action.START, "4", pl("n1", 2, 3))]
    assert _dependencies(stop, held)[0] == [set(), {0}]  # a start waits for the suspend of its GPUs' holder


def test_a_start_on_a_gpu_of_a_resumed_jobs_old_index_waits_for_that_resume() -> None:
    """Slurm will not start a requeued job on a node where a GPU of one of its old indices is taken: job
    7 (last on n1:2) resumes on n2:0, so job 3 may take n2:2 only once 7 runs; job 5 on n2:3 need not wait."""
    from slurm_gandiva.controller.act import _dependencies

    plan = [
        Decision(Action.RESUME, "7", pl("n2", 0)),
        Decision(Action.RESUME, "3", pl("n2", 2)),
        Decision(Action.START, "5", pl("n2", 3)),
    ]
    assert _dependencies(plan, {}, {"7": pl("n1", 2)})[0] == [set(), {0}, set()]
    assert _dependencies(plan, {})[0] == [set(), set(), set()]  # nothing known: no order
    assert _dependencies(plan, {}, {"7": pl("n1", 2)}, ties=False)[0] == [set(), set(), set()]


def test_a_start_of_an_array_task_past_the_throttle_waits_for_one_suspend_of_its_array() -> None:
    from slurm_gandiva.controller.act import _dependencies

    plan = [
        Decision(Action.SUSPEND, "7_0"),
        Decision(Action.SUSPEND, "7_1"),
        Decision(Action.SUSPEND, "9"),
        Decision(Action.START, "7_2", pl("n2", 0)),  # the array's one free place
        Decision(Action.START, "7_3", pl("n2", 1)),  # 7_0's place
        Decision(Action.RESUME, "7_4", pl("n2", 2)),  # 7_1's place
        Decision(Action.START, "8", pl("n2", 3)),
    ]
    groups = {f"7_{t}": "7" for t in range(5)}
    deps, places = _dependencies(plan, {}, groups=groups, room={"7": 1})
    assert deps == [set(), set(), set(), set(), {0}, {1}, set()]
    assert places == {4: (0,), 5: (1,)}


def test_a_start_waits_only_for_the_suspend_that_frees_its_gpus(store: Store) -> None:
    """Per-decision dependencies, not waves: a start on free GPUs begins at once, a start on a suspended
    job's GPU as soon as that suspend is done, whatever the slowest suspend of the round takes."""
    backend = setup(store, {"1": ("n1", (0,)), "2": ("n1", (1,))}, ["3", "4"])
    proto = FakeProtocol(backend)
    delays = {("suspend", "1"): 0.1, ("suspend", "2"): 1.5}
    at: dict[tuple[str, str], float] = {}
    t0 = time.monotonic()

    def slow(op: str, jid: str) -> None:
        at[(op, jid)] = time.monotonic() - t0
        time.sleep(delays.get((op, jid), 0.1))

    proto.on_call = slow
    plan = Plan(
        (
            Decision(Action.SUSPEND, "1"),
            Decision(Action.SUSPEND, "2"),
            Decision(Action.START, "3", pl("n1", 0)),  # job 1's GPU
            Decision(Action.START, "4", pl("n2", 0)),  # free
        )
    )
    res = actor(backend, store, proto).execute(plan, {"1": pl("n1", 0), "2": pl("n1", 1)})
    assert [r.decision.job_id for r in res] == ["1", "2", "3", "4"] and all(r.ok for r in res)
    # Relative to the slow suspend (1.5 s), not to the clock: a loaded machine delays every thread alike.
    slow_ends = at[("suspend", "2")] + 1.5
    assert at[("resume", "4")] < slow_ends, at  # no suspend in its way
    ran = proto.ran_at["3"] - t0
    assert at[("suspend", "1")] + 0.1 <= ran < slow_ends, (ran, at)  # after job 1's suspend, before job 2's ends
    # Set up and released at once (Slurm starts it as job 1's completion frees the GPU), not after.
    assert at[("resume", "3")] < slow_ends and ("released-ahead", "3", pl("n1", 0)) in proto.calls, at


def test_a_start_of_an_array_task_is_skipped_when_the_task_whose_place_it_takes_failed_to_stop(
    store: Store,
) -> None:
    backend = setup(store, {"7_0": ("n1", (0,))}, ["7_1", "8"])
    proto = FakeProtocol(backend, fail=frozenset({"7_0"}))
    plan = Plan(
        (
            Decision(Action.SUSPEND, "7_0"),
            Decision(Action.START, "7_1", pl("n2", 0)),
            Decision(Action.START, "8", pl("n2", 1)),
        )
    )
    groups = {"7_0": "7", "7_1": "7"}
    res = {
        r.decision.job_id: r
        for r in actor(backend, store, proto).execute(plan, {"7_0": pl("n1", 0)}, groups=groups, room={"7": 0})
    }
    assert not res["7_0"].ok and not res["7_1"].ok and "array's place" in res["7_1"].detail
    assert res["8"].ok
    assert ("resume", "7_1", pl("n2", 0)) not in proto.calls


def test_a_cycle_runs_one_at_a_time_in_plan_order(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0,)), "2": ("n1", (1,))}, [])
    proto = FakeProtocol(backend, delay=0.05)
    plan = Plan((Decision(Action.MIGRATE, "1", pl("n1", 1)), Decision(Action.MIGRATE, "2", pl("n1", 0))))
    res = actor(backend, store, proto).execute(plan, {"1": pl("n1", 0), "2": pl("n1", 1)})
    assert all(r.ok for r in res)
    assert [(op, jid) for op, jid, _ in proto.calls] == [("migrate", "1"), ("migrate", "2")]


def test_should_stop_starts_no_more_decisions_but_suspends(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0,))}, ["2", "3"])
    proto = FakeProtocol(backend)
    a = actor(backend, store, proto)
    a.should_stop = lambda: True
    plan = Plan(
        (
            Decision(Action.SUSPEND, "1"),
            Decision(Action.START, "2", pl("n1", 0)),
            Decision(Action.START, "3", pl("n2", 0)),
        )
    )
    res = a.execute(plan, {"1": pl("n1", 0)})
    assert [r.decision.job_id for r in res] == ["1"] and res[0].ok
    assert [(op, jid) for op, jid, _ in proto.calls] == [("suspend", "1")]


def test_a_failed_decision_is_isolated_and_blocks_only_its_gpus(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0,)), "2": ("n1", (1,))}, ["3", "4"])
    proto = FakeProtocol(backend, fail=frozenset({"1"}))
    plan = Plan(
        (
            Decision(Action.SUSPEND, "1"),
            Decision(Action.SUSPEND, "2"),
            Decision(Action.START, "3", pl("n1", 0)),  # needs job 1's GPU: must be skipped
            Decision(Action.START, "4", pl("n1", 1)),  # job 2's GPU: fine
        )
    )
    held = {"1": pl("n1", 0), "2": pl("n1", 1)}
    res = {r.decision.job_id: r for r in actor(backend, store, proto).execute(plan, held)}
    assert not res["1"].ok and "injected failure" in res["1"].detail
    assert res["2"].ok and res["4"].ok
    assert not res["3"].ok and "skipped" in res["3"].detail
    # Released ahead of job 1's suspend, then held back when that failed: it never ran, it holds nothing.
    assert "3" not in proto.ran_at and backend.job("3").pending and not backend.job("3").gpus
    assert store.current_slice("3") is None
    assert store.current_slice("1") is not None  # still running as far as we know
    assert store.current_slice("4").placement == pl("n1", 1)
    assert {d.job_id: d.outcome for d in store.decisions()}["1"] is Outcome.FAILED


def test_migrate_closes_with_reason_and_opens_new_slice(store: Store) -> None:
    backend = setup(store, {"1": ("n1", (0, 2))}, [])
    proto = FakeProtocol(backend)
    a = actor(backend, store, proto)
    a.execute(Plan((Decision(Action.MIGRATE, "1", pl("n2", 0, 1)),)))
    a.execute(Plan((Decision(Action.RESIZE, "1", pl("n2", 0, 1, 2, 3)),)))
    s = store.slices(job_ids=["1"])
    assert [x.end_reason for x in s] == [SliceEnd.MIGRATE, SliceEnd.RESIZE, None]
    assert s[-1].placement == pl("n2", 0, 1, 2, 3)
    assert [c[0] for c in proto.calls] == ["migrate", "resize"]


def test_journal_records_protocol_steps(store: Store) -> None:
    backend = setup(store, {}, ["1"])
    a = actor(backend, store, FakeProtocol(backend))
    did = store.record_intent("1", Action.START, pl("n1", 0), "", 1.0)
    a._decision_of["1"] = did
    a.journal(StepEvent("1", Op.RESUME, Step.RELEASE, StepEventKind.START))
    a.journal(StepEvent("1", Op.RESUME, Step.RELEASE, StepEventKind.END, 0.1, "released"))
    a.journal(StepEvent("1", Op.RESUME, Step.VERIFY, StepEventKind.SKIP, 0.0, "already"))
    steps = store.steps(did)
    assert [(s.step, s.end is not None) for s in steps] == [("release", True), ("verify", True)]
    assert steps[0].detail == "released"


def test_crash_hook_exits_137_at_the_named_step(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "from slurm_gandiva.controller.act import Actor\n"
        "from slurm_gandiva.requeue.operations import Op, Step, StepEvent, StepEventKind\n"
        "from slurm_gandiva.store import Store\n"
        f"s = Store('sqlite:///{tmp_path}/c.db')\n"
        "a = Actor(None, s, clock=time.time, crash_at='suspend:signal')\n"
        "a.journal(StepEvent('1', Op.SUSPEND, Step.SIGNAL, StepEventKind.START))\n"
        "print('survived start', flush=True)\n"
        "a.journal(StepEvent('1', Op.SUSPEND, Step.SIGNAL, StepEventKind.END))\n"
        "print('survived end', flush=True)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 137, p.stderr
    assert "survived start" in p.stdout and "survived end" not in p.stdout
