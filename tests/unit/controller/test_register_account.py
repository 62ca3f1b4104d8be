"""reconcile records the account and QOS Slurm holds a job to when it registers it (`gandiva sacct` shows them)."""

from __future__ import annotations

import getpass
import time
from dataclasses import replace
from pathlib import Path

from slurm_gandiva.controller.reconcile import Reconciler
from slurm_gandiva.requeue.spec import SubmitSpec, write_spec
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, sjob


def test_registration_stores_slurms_account_and_qos(tmp_path: Path) -> None:
    me = getpass.getuser()
    write_spec(tmp_path, SubmitSpec("5", me, 1, 2))  # the spec file names no account
    now = time.time()
    backend = FakeBackend(
        [
            replace(sjob("5", hold=HoldKind.USER, user=me, submit=now), account="physics", qos="high"),
            sjob("6", hold=HoldKind.USER, user=me, submit=now - 60),  # accounting off: none
        ]
    )
    with Store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        Reconciler(backend, store, partitions=("gpu",), jobs_root=tmp_path, clock=time.time).settle(backend.snapshot())
        j5, j6 = store.get_job("5"), store.get_job("6")
        assert j5 is not None and (j5.spec.account, j5.spec.qos) == ("physics", "high")
        assert j6 is not None and (j6.spec.account, j6.spec.qos) == ("", "")
