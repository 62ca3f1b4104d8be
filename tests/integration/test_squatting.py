"""Squatting the jobs directory (issue 29, item 1), against the real local Slurm cluster with two ordinary
users: B pre-creates every name it can guess in the world-writable jobs root (A's next job ids, the array's
task names, the shared `spec/` with specs for those ids, a link named like A's private directory); A's
`gandiva sbatch` of a job and of a small array still succeed, are registered with the GPU ranges A asked
for, and run. B's own job whose comment names A's private directory is refused alone (held, one REASON).

Port base: GANDIVA_TEST_PORT_BASE (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.requeue.namespace import is_marked, job_comment, private_name
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import run_as
from tests.integration.test_controller import make_env, wait_for
from tests.integration.test_hostile import _finished, _squeue_reason, gsbatch, next_job_id

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]


@pytest.fixture
def ctl_dir(slurm_cluster: DevCluster) -> Iterator[Path]:
    """A directory users can read (their `gandiva squeue` reads the config) for the controller's files."""
    d = Path(tempfile.mkdtemp(prefix="squat-", dir=slurm_cluster.state_dir))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as(user: str, code: str, *args: str) -> None:
    proc = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def plants(slurm_cluster: DevCluster) -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for p in made:  # the admin removes B's plants
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
        else:
            shutil.rmtree(p, ignore_errors=True)


def test_nothing_planted_cancels_changes_or_downgrades_a_job(
    slurm_cluster: DevCluster, slurm: SlurmBackend, users: tuple[str, str], ctl_dir: Path, plants: list[Path]
) -> None:
    a, b = users
    cluster = slurm_cluster
    jobs = cluster.jobs_dir
    for j in slurm.jobs():  # leftovers would join this controller's workload
        if is_marked(j.comment) and not j.finished:
            with contextlib.suppress(Exception):
                slurm.cancel(j.job_id)
    # B plants what it can guess: the next ids (a job, an array and its tasks), a 0777 spec/ of its own
    # with 1-GPU specs naming A for those ids, and a link named like A's private directory.
    first = next_job_id(cluster, b)
    ids = [str(first), str(first + 1), *(f"{first + 1}_{t}" for t in range(3))]
    spec_dir = jobs / "spec"
    had_spec_dir = spec_dir.exists()
    code = ("import json, os, sys; jobs, a, ids = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
            "spec = os.path.join(jobs, 'spec')\n"
            "if not os.path.exists(spec): os.mkdir(spec); os.chmod(spec, 0o777)\n"
            "for i in ids:\n"
            "    os.mkdir(os.path.join(jobs, i), 0o777); os.chmod(os.path.join(jobs, i), 0o777)\n"
            "    d = dict(version=1, job_id=i, user=a, min_gpus=1, max_gpus=1)\n"
            "    with open(os.path.join(spec, i + '.json'), 'w') as f: json.dump(d, f)\n"
            "os.symlink(os.path.expanduser('~'), os.path.join(jobs, a + '.aaaaaaaa'))\n")
    _as(b, code, str(jobs), a, *ids)
    plants += [jobs / i for i in ids] + [jobs / f"{a}.aaaaaaaa"]
    plants += [spec_dir] if not had_spec_dir else [spec_dir / f"{i}.json" for i in ids]

    e = make_env(cluster, slurm, ctl_dir, {"n1": (0, 1, 2, 3)}, "gandiva", 600,
                 "pack = no\nmigrate = no\ngrow = no")
    e.conf.chmod(0o644)
    e.start()
    try:
        wait_for(lambda: "controller running" in e.log_text(), 90, "the controller to start")
        proc = gsbatch(cluster, a, "--gpus", "2:4", "--", "sleep", "3")
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip()
        proc = gsbatch(cluster, a, "--array=0-2", "--gpus", "1", "--", "sleep", "1")
        assert proc.returncode == 0, proc.stderr
        array = proc.stdout.strip()
        assert [job, array] == [str(first), str(first + 1)], "another job took the planted ids"
        private = private_name(slurm.job(job).comment)
        assert private and private.startswith(f"{a}.") and (jobs / private).is_dir()

        # B's job naming A's private directory: refused alone, held, with the reason B sees.
        proc = run_as(b, ["sbatch", "--parsable", f"--comment={job_comment(private)}", "--requeue", "-p", "gpu",
                          "-N", "1", "-o", "/dev/null", "--wrap", "sleep 1"], cluster.env)
        assert proc.returncode == 0, proc.stderr
        evil = proc.stdout.strip().split(";")[0]
        try:
            # job_submit.lua knows the new mark: its owner can neither re-point nor release it
            for change in (["comment=gandiva"], ["priority=1"]):
                upd = run_as(b, ["scontrol", "update", f"jobid={evil}", *change], cluster.env)
                assert upd.returncode != 0, upd.stdout
            assert slurm.job(evil).comment == job_comment(private)
            got = wait_for(lambda: (r := _squeue_reason(cluster, b, e, evil)) and "not to the job's user" in r and r,
                           60, "B's job's REASON")
            assert private in got, got

            done = {jid: wait_for(lambda j=jid: _finished(slurm, j), 180, f"job {jid} to run")  # type: ignore[misc]
                    for jid in [job, *(f"{array}_{t}" for t in range(3))]}
            assert set(done.values()) == {"COMPLETED"}, done
            with e.store() as store:
                rec = store.get_job(job)
                assert rec is not None and (rec.spec.min_gpus, rec.spec.max_gpus) == (2, 4)
                assert rec.state_dir == str(jobs / private / job)
                assert len(store.slices(job_ids=[job])[0].placement.gpus) >= 2
                for t in range(3):
                    task = store.get_job(f"{array}_{t}")
                    assert task is not None and task.spec.user == a and task.spec.max_gpus == 1
                assert store.get_job(evil) is None
            still = slurm.job(evil)
            assert still.pending and still.hold.value == "admin", still
        finally:
            slurm.cancel(evil)
        for i in ids:  # B's plants are as B left them: A's jobs wrote nothing there
            assert not any((jobs / i).iterdir())
        assert e.proc is not None and e.proc.poll() is None and "tick failed" not in e.log_text()
    finally:
        with contextlib.suppress(Exception):
            e.stop(timeout=60)

