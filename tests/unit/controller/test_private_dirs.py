"""Registration reads a job's spec from the private directory its comment names, and a job whose comment
names a directory that is not its user's (another user's, a link, one others can write) waits alone,
admin-held, with the reason in `gandiva squeue`; other jobs are not touched."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest

from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.cli import queue_rows
from slurm_gandiva.controller.reconcile import Reconciler
from slurm_gandiva.requeue.namespace import job_comment, make_private_dir
from slurm_gandiva.requeue.spec import SubmitSpec, write_spec, write_specs_in
from slurm_gandiva.slurm.base import HoldKind
from slurm_gandiva.store import Store
from tests.unit.controller.controller_fakes import FakeBackend, sjob

ME = pwd.getpwuid(os.geteuid()).pw_name


def test_the_spec_and_state_dir_come_from_the_private_directory(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\n")
    jobs = cfg.job_root
    jobs.mkdir(parents=True)
    d = make_private_dir(jobs, ME)
    write_specs_in(d, [SubmitSpec("9", ME, 2, 4, submitted=time.time())], durable=True)
    # a planted spec in the old shared place, for the same job id, is not read
    write_spec(jobs, SubmitSpec("9", ME, 1, 1, submitted=time.time()))
    backend = FakeBackend([sjob("9", user=ME, comment=job_comment(d.name), submit=time.time())])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=jobs, clock=time.time)
    assert "registered" in [f.kind for f in r.settle(backend.snapshot())]
    rec = store.get_job("9")
    assert rec is not None and (rec.spec.min_gpus, rec.spec.max_gpus) == (2, 4)
    assert rec.state_dir == str(d / "9")
    store.close()


def test_a_job_naming_a_bad_directory_waits_alone_with_the_reason(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\n")
    jobs = cfg.job_root
    jobs.mkdir(parents=True)
    good = make_private_dir(jobs, ME)
    write_specs_in(good, [SubmitSpec("9", ME, 2, 4, submitted=time.time())])
    bad = make_private_dir(jobs, ME)
    write_specs_in(bad, [SubmitSpec("10", ME, 1, 1, submitted=time.time())])
    bad.chmod(0o777)
    (jobs / "me.link").symlink_to(good)
    old = time.time() - 3600  # long past the spec grace: a missing spec would be registered rigid by now
    backend = FakeBackend([
        sjob("9", user=ME, comment=job_comment(good.name), submit=old),
        sjob("10", user=ME, comment=job_comment(bad.name), hold=HoldKind.USER, submit=old),
        sjob("11", user=ME, comment=job_comment("me.link"), submit=old),
    ])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=jobs, clock=time.time)
    found = r.settle(backend.snapshot())
    assert [f.job_id for f in found if f.kind == "registered"] == ["9"]
    assert store.get_job("10") is None and store.get_job("11") is None
    assert ("hold", "10") in backend.calls  # admin-held: it waits for its owner to scancel it
    refused = {f.job_id: f.detail for f in found if f.kind == "spec-refused"}
    assert "writable by others" in refused["10"] and "a link" in refused["11"]
    assert [f.kind for f in r.settle(backend.snapshot())] == []  # noted once, not every round
    reasons = {row.job_id: row.reason for row in queue_rows(cfg, backend, store)}
    assert reasons["9"] == "" and "writable by others" in reasons["10"] and "a link" in reasons["11"]
    store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be two users")
def test_another_users_directory_is_refused_for_this_job_only(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    victim = make_private_dir(jobs, "nobody")
    write_specs_in(victim, [SubmitSpec("9", "nobody", 2, 4, submitted=time.time())])
    os.chown(victim, pwd.getpwnam("nobody").pw_uid, -1)
    os.chown(victim / "9.json", pwd.getpwnam("nobody").pw_uid, -1)
    backend = FakeBackend([
        sjob("9", user="nobody", comment=job_comment(victim.name)),
        sjob("12", user=ME, comment=job_comment(victim.name), submit=time.time() - 3600),  # the attacker's
    ])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    r = Reconciler(backend, store, partitions=("gpu",), jobs_root=jobs, clock=time.time)
    found = r.settle(backend.snapshot())
    rec = store.get_job("9")
    assert rec is not None and (rec.spec.min_gpus, rec.spec.max_gpus) == (2, 4)
    assert store.get_job("12") is None
    (why,) = [f.detail for f in found if f.job_id == "12" and f.kind == "spec-refused"]
    assert "not to the job's user" in why
    store.close()
