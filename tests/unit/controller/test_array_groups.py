"""The controller gives the policy each job array's %MAX as a group cap (`ClusterView.group_caps`)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.arrays import array_caps, grouped_spec, with_array_groups
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.model import ClusterView, JobSpec, Topology
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.slurm.base import SlurmJob
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


def task(array: str, t: int, limit: int) -> SlurmJob:
    return replace(
        sjob(f"{array}_{t}", submit=time.time() - 600), array_id=array, array_max_tasks=limit
    )  # past the spec grace: registered from what Slurm says


def test_array_caps_and_groups_are_pure() -> None:
    jobs = {j.job_id: j for j in (task("7", 0, 2), task("7", 1, 2), task("8", 0, 0), sjob("9"))}
    assert array_caps(jobs) == {"7": 2}  # 8 has no throttle
    spec = JobSpec("7_0", "alice", 1, 1, 0.0)
    memo: dict[str, tuple[JobSpec, JobSpec]] = {}
    grouped = grouped_spec(spec, jobs["7_0"], memo)
    assert grouped.group == "7" and grouped_spec(spec, jobs["7_0"], memo) is grouped  # one spec per job
    assert grouped_spec(JobSpec("9", "alice", 1, 1, 0.0), jobs["9"]).group is None
    view = ClusterView(TOPO, ())
    assert with_array_groups(view, jobs).group_caps == {"7": 2}
    assert with_array_groups(view, {"9": jobs["9"]}) is view


class Recording:
    """The gandiva policy, keeping the plans it made (before the controller's safety net)."""

    name = "gandiva"

    def __init__(self) -> None:
        self.inner = make_policy("gandiva")
        self.plans: list[Plan] = []

    def decide(self, view: ClusterView, now: float) -> Plan:
        plan = self.inner.decide(view, now)
        self.plans.append(plan)
        return plan


def test_the_policy_sees_the_throttle_and_starts_max_tasks(tmp_path: Path) -> None:
    policy = Recording()
    backend = FakeBackend([task("7", t, 3) for t in range(6)] + [sjob("9", submit=time.time() - 600)])
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 60\nintrospect = 0.5\n")
    ctl = Controller(
        cfg,
        backend,
        Store(f"sqlite:///{tmp_path / 'g.db'}"),
        policy=policy,
        protocol=FakeProtocol(backend),
        topology=TOPO,
        progress_reader=lambda _p, _u: None,
    )
    rep = ctl.tick()
    assert not rep.error and rep.view is not None
    assert rep.view.group_caps == {"7": 3}
    assert {j.job_id: j.spec.group for j in rep.view.jobs} == {**{f"7_{t}": "7" for t in range(6)}, "9": None}
    started = {r.decision.job_id for r in rep.results if r.ok and r.decision.action is Action.START}
    # The policy itself planned within %3 (nothing for the safety net to drop) and gave job 9 a GPU too.
    assert policy.plans[-1] == rep.plan and len(rep.plan.by_action(Action.START)) == 4
    assert started == {"7_0", "7_1", "7_2", "9"}
