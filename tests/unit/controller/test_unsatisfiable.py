"""A spec the cluster can never run (an owner edits it to 64 GPUs) is not registered: the job stays
admin-held, the reason is noted once and shown in `gandiva squeue`, and a fixed spec registers it."""

from __future__ import annotations

import getpass
import time
from pathlib import Path

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.reconcile import Reconciler, spec_refusal
from slurm_gandiva.requeue.spec import SubmitSpec, write_spec
from slurm_gandiva.slurm.base import HoldKind, SlurmNode
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, nodes, sjob


@pytest.mark.parametrize(
    ("lo", "hi", "partition", "refused"),
    [
        (1, 4, "gpu", None),
        (4, 4, "", None),
        (64, 64, "gpu", "(4 GPUs each) cannot hold evenly"),
        (8, 8, "gpu", None),  # 4 + 4 on two nodes
        (5, 8, "gpu", "asks for 5 GPUs"),
        (2, 2, "cpu", "partition cpu (0 GPUs each)"),
        (2, 2, "cpu,gpu", None),
    ],
)
def test_spec_refusal(lo: int, hi: int, partition: str, refused: str | None) -> None:
    ns = (*nodes(2), SlurmNode("c1", "IDLE", ("cpu",), "", ""))
    why = spec_refusal(lo, hi, partition, ns)
    assert (why is None) if refused is None else (why is not None and refused in why and "\n" not in why)


def test_unknown_gpus_refuse_nothing() -> None:
    assert spec_refusal(64, 64, "", (SlurmNode("n1", "IDLE", ("gpu",), "", ""),)) is None


def test_an_unsatisfiable_spec_is_held_with_a_visible_reason(tmp_path: Path) -> None:
    me = getpass.getuser()
    cfg = parse_config(f"state_dir = {tmp_path}\n")
    jobs_root = cfg.job_root
    jobs_root.mkdir(parents=True)
    write_spec(jobs_root, SubmitSpec("9", me, 64, 64, submitted=time.time()))
    backend = FakeBackend([sjob("9", hold=HoldKind.USER, user=me, submit=time.time() - 60)])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=jobs_root, clock=time.time)
    found = r.settle(backend.snapshot())
    assert store.get_job("9") is None  # not registered: never started, never given GPUs
    assert ("hold", "9") in backend.calls  # held by the admin hold, not left to Slurm
    (refusal,) = [f for f in found if f.kind == "spec-unsatisfiable"]
    assert "64 GPUs" in refusal.detail and "4 GPUs each" in refusal.detail
    assert [e.job_id for e in store.events(kinds=["reconcile-spec-unsatisfiable"])] == ["9"]
    assert [f.kind for f in r.settle(backend.snapshot())] == []  # noted once, not every round

    (row,) = queue_rows(cfg, backend, store)
    assert row.job_id == "9" and "asks for 64 GPUs" in row.reason

    write_spec(jobs_root, SubmitSpec("9", me, 2, 2, submitted=time.time()))  # the owner fixes it
    assert "registered" in [f.kind for f in r.settle(backend.snapshot())]
    rec = store.get_job("9")
    assert rec is not None and (rec.spec.min_gpus, rec.spec.max_gpus) == (2, 2)
    (row,) = queue_rows(cfg, backend, store)
    assert row.reason == ""
    store.close()
