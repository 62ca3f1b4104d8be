"""A throttled array's never-run tail is tracked lazily: a window of its next tasks, the rest one summary."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.arrays import array_window, task_ranges, window_size
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.reconcile import Reconciler
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import Topology
from slurm_gandiva.plan import Action
from slurm_gandiva.slurm.base import HoldKind, SlurmJob
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

T0 = time.time() - 600  # past the spec grace: registered from what Slurm says
TOPO = Topology.uniform(1, 4, gpus_per_switch=2, sockets=2)


def task(array: str, t: int, limit: int, user: str = "a", **kw: object) -> SlurmJob:
    return replace(sjob(f"{array}_{t}", user=user, submit=T0, **kw), array_id=array, array_max_tasks=limit)  # type: ignore[arg-type]


def test_window_keeps_what_ran_and_the_next_never_run_tasks_in_task_order() -> None:
    w = window_size(1)
    jobs = {j.job_id: j for j in (
        task("7", 0, 1, state="RUNNING", gpus={"n1": (0,)}),
        task("7", 1, 1, restarts=1),  # ran once, waits again: it holds state
        *(task("7", t, 1) for t in range(2, 5_000)),
        task("8", 0, 0), task("8", 1, 0),  # not throttled: all tracked
        sjob("9", user="b"),
    )}
    kept, untracked = array_window(jobs)
    assert set(kept) == {"7_0", "7_1", *(f"7_{t}" for t in range(2, 2 + w)), "8_0", "8_1", "9"}
    (u,) = untracked.values()
    assert (u.array_id, u.user, u.tasks) == ("7", "a", tuple(range(2 + w, 5_000)))
    assert u.job_id == f"7_[{2 + w}-4999]"
    assert list(kept) == [jid for jid in jobs if jid in kept]  # Slurm's order kept
    backwards = dict(reversed(jobs.items()))  # tasks split off from the meta record come in any order
    assert array_window(backwards)[0].keys() == kept.keys() and array_window(backwards)[1] == untracked
    small = {j.job_id: j for j in (task("5", t, 2) for t in range(window_size(2)))}
    assert array_window(small) == (small, {})
    assert task_ranges([1, 2, 3, 5, 7, 8]) == "1-3,5,7-8"


def test_another_users_job_is_registered_in_the_first_round_and_the_array_tracks_its_window(
    tmp_path: Path,
) -> None:
    tasks = [task("7", t, 1) for t in range(20_000)]
    backend = FakeBackend([*tasks, sjob("8", user="b", submit=T0 + 30)])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time)
    r.settle(backend.snapshot())
    assert store.get_job("8") is not None
    for _ in range(3):
        r.settle(backend.snapshot())
    users = Counter(rec.user for rec in store.list_jobs())
    assert users == {"a": window_size(1), "b": 1}  # all tracked: 499 of a's tasks a round
    assert {rec.job_id for rec in store.list_jobs() if rec.user == "a"} == {f"7_{t}" for t in range(window_size(1))}
    store.close()


def test_every_task_runs_in_task_order_within_its_throttle_and_squeue_shows_the_rest(tmp_path: Path) -> None:
    n, limit = 60, 2
    w = window_size(limit)
    backend = FakeBackend([task("7", t, limit) for t in range(n)] + [sjob("9", user="b", submit=T0 + 30)])
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 60\nintrospect = 0.5\n")
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    ctl = Controller(cfg, backend, store, policy=None, protocol=FakeProtocol(backend), topology=TOPO,
                     progress_reader=lambda _p, _u: None)
    rows = {r.job_id: r for r in queue_rows(cfg, backend, store)}
    assert rows[f"7_[{w}-{n - 1}]"].state == "waiting" and "7_0" in rows and f"7_{w}" not in rows
    started: list[int] = []
    ended = 0
    for _ in range(400):
        rep = ctl.tick()
        assert not rep.error and rep.view is not None
        tasks = [j for j in rep.view.jobs if j.spec.group == "7"]
        assert sum(1 for j in tasks if j.placement is None) <= w  # at most W never-run tasks tracked
        for r in rep.results:
            if r.ok and r.decision.action is Action.START and r.decision.job_id.startswith("7_"):
                t = int(r.decision.job_id.split("_")[1])
                assert t < ended + w  # in task order: only the window's tasks start
                started.append(t)
        running = [j for j in backend.jobs() if j.array_id == "7" and j.running]
        assert len(running) <= limit
        for j in running:  # each task ends after one round
            backend.set(replace(j, state="COMPLETED", gpus={}))
            ended += 1
        if ended == n:
            break
    assert sorted(started) == list(range(n))
    assert backend.job("9").running
    store.close()


def test_untracked_tasks_an_array_hold_missed_are_held_too(tmp_path: Path) -> None:
    tasks = [task("40", t, 1, hold=HoldKind.USER) for t in range(window_size(1) + 5)]
    backend = FakeBackend(tasks)
    backend.hold = lambda job_id: backend.calls.append(("hold", job_id))  # type: ignore[method-assign]
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time)
    r.settle(backend.snapshot())
    assert backend.calls == [("hold", "40")]
    backend.calls.clear()
    r.settle(backend.snapshot())  # still waiting unheld: every task is held one by one, tracked or not
    assert sorted(backend.calls) == sorted(("hold", j.job_id) for j in tasks)
    store.close()
