"""One controller per state: a second controller on the same state (database) refuses with one line naming
the first (pid, host), whether it runs in another process or in this one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.errors import ControllerRunning
from slurm_gandiva.model import Topology
from slurm_gandiva.store import Store
from slurm_gandiva.topology.file import write_topology
from tests.unit.controller.controller_fakes import FakeBackend

HOLD = """
import sys, time
from slurm_gandiva.store import Store
lock = Store(sys.argv[1]).lock_controller()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_controller_process_is_refused_naming_the_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gandiva.db'}"
    Store(url).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with Store(url) as store, pytest.raises(ControllerRunning) as ei:
            store.lock_controller()
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(ei.value)
    finally:
        holder.kill()
        holder.wait()
    with Store(url) as store:  # the lock died with its process
        store.lock_controller().release()


def test_gandiva_controller_refuses_while_another_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("slurm_gandiva.slurm.make_backend", lambda env=None, **_kw: FakeBackend([]))
    write_topology(Topology.uniform(1, 2), tmp_path / "topology.json")
    conf = tmp_path / "gandiva.conf"
    conf.write_text(f"state_dir = {tmp_path / 'state'}\ntopology_file = {tmp_path / 'topology.json'}\n")
    (tmp_path / "state").mkdir()
    with Store(tmp_path / "state" / "gandiva.db") as running:
        lock = running.lock_controller()
        t0 = time.monotonic()
        assert main(["controller", "--once", "--config", str(conf)]) == ControllerRunning.exit_code
        assert time.monotonic() - t0 < 10  # refused at once, not after waiting
        err = capsys.readouterr().err
        assert f"pid {os.getpid()} on host" in err and err.count("\n") == 1
        lock.release()
    assert main(["controller", "--once", "--config", str(conf)]) == 0  # and runs once it is free


def test_cancel_of_a_job_that_ended_in_failure_exits_non_zero(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.controller.controller_fakes import sjob

    backend = FakeBackend([sjob("5", "FAILED"), sjob("6", "COMPLETED"), sjob("7", "PENDING")])
    monkeypatch.setattr("slurm_gandiva.slurm.make_backend", lambda env=None, **_kw: backend)
    monkeypatch.setattr("slurm_gandiva.controller.cli.caller_name", lambda: "alice")
    assert main(["cancel", "6"]) == 0
    assert main(["cancel", "5"]) == 1
    assert "job 5 already ended FAILED" in capsys.readouterr().err
    assert main(["cancel", "7"]) == 0 and ("cancel", "7") in backend.calls
