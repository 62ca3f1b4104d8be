"""Tenants in the controller (issue 30): Slurm's shares and GPU limits read at most once a round and cached,
the controller going on without slurmdbd, the fair-share layer from the config, and a job that a GPU limit
keeps waiting for good told in `gandiva squeue`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.service import LIMIT_EVENT, Controller, make_configured_policy
from slurm_gandiva.controller.tenants import ACCOUNTING_EVENT, ACCOUNTING_OFF_RETRY_S, TENANTS_REFRESH_S
from slurm_gandiva.errors import AccountingUnavailable
from slurm_gandiva.model import GpuLimit, Tenants, Topology
from slurm_gandiva.selector.fairshare import FairShare
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, sjob
from tests.unit.controller.test_service import Toy

TOPO = Topology.uniform(2, 4)
PHYSICS = Tenants(shares={"physics": 2.0, "bio": 1.0})


def _controller(tmp_path: Path, backend: FakeBackend, clock: list[float], extra: str = "") -> tuple[Controller, Store]:
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\n{extra}")
    ctl = Controller(cfg, backend, store, lambda: clock[0], policy=Toy(), protocol=FakeProtocol(backend),
                     topology=TOPO, progress_reader=lambda _p, _u: None)
    return ctl, store


def _reads(backend: FakeBackend) -> int:
    return sum(1 for c in backend.calls if c[0] == "tenants")


def test_the_view_gets_slurms_tenants_read_once_a_minute_and_the_policy_from_the_config(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1")], clock=lambda: clock[0])
    backend.accounting = PHYSICS
    ctl, _ = _controller(tmp_path, backend, clock)
    for _ in range(12):  # 60 s of 5-s rounds
        rep = ctl.tick()
        assert rep.view is not None and rep.view.tenants == PHYSICS and not rep.error
        clock[0] += 5
    assert _reads(backend) == 1
    backend.accounting = Tenants(shares={"physics": 3.0})
    assert ctl.tick().view.tenants == backend.accounting
    assert _reads(backend) == 2 and TENANTS_REFRESH_S == 60.0
    cfg = parse_config(f"state_dir = {tmp_path}\nfairness = shares\nfairness_half_life = 3600\n")
    policy = make_configured_policy(cfg)
    assert isinstance(policy, FairShare) and policy.half_life == 3600.0 and policy.inner.name == cfg.policy
    assert not isinstance(make_configured_policy(parse_config(f"state_dir = {tmp_path}\n")), FairShare)


def test_slurmdbd_down_the_controller_goes_on_with_the_last_tenants_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1")], clock=lambda: clock[0])
    backend.accounting = AccountingUnavailable("slurmdbd is down")
    ctl, store = _controller(tmp_path, backend, clock, "fairness = shares\n")
    for _ in range(3):  # down at start: equal shares, no limits, the rounds run
        rep = ctl.tick()
        clock[0] += 5
    assert not rep.error and rep.view is not None and rep.view.tenants is None
    assert backend.job("1").state == "RUNNING"
    backend.accounting = PHYSICS
    clock[0] += TENANTS_REFRESH_S
    assert ctl.tick().view.tenants == PHYSICS
    backend.accounting = AccountingUnavailable("slurmdbd is down")
    for _ in range(5):  # down during the run: the last tenants stay, one warning
        clock[0] += TENANTS_REFRESH_S
        rep = ctl.tick()
        assert not rep.error and rep.view is not None and rep.view.tenants == PHYSICS
    backend.accounting = PHYSICS
    clock[0] += TENANTS_REFRESH_S
    ctl.tick()
    details = [e.detail for e in store.events(kinds=[ACCOUNTING_EVENT])]
    assert len(details) == 4, details  # down, back, down, back: each once
    assert "equal shares and no GPU limits" in details[0] and "the last tenants read" in details[2]
    assert "answers again" in details[1] and "answers again" in details[3]
    assert sum("does not answer" in r.message for r in caplog.records if r.levelname == "WARNING") == 2


def test_a_cluster_without_accounting_is_asked_rarely_and_quietly(tmp_path: Path) -> None:
    clock = [1000.0]
    backend = FakeBackend([sjob("1")], clock=lambda: clock[0])
    backend.accounting = AccountingUnavailable("accounting is off")
    ctl, store = _controller(tmp_path, backend, clock)
    for _ in range(240):  # 20 minutes of 5-s rounds
        assert not ctl.tick().error
        clock[0] += 5
    assert _reads(backend) == 2 and ACCOUNTING_OFF_RETRY_S == 600.0
    assert store.events(kinds=[ACCOUNTING_EVENT]) == ()


def test_a_job_over_its_qos_limit_waits_with_a_reason_recorded_once_and_others_run(tmp_path: Path) -> None:
    clock = [1000.0]
    big = replace(sjob("1", submit=1.0, tres="gres:gpu:2"), account="bio", qos="small")
    backend = FakeBackend([big, replace(sjob("2", submit=2.0), account="physics", qos="normal")],
                          clock=lambda: clock[0])
    backend.accounting = Tenants(limits=(GpuLimit(1, qos="small"),))
    ctl, store = _controller(tmp_path, backend, clock)
    for _ in range(4):
        ctl.tick()
        clock[0] += 5
    assert backend.job("1").state == "PENDING" and backend.job("2").state == "RUNNING"
    (ev,) = store.events(job_id="1", kinds=[LIMIT_EVENT])
    assert ev.detail == "QOS small allows 1 GPU, the job asks 2"
    cfg = parse_config(f"state_dir = {tmp_path}\npartitions = gpu\n")
    (row,) = [r for r in queue_rows(cfg, backend, store) if r.job_id == "1"]
    assert row.reason == "QOS small allows 1 GPU, the job asks 2"


def test_gandiva_sshare_and_the_gauges_show_each_tenant_of_the_last_round(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from slurm_gandiva.controller.cli import cmd_sshare
    from slurm_gandiva.controller.service import make_configured_policy

    clock = [1000.0]
    jobs = [replace(sjob(str(i), submit=float(i), user="pat"), account="physics") for i in range(6)]
    jobs += [replace(sjob(str(10 + i), submit=float(i), user="ann"), account="bio") for i in range(6)]
    backend = FakeBackend(jobs, clock=lambda: clock[0])
    backend.accounting = PHYSICS
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    conf = tmp_path / "g.conf"
    conf.write_text(f"state_dir = {tmp_path}\ntick = 1\nquantum = 30\nfairness = shares\npolicy = default\n")
    cfg = parse_config(conf.read_text())
    ctl = Controller(cfg, backend, store, lambda: clock[0], policy=make_configured_policy(cfg),
                     protocol=FakeProtocol(backend), topology=Topology.uniform(2, 3),
                     progress_reader=lambda _p, _u: None)
    for _ in range(3):
        ctl.tick()
        clock[0] += 5
    assert cmd_sshare(argparse.Namespace(config=str(conf), json=True)) == 0
    import json

    rows = {(r["account"], r["user"]): r for r in json.loads(capsys.readouterr().out)["tenants"]}
    assert rows[("physics", "pat")]["entitled"] == 4 and rows[("bio", "ann")]["entitled"] == 2
    assert rows[("physics", "pat")]["held"] == 4 and rows[("bio", "ann")]["held"] == 2
    assert rows[("physics", "pat")]["waiting"] == 2 and rows[("physics", "pat")]["share"] == 2.0
    text = ctl.metrics.exposition().decode()
    assert 'gandiva_tenant_entitled_gpus{account="physics",user="pat"} 4.0' in text
    assert 'gandiva_tenant_held_gpus{account="bio",user="ann"} 2.0' in text
    (tmp_path / "tenants.json").unlink()
    assert cmd_sshare(argparse.Namespace(config=str(conf), json=False)) == 3
    assert "is the controller running" in capsys.readouterr().err


def test_accounting_refresh_is_a_checked_config_key(tmp_path: Path) -> None:
    from slurm_gandiva.errors import ConfigError

    assert parse_config(f"state_dir = {tmp_path}\n").accounting_refresh == TENANTS_REFRESH_S
    assert parse_config(f"state_dir = {tmp_path}\naccounting_refresh = 5\n").accounting_refresh == 5.0
    with pytest.raises(ConfigError, match="accounting_refresh must be a positive number"):
        parse_config(f"state_dir = {tmp_path}\naccounting_refresh = 0\n")
    clock = [1000.0]
    backend = FakeBackend([sjob("1")], clock=lambda: clock[0])
    ctl, _ = _controller(tmp_path, backend, clock, "accounting_refresh = 5\n")
    for _ in range(4):
        ctl.tick()
        clock[0] += 5
    assert _reads(backend) == 4


def test_tenant_rows_count_held_and_waiting_in_one_pass_and_served_only_without_the_layer() -> None:
    from slurm_gandiva.controller.tenants import tenant_rows
    from slurm_gandiva.model import ClusterView, Job, JobSpec, JobState, Placement
    from slurm_gandiva.selector import make_policy

    topo = Topology.uniform(1, 4)
    g = topo.all_gpus()
    jobs = (
        Job(JobSpec("a0", "ann", 2, 2, 0.0, account="physics"), JobState.RUNNING, Placement((g[0], g[1])),
            attained_service=7200.0),
        Job(JobSpec("a1", "ann", 1, 1, 0.0, account="physics"), JobState.SUSPENDED, attained_service=3600.0),
        Job(JobSpec("a2", "ann", 1, 1, 0.0, account="physics"), JobState.DONE, attained_service=3600.0),
        Job(JobSpec("b0", "bea", 1, 1, 0.0, account="bio")),
    )
    view = ClusterView(topo, jobs, now=10.0)
    plain = {(r.account, r.user): r for r in tenant_rows(view, make_policy("fifo"))}
    assert (plain[("physics", "ann")].held, plain[("physics", "ann")].waiting) == (2, 1)
    assert plain[("physics", "ann")].gpu_hours == pytest.approx(4.0)  # the jobs' own service, the done one too
    assert plain[("physics", "ann")].entitled is None
    assert (plain[("bio", "bea")].held, plain[("bio", "bea")].waiting) == (0, 1)
    fair = FairShare(make_policy("fifo"))
    fair.state.update(view, fair.half_life)
    rows = {(r.account, r.user): r for r in tenant_rows(view, fair)}
    assert rows[("physics", "ann")].gpu_hours == pytest.approx(4.0)  # the layer's decayed usage
    assert (rows[("physics", "ann")].entitled, rows[("bio", "bea")].entitled) == (3, 1)


def test_the_tenant_table_and_gauges_show_slurms_usage_beside_the_layers() -> None:
    from slurm_gandiva.controller.metrics import Metrics
    from slurm_gandiva.controller.tenants import format_tenants, tenant_rows
    from slurm_gandiva.model import ClusterView, Job, JobSpec
    from slurm_gandiva.selector import make_policy

    topo = Topology.uniform(1, 4)
    jobs = (Job(JobSpec("a0", "ann", 1, 1, 0.0, account="physics"), attained_service=3600.0),
            Job(JobSpec("b0", "bea", 1, 1, 0.0, account="bio")), Job(JobSpec("c0", "", 1, 1, 0.0, account="hep")))
    slurm = Tenants(usage={"physics": 9000.0, "bio": 0.0, "hep": 1800.0},
                    user_usage={("physics", "ann"): 7200.0, ("physics", "cy"): 1800.0, ("bio", "bea"): 0.0})
    view = ClusterView(topo, jobs, now=10.0, tenants=slurm)
    rows = {(r.account, r.user): r for r in tenant_rows(view, make_policy("fifo"))}
    assert rows[("physics", "ann")].slurm_gpu_hours == 2.0 and rows[("physics", "ann")].gpu_hours == 1.0
    assert rows[("bio", "bea")].slurm_gpu_hours == 0.0
    assert rows[("hep", "")].slurm_gpu_hours == 0.5  # a tenant without a user: its account's usage
    table = format_tenants(list(rows.values())).splitlines()
    assert table[0].split()[-1] == "SLURM_GPU_HOURS" and table[3].split()[-2:] == ["1.00", "2.00"]
    m = Metrics()
    m.observe_tenants(rows.values())
    assert 'gandiva_tenant_slurm_gpu_hours{account="physics",user="ann"} 2.0' in m.exposition().decode()
    unread = replace(view, tenants=Tenants(shares={"physics": 2.0}))  # no multifactor: no usage read
    rows = {(r.account, r.user): r for r in tenant_rows(unread, make_policy("fifo"))}
    assert rows[("physics", "ann")].slurm_gpu_hours is None
    assert format_tenants(list(rows.values())).splitlines()[2].split()[-1] == "-"
    m.observe_tenants(rows.values())
    assert "gandiva_tenant_slurm_gpu_hours{" not in m.exposition().decode()
