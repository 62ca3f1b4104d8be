"""devcluster --accounting: configuration rendered (no daemons started), and the opt-in changes nothing when off."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gandiva.devcluster.accounting import sacctmgr_args
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import ConfigError
from slurm_gandiva.slurm.capabilities import SlurmCapabilities

R24 = SlurmCapabilities.for_release((24, 11, 5))


def test_without_accounting_nothing_of_it_is_rendered_or_created(tmp_path: Path) -> None:
    c = DevCluster(tmp_path / "s", port_base=30000, capabilities=R24)
    files = c._rendered()
    conf = files["slurm.conf"]
    assert set(files) == {"slurm.conf", "gres.conf", "job_submit.lua"}
    assert "AccountingStorageType=accounting_storage/none\n" in conf
    assert "JobAcctGatherType=jobacct_gather/none\n" in conf
    assert "slurmdbd" not in conf and "Priority" not in conf and "Enforce" not in conf
    assert not (tmp_path / "s" / "mysql").exists()
    assert [d for d, _ in c._daemons()] == ["slurmctld", "slurmd-n1", "slurmd-n2"]


def test_accounting_renders_slurmdbd_and_its_own_ports(tmp_path: Path) -> None:
    c = DevCluster(tmp_path / "s", port_base=30000, capabilities=R24, accounting=True)
    files = c._rendered()
    conf, dbd = files["slurm.conf"], files["slurmdbd.conf"]
    for line in ("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStoragePort=30019",
                 "AccountingStorageEnforce=associations,limits,qos", "PriorityType=priority/multifactor",
                 "JobAcctGatherType=jobacct_gather/linux", "ClusterName=gandiva"):
        assert f"{line}\n" in conf
    assert "accounting_storage/none" not in conf
    assert "DbdPort=30019\n" in dbd and "StoragePort=30020\n" in dbd and "SlurmUser=root\n" in dbd
    assert f"PidFile={c.state_dir}/run/slurmdbd.pid\n" in dbd
    password = (c.state_dir / "mysql" / "password").read_text()
    assert len(password) == 32 and f"StoragePass={password}\n" in dbd
    assert (c.state_dir / "mysql" / "password").stat().st_mode & 0o777 == 0o600
    assert (c.state_dir / "mysql").stat().st_mode & 0o777 == 0o700
    assert c._rendered() == files  # the password is made once: a second `up` sees the same configuration
    assert [d for d, _ in c._daemons()][-2:] == ["slurmdbd", "mariadb"]


def test_sacctmgr_arguments_are_checked() -> None:
    assert sacctmgr_args("account", "physics", Parent="root", Fairshare=2) == [
        "add", "account", "physics", "Parent=root", "Fairshare=2"]
    assert sacctmgr_args("qos", "small", GrpTRES="gres/gpu=2")[-1] == "GrpTRES=gres/gpu=2"
    for bad in ("-i", "a b", "x;rm", ""):
        with pytest.raises(ConfigError, match="not a valid name"):
            sacctmgr_args("account", bad)


def test_stop_slurmdbd_stops_it_alone(tmp_path: Path) -> None:
    import os
    import subprocess

    c = DevCluster(tmp_path / "s", port_base=30000, capabilities=R24, accounting=True)
    (c.state_dir / "run").mkdir(parents=True)
    fake = tmp_path / "slurmdbd"
    fake.symlink_to("/bin/sleep")
    dbd = subprocess.Popen([str(fake), "60"], env={**os.environ, "SLURM_CONF": str(c.conf_path)})
    other = subprocess.Popen(["/bin/sleep", "60"])
    try:
        (c.state_dir / "run" / "slurmdbd.pid").write_text(f"{dbd.pid}\n")
        (c.state_dir / "run" / "mariadb.pid").write_text(f"{other.pid}\n")  # not a mariadbd: never signalled
        assert c._pid("slurmdbd") == dbd.pid
        c.stop_slurmdbd(timeout=5)
        assert dbd.wait(timeout=5) != 0 and other.poll() is None
        assert not (c.state_dir / "run" / "slurmdbd.pid").exists() and c._pid("slurmdbd") is None
    finally:
        for p in (dbd, other):
            p.kill()
            p.wait()


def test_a_slurmdbd_that_dies_at_its_start_is_started_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_gandiva.devcluster.cluster import DevClusterError

    c = DevCluster(tmp_path / "s", port_base=30000, capabilities=R24, accounting=True)
    starts: list[str] = []
    waits = iter([DevClusterError("slurmdbd did not come up (fatal: _check_database_collations)"), None])

    def wait_for(daemon: str, ready: object, timeout: float) -> None:
        err = next(waits)
        if err is not None:
            raise err

    monkeypatch.setattr(c, "_start", lambda name, port, argv, **kw: starts.append(name))
    monkeypatch.setattr(c, "_wait_for", wait_for)
    monkeypatch.setattr(c, "_pid", lambda name: None)  # it exited
    c.start_slurmdbd()
    assert starts == ["slurmdbd", "slurmdbd"]
    # Still running but not answering (or failing twice): the error stands, no third start.
    waits = iter([DevClusterError("slurmdbd did not come up")])
    monkeypatch.setattr(c, "_pid", lambda name: 4242)
    with pytest.raises(DevClusterError):
        c.start_slurmdbd()
    assert starts == ["slurmdbd", "slurmdbd", "slurmdbd"]


def test_adding_the_cluster_is_tried_again_and_then_names_slurmdbds_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_gandiva.devcluster.cluster import DevClusterError

    c = DevCluster(tmp_path / "s", port_base=30000, capabilities=R24, accounting=True)
    calls: list[list[str]] = []
    answers = iter([ConfigError("sacctmgr -i add cluster gandiva failed: Problem adding clusters: Unspecified error"),
                    None])

    def sacctmgr(args: list[str]) -> str:
        calls.append(args)
        err = next(answers)
        if err is not None:
            raise err
        return ""

    monkeypatch.setattr(c, "start_slurmdbd", lambda: [])
    monkeypatch.setattr(c, "sacctmgr", sacctmgr)
    monkeypatch.setattr(c, "_sleep", lambda s: None)
    c._register_cluster()
    assert calls == [["add", "cluster", "gandiva"]] * 2
    # Already known to slurmdbd (it came back after a failure that still added it): no add at all.
    monkeypatch.setattr(c, "start_slurmdbd", lambda: ["gandiva"])
    c._register_cluster()
    assert len(calls) == 2
    # Failing every time: one error, naming slurmdbd's last error line and its log.
    (c.state_dir / "log").mkdir(parents=True, exist_ok=True)
    (c.state_dir / "log" / "slurmdbd.log").write_text("[t] error: mysql_query failed: 1205 Lock wait timeout\n")
    monkeypatch.setattr(c, "start_slurmdbd", lambda: [])
    answers = iter([ConfigError("Problem adding clusters: Unspecified error")] * 3)
    with pytest.raises(DevClusterError, match=r"Unspecified error \(slurmdbd: .*1205 Lock wait.*\): see .*slurmdbd"):
        c._register_cluster()
    assert len(calls) == 5
