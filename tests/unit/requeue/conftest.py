"""The requeue protocol's fixtures: a fake clock, the in-memory Slurm over tmp_path as the jobs root, and the
protocol on them (journal events collected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gandiva.requeue.operations import StepEvent
from slurm_gandiva.requeue.protocol import RequeueProtocol
from tests.unit.requeue.requeue_fakes import FakeClock, FakeSlurm


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def slurm(clock: FakeClock, tmp_path: Path) -> FakeSlurm:
    return FakeSlurm(clock, jobs_root=tmp_path)


@pytest.fixture
def events() -> list[StepEvent]:
    return []


@pytest.fixture
def proto(slurm: FakeSlurm, clock: FakeClock, tmp_path: Path, events: list[StepEvent]) -> RequeueProtocol:
    return RequeueProtocol(
        slurm,
        suspend_timeout=10.0,
        start_timeout=5.0,
        clock=clock,
        sleep=clock.sleep,
        journal=events.append,
        jobs_root=tmp_path,
        wall=clock,
    )
