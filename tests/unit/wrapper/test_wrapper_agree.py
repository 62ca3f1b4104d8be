"""StopAgreement's groups are destroyed before the interpreter tears down: its own gloo group at `close`, the
default gloo group at exit (a gloo group left to the teardown can abort a process whose training ended)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from job_wrapper.agree import StopAgreement, destroy_gloo_default_group


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("gloo")
def test_close_finishes_the_round_in_flight_and_destroys_the_agreements_group() -> None:
    agreement = StopAgreement.on(dist.new_group(backend="gloo"))
    group = agreement._group
    assert agreement.decide(True, 3) == (False, 0)  # started: decided at the next boundary
    agreement.close()
    assert agreement._work is None and agreement._group is None
    with pytest.raises(ValueError):
        dist.destroy_process_group(group)  # no longer a group of this process
    agreement.close()  # twice is harmless
    assert dist.is_initialized()  # the default group is the framework's until exit


@pytest.mark.usefixtures("gloo")
def test_at_exit_the_default_gloo_group_is_destroyed_and_a_second_call_is_harmless() -> None:
    agreement = StopAgreement.on(dist.new_group(backend="gloo"))
    destroy_gloo_default_group()
    assert not dist.is_initialized()
    destroy_gloo_default_group()
    agreement.close()  # its group went with the default one


def test_two_ranks_that_agreed_have_no_default_group_left_when_their_last_exit_step_runs(tmp_path: Path) -> None:
    code = f"""
import atexit, os
import torch.distributed as dist
from job_wrapper.agree import StopAgreement
atexit.register(lambda: print("default group alive at the last exit step:", dist.is_initialized(), flush=True))
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=int(os.environ["R"]), world_size=2)
a, b = StopAgreement.connect(), StopAgreement.connect()
a.close(); b.close()
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**_env(), "R": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        # atexit runs the last registered first: this line, registered before any agreement, runs after ours
        assert "default group alive at the last exit step: False" in out, out


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_"))}
