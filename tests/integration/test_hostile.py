"""Hostile users and careless admins against the real local Slurm cluster (issue 17), with two ordinary users.

User B plants a state directory / checkpoint for user A's next job; A turns their own progress.json into
binary bytes, a directory, a FIFO and a link to /dev/zero while the controller runs; a second controller
starts on the same config; managed sbatch options and uncatchable signals are tried; an admin checks a
config with `signal = KILL` or a partition that does not exist, and suspends a job that failed.

Jobs are a few seconds long (`sleep`, or examples/train.py refused at its start); one controller serves
the tests that need it. Port base: GANDIVA_TEST_PORT_BASE (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from job_wrapper import checkpoint as ckpt
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.requeue.namespace import is_marked, private_name
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import run_as
from tests.integration.test_controller import GANDIVA, TRAIN, WRAPPER, Env, make_env, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]



def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _state(slurm: SlurmBackend, jid: str) -> str:
    return slurm.job(jid).state


def _finished(slurm: SlurmBackend, jid: str) -> str | None:
    st = _state(slurm, jid)
    return st if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") else None


def gsbatch(cluster: DevCluster, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gandiva sbatch --parsable ARGS` as `user` (jobs root and topology: the devcluster's)."""
    return run_as(user, [GANDIVA, "sbatch", "--parsable", "-o", f"{cluster.jobs_dir}/slurm-%j.out", *args],
                  cluster.env)


def next_job_id(cluster: DevCluster, user: str) -> int:
    """The id Slurm gives the next job (a held probe job is submitted and cancelled)."""
    proc = run_as(user, ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], cluster.env)
    assert proc.returncode == 0, proc.stderr
    jid = proc.stdout.strip().split(";")[0]
    run_as(user, ["scancel", jid], cluster.env)
    return int(jid) + 1


def plant(cluster: DevCluster, user: str, job_id: int, checkpoint: bytes) -> Path:
    """As `user`, make <jobs>/<job_id> (0755) holding `checkpoint` as checkpoint.pt."""
    d = cluster.jobs_dir / str(job_id)
    code = (f"import os,sys; os.mkdir({str(d)!r}, 0o755); "
            f"open(os.path.join({str(d)!r}, 'checkpoint.pt'), 'wb').write(sys.stdin.buffer.read())")
    proc = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", code], input=checkpoint,
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return d


def state_dir(cluster: DevCluster, slurm: SlurmBackend, jid: str) -> Path:
    """A `gandiva sbatch` job's state directory: in the private directory its comment names."""
    name = private_name(slurm.job(jid).comment)
    assert name, slurm.job(jid).comment
    return cluster.jobs_dir / name / jid


def foreign_checkpoint(job_id: str) -> bytes:
    """A complete, verified checkpoint that names another job."""
    return ckpt.encode({"format": 1, "job": {"job_id": job_id, "submitted": "1.000000"}, "step": 5})


def output(cluster: DevCluster, jid: str) -> str:
    out = cluster.jobs_dir / f"slurm-{jid}.out"
    return out.read_text(errors="replace") if out.exists() else ""


@pytest.fixture
def cleanup(slurm: SlurmBackend) -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for jid in ids:
        with contextlib.suppress(Exception):
            slurm.cancel(jid)


# -- planted directories and checkpoints ------------------------------------------------------------------


def test_a_planted_directory_or_checkpoint_is_never_resumed(
    slurm_cluster: DevCluster, slurm: SlurmBackend, users: tuple[str, str], cleanup: list[str]
) -> None:
    a, b = users
    cluster = slurm_cluster
    # 1. B plants the directories of the next jobs, each with a checkpoint; A submits with gandiva sbatch.
    first = next_job_id(cluster, b)
    for k in range(first, first + 3):
        plant(cluster, b, k, foreign_checkpoint(str(k)))
    # Since issue 29 A's job lives in a private directory of its own: B's plants are not in its way.
    proc = gsbatch(cluster, a, "--", "true")
    assert proc.returncode == 0 and proc.stdout.strip() == str(first), proc.stderr
    cleanup.append(str(first))
    assert state_dir(cluster, slurm, str(first)).is_dir() and _state(slurm, str(first)) == "PENDING"
    slurm.cancel(str(first))

    # 2. A plain sbatch job whose script runs the wrapper (mkdir -p, as before): the wrapper refuses.
    script = (f'#!/bin/bash\nexport GANDIVA_STATE_DIR={cluster.jobs_dir}/"$SLURM_JOB_ID"\n'
              'mkdir -p -- "$GANDIVA_STATE_DIR"\n'
              f"exec {WRAPPER} --signal USR2 -- {sys.executable} {TRAIN} --steps 3\n")
    proc = run_as(a, ["sbatch", "--parsable", "-o", f"{cluster.jobs_dir}/slurm-%j.out"], cluster.env, input=script)
    assert proc.returncode == 0, proc.stderr
    jid = proc.stdout.strip().split(";")[0]
    cleanup.append(jid)
    assert int(jid) == first + 1, "another job took the planted id"
    assert wait_for(lambda: _finished(slurm, jid), 90, "the wrapper to refuse the planted directory") == "FAILED"
    out = output(cluster, jid)
    assert f"belongs to {b}" in out and "the job does not run" in out, out
    assert not (cluster.jobs_dir / jid / "events.jsonl").exists()  # nothing written into B's directory

    # 3. A copy of another job's checkpoint in A's own (private) directory: refused, not resumed.
    for k in range(first, first + 3):
        shutil.rmtree(cluster.jobs_dir / str(k), ignore_errors=True)  # the admin removes B's plants
    proc = gsbatch(cluster, a, "--", sys.executable, TRAIN, "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    jid = proc.stdout.strip().split(";")[0]
    cleanup.append(jid)
    d = state_dir(cluster, slurm, jid)
    st = d.stat()
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == int(run_as(a, ["id", "-u"]).stdout)
    (d / "checkpoint.pt").write_bytes(foreign_checkpoint("999"))  # as root: however it got there
    os.chown(d / "checkpoint.pt", st.st_uid, st.st_gid)
    slurm.release(jid)  # no controller here: the admin lets it run as it is
    assert wait_for(lambda: _finished(slurm, jid), 120, "the job to refuse the checkpoint") == "FAILED"
    out = output(cluster, jid)
    assert "belongs to job 999" in out and f"not to this job {jid}" in out, out
    events = [json.loads(ln)["event"] for ln in (d / "events.jsonl").read_text().splitlines()]
    assert "resumed" not in events and "error" in events


# -- submission and configuration refusals ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nodelis=n2"], "--nodelist"),
        (["-vN2"], "-N in -vN2"),
        (["--signal", "USR1"], "NCCL"),
        (["--signal", "KILL"], "cannot be caught"),
    ],
)
def test_managed_options_and_bad_signals_are_refused(
    slurm_cluster: DevCluster, slurm: SlurmBackend, users: tuple[str, str], args: list[str], says: str
) -> None:
    a, _ = users
    before = {j.job_id for j in slurm.jobs()}
    proc = gsbatch(slurm_cluster, a, *args, "--", "true")
    line = _one_line(proc.stderr)
    assert proc.returncode != 0 and says in line, line
    assert {j.job_id for j in slurm.jobs()} - before == set()  # nothing reached Slurm (older jobs may leave)


@pytest.fixture(scope="module")
def ctl_dir(slurm_cluster: DevCluster) -> Iterator[Path]:
    """A directory users can read (their `gandiva squeue` reads the config) for the controller's files."""
    d = Path(tempfile.mkdtemp(prefix="hostile-", dir=slurm_cluster.state_dir))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _env(cluster: DevCluster, slurm: SlurmBackend, root: Path, name: str) -> Env:
    sub = root / name
    sub.mkdir()
    sub.chmod(0o755)
    e = make_env(cluster, slurm, sub, {"n1": (0, 1)}, "gandiva", 600, "pack = no\nmigrate = no\ngrow = no")
    e.conf.chmod(0o644)
    return e


@pytest.mark.parametrize(("key", "value", "says"), [("signal", "KILL", "cannot be caught"),
                                                    ("partitions", "nope", "nope")])
def test_check_refuses_a_bad_config_in_one_line(
    slurm_cluster: DevCluster, slurm: SlurmBackend, ctl_dir: Path, key: str, value: str, says: str
) -> None:
    e = _env(slurm_cluster, slurm, ctl_dir, f"check-{key}")
    text = e.conf.read_text()
    assert f"\n{key} = " in text
    e.conf.write_text("\n".join(f"{key} = {value}" if ln.startswith(f"{key} = ") else ln
                                for ln in text.splitlines()) + "\n")
    proc = subprocess.run([GANDIVA, "controller", "--check", "--config", str(e.conf)], capture_output=True,
                          text=True, env={**os.environ, **slurm_cluster.env}, timeout=60)
    line = _one_line(proc.stderr)
    assert proc.returncode != 0 and says in line, line


def test_suspend_of_a_failed_job_exits_non_zero(
    slurm_cluster: DevCluster, slurm: SlurmBackend, users: tuple[str, str], cleanup: list[str]
) -> None:
    a, _ = users
    proc = run_as(a, ["sbatch", "--parsable", "--comment=gandiva", "-o", "/dev/null", "--wrap", "exit 3"],
                  slurm_cluster.env)
    assert proc.returncode == 0, proc.stderr
    jid = proc.stdout.strip().split(";")[0]
    cleanup.append(jid)
    slurm.release(jid)  # job_submit.lua holds a marked job; no controller here
    assert wait_for(lambda: _finished(slurm, jid), 60, "the job to fail") == "FAILED"
    res = subprocess.run([GANDIVA, "suspend", "--jobs-root", str(slurm_cluster.jobs_dir), jid], capture_output=True,
                         text=True, env={**os.environ, **slurm_cluster.env}, timeout=120)
    line = _one_line(res.stderr)
    assert res.returncode != 0 and jid in line, line


# -- a running controller: bad job files, a second controller ------------------------------------------------


def _marked_sleep_job(cluster: DevCluster, user: str) -> str:
    """A plain sbatch job under the controller's conventions (comment gandiva: job_submit.lua holds it)."""
    proc = run_as(user, ["sbatch", "--parsable", "--comment=gandiva", "--requeue", "-p", "gpu", "-N", "1",
                         "-o", "/dev/null", "--wrap", "sleep 2"], cluster.env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _write_spec_as(cluster: DevCluster, user: str, jid: str, gpus: int) -> None:
    """As `user`, (re)write the job's spec file asking for `gpus` GPUs."""
    code = ("import sys, time; from slurm_gandiva.requeue.spec import SubmitSpec, write_spec; "
            "write_spec(sys.argv[1], SubmitSpec(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[4]), "
            "submitted=time.time()))")
    proc = run_as(user, [sys.executable, "-c", code, str(cluster.jobs_dir), jid, user, str(gpus)], cluster.env)
    assert proc.returncode == 0, proc.stderr


def _squeue_reason(cluster: DevCluster, user: str, e: Env, jid: str) -> str:
    sq = run_as(user, [GANDIVA, "squeue", "--json", "--config", str(e.conf)], cluster.env)
    assert sq.returncode == 0, sq.stderr
    rows = {r["job_id"]: r for r in json.loads(sq.stdout)}
    return str(rows[jid]["reason"]) if jid in rows else ""


def test_bad_progress_files_and_a_second_controller(
    slurm_cluster: DevCluster, slurm: SlurmBackend, users: tuple[str, str], ctl_dir: Path, cleanup: list[str]
) -> None:
    a, b = users
    cluster = slurm_cluster
    for j in slurm.jobs():  # leftovers would join this controller's workload
        if is_marked(j.comment) and not j.finished:
            with contextlib.suppress(Exception):
                slurm.cancel(j.job_id)
    e = _env(cluster, slurm, ctl_dir, "controller")
    e.start()
    try:
        wait_for(lambda: "controller running" in e.log_text(), 90, "the controller to start")
        # A second controller on the same config refuses, naming the first.
        second = subprocess.run([GANDIVA, "controller", "--config", str(e.conf)], capture_output=True, text=True,
                                env={**os.environ, **cluster.env}, timeout=60)
        line = _one_line(second.stderr)
        assert second.returncode == 7 and f"pid {e.proc.pid}" in line, line
        assert e.proc is not None and e.proc.poll() is None  # the first runs on

        proc = gsbatch(cluster, a, "--", "sleep", "120")
        assert proc.returncode == 0, proc.stderr
        ja = proc.stdout.strip()
        cleanup.append(ja)
        wait_for(lambda: _state(slurm, ja) == "RUNNING", 90, "A's job to run")
        progress = state_dir(cluster, slurm, ja) / "progress.json"

        def squeue_reason() -> str:
            sq = run_as(a, [GANDIVA, "squeue", "--json", "--config", str(e.conf)], cluster.env)
            assert sq.returncode == 0, sq.stderr
            rows = {r["job_id"]: r for r in json.loads(sq.stdout)}
            return str(rows[ja]["reason"]) if ja in rows else ""

        def reason_with(word: str) -> str | None:
            r = squeue_reason()
            return r if word in r else None

        plants = [
            ("binary", "import sys; open(sys.argv[1], 'wb').write(bytes(range(256)))", "UTF-8"),
            ("directory", "import os, sys; os.mkdir(sys.argv[1])", "directory"),
            ("FIFO", "import os, sys; os.mkfifo(sys.argv[1])", "FIFO"),
            ("link", "import os, sys; os.symlink('/dev/zero', sys.argv[1])", "symbolic link"),
        ]
        jb = ""
        for kind, code, says in plants:
            run_as(a, ["rm", "-rf", str(progress)])
            made = run_as(a, [sys.executable, "-c", code, str(progress)])
            assert made.returncode == 0, made.stderr
            got = wait_for(lambda s=says: reason_with(s), 30, f"A's REASON to show the {kind}")  # type: ignore[misc]
            assert "progress.json" in got and "refused" in got
            if not jb:  # B submits once A's file is bad: the controller must still schedule it
                proc = gsbatch(cluster, b, "--", "sleep", "2")
                assert proc.returncode == 0, proc.stderr
                jb = proc.stdout.strip()
                cleanup.append(jb)
        assert wait_for(lambda: _finished(slurm, jb), 120, "B's job to run and finish") == "COMPLETED"
        assert _state(slurm, ja) == "RUNNING"

        # B's spec says 64 GPUs (an owner's edit): never registered, held with a reason B sees; fixed, it runs.
        jc = _marked_sleep_job(cluster, b)
        cleanup.append(jc)
        _write_spec_as(cluster, b, jc, 64)
        got = wait_for(lambda: (r := _squeue_reason(cluster, b, e, jc)) and "64 GPUs" in r and r, 30,
                       "the 64-GPU spec's REASON")
        assert "4 GPUs each" in got, got  # gandiva squeue works it out itself: the controller may lag
        held = wait_for(lambda: (j := slurm.job(jc)).hold.value == "admin" and j, 30, "the controller's hold")
        time.sleep(3)  # rounds go by: it is not registered, not started
        still = slurm.job(jc)
        assert still.pending and still.hold.value == "admin" and held.restart_count == 0, still
        _write_spec_as(cluster, b, jc, 1)
        assert wait_for(lambda: _finished(slurm, jc), 120, "the fixed job to run and finish") == "COMPLETED"
        assert e.proc is not None and e.proc.poll() is None, e.log_text()[-3000:]
        assert "tick failed" not in e.log_text()
    finally:
        with contextlib.suppress(Exception):
            e.stop(timeout=60)
