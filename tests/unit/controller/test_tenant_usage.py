"""The fair-share layer's decayed usage survives a controller restart (issue 30): written each round to the state
directory, read before a new policy's first round, decayed over the downtime; a missing file starts from zero
quietly, an unreadable one with one warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.controller.tenants import USAGE_FILE, restore_usage, save_usage
from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob
from tests.unit.controller.test_service import Toy

HOUR = 3600.0
TOPO = Topology.uniform(1, 3)


def _view(now: float, served_a: float) -> ClusterView:
    """3 GPUs, equal shares: alice runs a0 (its GPU-seconds `served_a`) and waits with 3 more jobs, bob
    waits with 3 jobs. 3 GPUs do not split evenly: the GPU left by rounding goes to the least-used."""
    g = TOPO.all_gpus()
    jobs = [Job(JobSpec("a0", "alice", 1, 1, 0.0), JobState.RUNNING, Placement((g[0],)), attained_service=served_a)]
    jobs += [Job(JobSpec(f"a{i}", "alice", 1, 1, 1.0)) for i in range(1, 4)]
    jobs += [Job(JobSpec(f"b{i}", "bob", 1, 1, 2.0)) for i in range(3)]
    return ClusterView(TOPO, tuple(jobs), now=now)


def test_a_restart_keeps_the_split_and_decays_over_the_downtime(tmp_path: Path) -> None:
    path = tmp_path / USAGE_FILE
    before = FairShare(make_policy("fifo"), half_life=10 * HOUR)
    before.decide(_view(1000.0, 10 * HOUR), 1000.0)  # alice received 10 GPU-hours
    save_usage(path, before)
    down = 10 * HOUR  # the controller is down one half-life; a0 runs on, one GPU-hour more
    after = FairShare(make_policy("fifo"), half_life=10 * HOUR)
    restore_usage(path, after, 1000.0 + down)
    view = _view(1000.0 + down, 11 * HOUR)
    after.decide(view, view.now)
    assert after.state.usage[("", "alice")] == pytest.approx(5 * HOUR + HOUR)  # decayed, plus a0's new hour only
    assert after.caps(view) == {("", "alice"): 1, ("", "bob"): 2}  # bob, the least-used, gets the odd GPU
    fresh = FairShare(make_policy("fifo"), half_life=10 * HOUR)  # as before this change: rebuilt from a0 alone
    restore_usage(tmp_path / "none.json", fresh, view.now)
    fresh.decide(_view(1000.0 + down, 0.0), view.now)
    assert fresh.state.usage == {} and fresh.caps(view) == {("", "alice"): 2, ("", "bob"): 1}


@pytest.mark.parametrize("text", ["{not json", '{"version": 1, "usages": {"fairshare": {"at": "x"}}}', "[]",
                                  '{"version": 1, "usages": {"fairshare": {"at": 1.0, "seen": {}, '
                                  '"usage": [["", "alice", -5]]}}}'])
def test_a_corrupt_file_is_one_warning_and_zero_usage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str) -> None:
    path = tmp_path / USAGE_FILE
    path.write_text(text)
    policy = FairShare(make_policy("fifo"))
    with caplog.at_level(logging.INFO):
        restore_usage(path, policy, 5000.0)
        restore_usage(path, policy, 5005.0)  # read once: the usage is no longer fresh
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "starting from zero" in warnings[0] and str(path) in warnings[0]
    assert policy.state.usage == {} and policy.state.at == 5000.0
    assert policy.decide(_view(5010.0, 60.0), 5010.0).decisions  # the round goes on
    caplog.clear()
    missing = FairShare(make_policy("fifo"))
    restore_usage(tmp_path / "gone" / USAGE_FILE, missing, 5000.0)
    assert not caplog.records and missing.state.usage == {}


def test_the_controller_writes_the_usage_each_round_and_reads_it_after_a_restart(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1", "RUNNING", gpus={"n1": (0,)}, start=1000.0)], clock=lambda: clock[0])
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\n")

    def controller() -> tuple[Controller, FairShare]:
        policy = FairShare(Toy(), half_life=HOUR)
        ctl = Controller(cfg, backend, Store(f"sqlite:///{tmp_path / 'g.db'}"), lambda: clock[0],
                         policy=cast(Policy, policy),
                         protocol=FakeProtocol(backend), topology=Topology.uniform(2, 4),
                         progress_reader=lambda _p, _u: None)
        return ctl, policy

    ctl, policy = controller()
    for _ in range(3):
        assert not ctl.tick().error
        clock[0] += 600.0
    used = policy.state.usage.get(("", "alice"), 0.0)
    assert used > 0 and (tmp_path / USAGE_FILE).is_file()
    clock[0] += HOUR  # down an hour: job 1 keeps running
    ctl2, policy2 = controller()
    assert not ctl2.tick().error
    service = policy2.state.seen["1"] - policy.state.seen["1"]  # what job 1 received while it was down
    assert service > 0
    assert policy2.state.usage[("", "alice")] == pytest.approx(used * 0.5 ** ((HOUR + 600.0) / HOUR) + service)
