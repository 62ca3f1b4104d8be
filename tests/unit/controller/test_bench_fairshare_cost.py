"""The fair-share cost benchmark's parts, on a small view (its 10,000-job run is benchmarks/results)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from slurm_gandiva.model import JobState
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.fairshare import FairShare

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_fairshare_cost.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fairshare_cost", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_view_has_four_tenants_and_shares_take_effect(bench: ModuleType, tmp_path: Path) -> None:
    view = bench.make_view(400, "devcluster")
    assert len({(j.spec.account, j.spec.user) for j in view.jobs}) == 4
    assert view.tenants is not None and dict(view.tenants.shares) == bench.SHARES
    rounds = bench.trajectory(lambda: FairShare(make_policy("gandiva")), view, tmp_path / "t.json", trace=True)
    assert len(rounds) == len(bench.ROUND_TIMES) and all(s > 0 and mb > 0 for s, _n, mb in rounds)
    assert (tmp_path / "t.json").exists()  # the tenant table the controller writes every round


def test_advance_serves_running_jobs_only(bench: ModuleType) -> None:
    view = bench.make_view(20, "devcluster")
    plan = make_policy("gandiva").decide(view, 0.0)
    later = bench.advance(plan.apply(view), 5.0)
    served = Counter(j.state for j in later.jobs if j.attained_service == 5.0 * j.gpus and j.gpus)
    assert later.now == 5.0 and served[JobState.RUNNING] == sum(j.state is JobState.RUNNING for j in later.jobs) > 0
    assert all(j.attained_service == 0.0 for j in later.jobs if j.state is not JobState.RUNNING)
