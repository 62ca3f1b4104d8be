"""The pyslurm backend against a real Slurm 25.11 cluster of its own (port base 18800), beside the CLI backend.

Selected with `-m pyslurm` (only where Slurm 25.11 and pyslurm 25.11 are installed): without them every test
here FAILS with one line, it never skips. Run as root with Slurm 25.11's bin/sbin first on PATH and its lib/ on
LD_LIBRARY_PATH (pyslurm links libslurm).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import InvalidRequest, SlurmError, SlurmUnreachable, UnknownJob
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK
from slurm_gandiva.requeue.operations import Outcome, Phase, phase
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SlurmJob, Snapshot, SubmitRequest
from slurm_gandiva.slurm.capabilities import installed_release
from slurm_gandiva.slurm.cli_backend import CliBackend
from slurm_gandiva.slurm.gres import requested_gres
from tests.helpers import TEST_USER, ensure_user, wait_for

pytestmark = pytest.mark.pyslurm

PORT_BASE = int(os.environ.get("GANDIVA_PYSLURM_PORT_BASE", "18800"))

SLEEPER = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0} cvd=${CUDA_VISIBLE_DEVICES:-} node=$SLURMD_NODENAME"
sleep ${SLEEP:-120}
"""
# Requeue-holds itself on USR2 (what the wrapper does after its checkpoint), then runs briefly once moved.
REQUEUE_SELF = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0} cvd=${CUDA_VISIBLE_DEVICES:-} node=$SLURMD_NODENAME"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  trap 'echo got USR2; scontrol requeuehold $SLURM_JOB_ID; echo "requeuehold rc=$?"' USR2
  sleep 120 & wait
  sleep 30
fi
sleep 5
echo finished
"""


@pytest.fixture(scope="module")
def ps_cluster() -> Iterator[DevCluster]:
    """A Slurm 25.11 devcluster of this module's own (2 nodes x 4 GPUs), on port base 18800."""
    if os.geteuid() != 0:
        pytest.fail("the pyslurm backend tests need root (slurmd launches jobs as their users)")
    try:
        release = installed_release()
    except SlurmError as exc:
        pytest.fail(f"the pyslurm backend tests need Slurm 25.11 on PATH: {exc}")
    if release[:2] != (25, 11):
        pytest.fail(f"the pyslurm backend tests need Slurm 25.11 first on PATH, found {release}")
    if importlib.util.find_spec("pyslurm") is None:  # imported (and initialised) by the backend, not here
        pytest.fail("pyslurm is not installed: pip install pyslurm==25.11.2 against Slurm 25.11 (see README)")
    state_dir = Path(tempfile.mkdtemp(prefix="gandiva-pyslurm-"))
    cluster = DevCluster(state_dir, port_base=PORT_BASE)
    try:
        cluster.up()
    except Exception as exc:
        pytest.fail(f"the 25.11 cluster did not start on port base {PORT_BASE}: {exc}")
    yield cluster
    cluster.down()
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cli(ps_cluster: DevCluster) -> CliBackend:
    return CliBackend(ps_cluster.env)


@pytest.fixture(scope="module")
def ps(ps_cluster: DevCluster) -> SlurmBackend:
    """The pyslurm backend, as make_backend picks it for 25.11."""
    from slurm_gandiva.slurm.pyslurm_backend import PyslurmBackend

    try:
        backend = make_backend(ps_cluster.env, kind="pyslurm")
    except SlurmError as exc:
        pytest.fail(f"the pyslurm backend is not usable: {exc}")
    assert isinstance(backend, PyslurmBackend)
    return backend


@pytest.fixture
def jobs_here(ps_cluster: DevCluster, cli: CliBackend) -> Iterator[tuple[Path, list[str]]]:
    """A world-writable job directory and a list of job ids cancelled after the test."""
    d = ps_cluster.jobs_dir / f"ps-{uuid.uuid4().hex[:10]}"
    d.mkdir()
    d.chmod(0o777)
    ids: list[str] = []
    yield d, ids
    for jid in ids:
        with contextlib.suppress(SlurmError):
            cli.cancel(jid)


def submit(backend: SlurmBackend, where: tuple[Path, list[str]], *opts: str, script: str = SLEEPER,
           as_user: str | None = None, env: dict[str, str] | None = None) -> str:
    d, ids = where
    jid = backend.submit(SubmitRequest(script, options=[f"--chdir={d}", "-o", f"{d}/%j.out", *opts],
                                       as_user=as_user, env=env))
    ids.append(jid)
    return jid


def comparable(job: SlurmJob) -> SlurmJob:
    """std_out is the one field the backends differ in: squeue prints the pattern (%j), pyslurm the path."""
    return dataclasses.replace(job, std_out="")


def same_snapshot(cli: SlurmBackend, ps: SlurmBackend, tries: int = 10) -> Snapshot:
    """Both backends see the same jobs and nodes (retried: Slurm may move between two reads)."""
    diff = ""
    for _ in range(tries):
        a, b = cli.snapshot(), ps.snapshot()
        ja = [comparable(j) for j in a.jobs]
        jb = [comparable(j) for j in b.jobs]
        if ja == jb and a.nodes == b.nodes:
            return b
        diff = "\n".join(f"cli {x}\nps  {y}" for x, y in zip(ja + list(a.nodes), jb + list(b.nodes)) if x != y)
        diff += f"\n{len(ja)} jobs vs {len(jb)}"
        time.sleep(0.5)
    raise AssertionError(f"the backends disagree:\n{diff}")


def running(backend: SlurmBackend, jid: str) -> SlurmJob | None:
    j = backend.job(jid)
    return j if j.running else None


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_make_backend_picks_pyslurm_on_25_11(ps_cluster: DevCluster, cli: CliBackend, ps: SlurmBackend) -> None:
    assert type(make_backend(ps_cluster.env)).__name__ == "PyslurmBackend"
    assert isinstance(make_backend(ps_cluster.env, kind="cli"), CliBackend)
    assert isinstance(make_backend({**ps_cluster.env, "GANDIVA_SLURM_BACKEND": "cli"}), CliBackend)
    assert ps.capabilities() == cli.capabilities()
    assert ps.capabilities().release[:2] == (25, 11)


def test_same_snapshot_for_running_held_requeued_and_finished_jobs(
    cli: CliBackend, ps: SlurmBackend, jobs_here: tuple[Path, list[str]]
) -> None:
    whole = submit(cli, jobs_here, "--gres=gpu:g1:1,gpu:g3:1", "-w", "n1", f"--comment={JOB_MARK}x")
    shards = submit(cli, jobs_here, "--gres=shard:g2:1", "-N", "2")
    untyped = submit(cli, jobs_here, "--gres=gpu:2", "-w", "n2")  # GPUs only squeue's gres detail names
    held = submit(cli, jobs_here, "--hold", "--gres=gpu:g0:1")
    done = submit(cli, jobs_here, "--gres=gpu:g0:1", script="#!/bin/bash\nexit 3\n")
    for jid in (whole, shards, untyped):
        wait_for(lambda jid=jid: running(cli, jid), what=f"job {jid} running")  # type: ignore[misc]
    wait_for(lambda: cli.job(done).finished, what="job finished")
    snap = same_snapshot(cli, ps)
    by_id = {j.job_id: j for j in snap.jobs}
    assert dict(by_id[whole].gpus) == {"n1": (1, 3)} and by_id[whole].comment == f"{JOB_MARK}x"
    assert dict(by_id[shards].shards) == {"n1": (2,), "n2": (2,)}
    assert len(by_id[untyped].gpus["n2"]) == 2
    assert by_id[held].hold is HoldKind.USER and by_id[held].reason == "JobHeldUser"
    assert by_id[done].state == "FAILED" and by_id[done].exit_code == 3
    n1 = next(n for n in snap.nodes if n.name == "n1")
    assert "gpu:g1:1(IDX:1)" in n1.gres_used and "shard:g2:1(1/2)" in n1.gres_used
    # A requeued job (held, being torn down, then pending) and an admin hold, each job alone too.
    ps.requeue_hold(whole)
    wait_for(lambda: (j := cli.job(whole)).pending and j.restart_count == 1 and j, what="requeued")
    ps.hold(held)
    snap = same_snapshot(cli, ps)
    for jid in (whole, shards, untyped, held, done):
        assert comparable(ps.job(jid)) == comparable(cli.job(jid))
    requeued = ps.job(whole)
    assert requeued.hold is HoldKind.USER and requeued.reason == "JobHeldUser" and requeued.gpus == {}
    assert ps.job(held).hold is HoldKind.ADMIN and ps.job(held).reason == "JobHeldAdmin"
    assert ps.job(done).std_out == f"{jobs_here[0]}/{done}.out"


def test_hold_release_update_requeue_signal_cancel(
    cli: CliBackend, ps: SlurmBackend, jobs_here: tuple[Path, list[str]]
) -> None:
    d = jobs_here[0]
    jid = submit(cli, jobs_here, "--hold", "--gres=gpu:g1:1", "-w", "n1", "--begin=now+1hour")
    ps.hold(jid)
    assert cli.job(jid).hold is HoldKind.ADMIN
    ps.update(jid, nodelist="n2", gres="gpu:g0:1,gpu:g2:1", starttime="now")
    got = cli.job(jid)
    assert got.nodes == ("n2",) and requested_gres(got.tres_per_node) == {("gpu", "g0"), ("gpu", "g2")}
    ps.update(jid, gres="shard:g3:1")  # whole GPUs -> a shard and back (25.11 switches kinds)
    assert requested_gres(cli.job(jid).tres_per_node) == {("shard", "g3")}
    ps.update(jid, gres="gpu:g0:1,gpu:g2:1")
    ps.release(jid)
    job = wait_for(lambda: running(cli, jid), what="released job running (begin time cleared)")
    assert dict(job.gpus) == {"n2": (0, 2)} and dict(ps.job(jid).gpus) == {"n2": (0, 2)}
    out = d / f"{jid}.out"
    wait_for(lambda: "start restart=0" in read(out), what="job script started")
    ps.requeue_hold(jid)
    held = wait_for(lambda: (j := cli.job(jid)).pending and j.restart_count == 1 and j, what="requeue-held")
    assert held.hold is HoldKind.USER
    ps.release(jid)
    wait_for(lambda: running(cli, jid), timeout=200, what="running again after the requeue")
    wait_for(lambda: read(out).count("start restart=") == 2, what="second start")
    ps.signal(jid, "TERM", batch_only=True)
    assert wait_for(lambda: (j := cli.job(jid)).finished and j, what="ended by SIGTERM").state in (
        "FAILED", "CANCELLED")
    # cancel: a pending job, and again once it ended (already finished counts as cancelled).
    other = submit(cli, jobs_here, "--hold")
    ps.cancel(other)
    assert wait_for(lambda: (j := cli.job(other)).finished and j, what="cancelled").state == "CANCELLED"
    ps.cancel(other)
    # signal to all steps of a running job
    full = submit(cli, jobs_here, "-w", "n1")
    wait_for(lambda: running(cli, full), what="job running")
    ps.signal(full, "KILL", batch_only=False)
    wait_for(lambda: cli.job(full).finished, what="killed")


def test_requeue_protocol_moves_a_job_to_other_gpus_through_pyslurm(
    ps_cluster: DevCluster, cli: CliBackend, ps: SlurmBackend, jobs_here: tuple[Path, list[str]]
) -> None:
    """RequeueProtocol over PyslurmBackend: first start on n1:1, suspend (the job requeue-holds itself on
    USR2), resume on n2:2,3; Slurm's own view (squeue) agrees at every step."""
    user = ensure_user(TEST_USER)
    jid = submit(ps, jobs_here, f"--comment={JOB_MARK}", "--nodes=1", "--ntasks=1", "--mem=1G",
                 script=REQUEUE_SELF, as_user=user, env={"SLURM_CONF": ps_cluster.env["SLURM_CONF"]})
    assert phase(ps.job(jid)) in (Phase.REQUEUED, Phase.QUEUED_HELD)  # held by job_submit.lua
    proto = RequeueProtocol(ps, suspend_timeout=60, start_timeout=90)
    first = proto.resume(jid, Placement((GpuRef("n1", 1),)))
    assert first.outcome is Outcome.RUNNING, first.describe()
    assert dict(cli.job(jid).gpus) == {"n1": (1,)}
    out = jobs_here[0] / f"{jid}.out"
    wait_for(lambda: "start restart=0" in read(out), what="job script started")
    sus = proto.suspend(jid)
    assert sus.outcome is Outcome.SUSPENDED, sus.describe()
    held = cli.job(jid)
    assert phase(held) is Phase.HELD and held.hold is HoldKind.ADMIN and "got USR2" in read(out)
    res = proto.resume(jid, Placement((GpuRef("n2", 3), GpuRef("n2", 2))))
    assert res.outcome is Outcome.RUNNING, res.describe()
    moved = cli.job(jid)
    assert moved.nodes == ("n2",) and dict(moved.gpus) == {"n2": (2, 3)} and moved.restart_count == 1
    wait_for(lambda: "finished" in read(out), timeout=60, what="second run finished")
    assert "start restart=1 cvd=2,3 node=n2" in read(out)
    assert wait_for(lambda: (j := ps.job(jid)).finished and j, what="completed").state == "COMPLETED"


def test_errors_map_to_the_hierarchy(cli: CliBackend, ps: SlurmBackend, jobs_here: tuple[Path, list[str]]) -> None:
    for call in (lambda: ps.job("999999"), lambda: ps.hold("999999"), lambda: ps.release("999999"),
                 lambda: ps.requeue_hold("999999"), lambda: ps.signal("999999", "USR2"),
                 lambda: ps.cancel("999999"), lambda: ps.update("999999", starttime="now"),
                 lambda: ps.update("999999", gres="gpu:g0:1")):
        with pytest.raises(UnknownJob):
            call()
    with pytest.raises(InvalidRequest):
        ps.update("1", nodelist="n1 n2")
    with pytest.raises(InvalidRequest):
        ps.signal("1", "NOT A SIGNAL")
    with pytest.raises(InvalidRequest):
        ps.job("abc")
    jid = submit(cli, jobs_here, "--hold", "--gres=gpu:g0:1")
    for backend in (ps, cli):  # (25.11 takes an unknown type such as gpu:g9:1 for a pending job: both do)
        with pytest.raises(InvalidRequest, match="Invalid generic resource"):
            backend.update(jid, gres="nosuch:1")
    assert requested_gres(cli.job(jid).tres_per_node) == {("gpu", "g0")}
    with pytest.raises(InvalidRequest, match="Invalid node name"):
        ps.update(jid, nodelist="n9")
    run = submit(cli, jobs_here, "--gres=gpu:g3:1")
    wait_for(lambda: running(cli, run), what="job running")
    with pytest.raises(InvalidRequest, match="hold it"):
        ps.update(run, gres="gpu:g2:1")
    outcomes = []
    for backend in (cli, ps):  # releasing a running job: whatever Slurm says, both backends say it alike
        try:
            backend.release(run)
            outcomes.append("ok")
        except SlurmError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1], outcomes


def test_stopped_slurmctld_is_unreachable(ps_cluster: DevCluster, ps: SlurmBackend) -> None:
    """Last: stops this module's cluster (the fixture's teardown finds it down)."""
    ps_cluster.down()
    for call in (ps.jobs, lambda: ps.hold("1")):
        with pytest.raises(SlurmUnreachable, match="is slurmctld running"):
            call()
