"""The CLI SlurmBackend against the real daemons: exact GPUs, shards, holds, the requeue cycle, errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.errors import InvalidRequest, PermissionDenied, SlurmUnreachable, UnknownJob
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.requeue.contract import JOB_MARK
from slurm_gandiva.requeue.operations import is_held
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend, SlurmJob, SubmitRequest
from slurm_gandiva.slurm.cli_backend import _classify
from slurm_gandiva.slurm.gres import placement_gres, requested_gres
from tests.helpers import run_as, wait_for

pytestmark = pytest.mark.slurm

SHOW_ENV = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0} cvd=${CUDA_VISIBLE_DEVICES:-} node=$SLURMD_NODENAME"
sleep ${SLEEP:-60}
"""


def submit(slurm: SlurmBackend, job_dir: Path, cleanup: list[str], *opts: str, script: str = SHOW_ENV,
           as_user: str | None = None, env: dict[str, str] | None = None) -> str:
    jid = slurm.submit(SubmitRequest(
        script, options=[f"--chdir={job_dir}", "-o", f"{job_dir}/%j.out", *opts], as_user=as_user, env=env,
    ))
    cleanup.append(jid)
    return jid


def read(path: Path) -> str:
    """The file's text, "" while it does not exist yet."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def running(slurm: SlurmBackend, jid: str) -> SlurmJob | None:
    j = slurm.job(jid)
    return j if j.running else None


def test_exact_gpus_are_enforced_and_reported(slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]) -> None:
    a = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g1:1,gpu:g3:1", "-w", "n1")
    job = wait_for(lambda: running(slurm, a), what="job a running")
    assert dict(job.gpus) == {"n1": (1, 3)}
    assert job.nodes == ("n1",) and job.shards == {}
    assert "--requeue" not in job.tres_per_node  # sanity: gres only
    out = wait_for(lambda: "cvd=" in (t := read(job_dir / f"{a}.out")) and t, what="job output")
    assert "cvd=1,3 node=n1" in out
    # Slurm enforces exclusivity: another job that wants g1 on n1 waits.
    b = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g1:1", "-w", "n1")
    waiting = wait_for(lambda: (j := slurm.job(b)).reason == "Resources" and j, what="job b waiting")
    assert waiting.pending and waiting.hold is HoldKind.NONE and waiting.gpus == {}
    snap = slurm.snapshot()
    assert {j.job_id for j in snap.jobs} >= {a, b}
    assert [n.name for n in snap.nodes] == ["n1", "n2"] and all(n.up for n in snap.nodes)
    assert "gpu:g3:1" in snap.nodes[0].gres and snap.nodes[0].cpus == 8


def test_shards_pack_two_jobs_on_one_gpu(slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]) -> None:
    ids = [submit(slurm, job_dir, cleanup_jobs, "--gres=shard:g2:1", "-w", "n2") for _ in range(3)]
    first = [wait_for(lambda j=j: running(slurm, j), what=f"shard job {j}") for j in ids[:2]]  # type: ignore[misc]
    assert all(dict(j.shards) == {"n2": (2,)} and j.gpus == {} for j in first)
    third = wait_for(lambda: (j := slurm.job(ids[2])).reason == "Resources" and j, what="third shard job waits")
    assert third.pending


def test_marked_user_job_is_held_and_only_root_releases_it(
    slurm: SlurmBackend, slurm_env: dict[str, str], job_dir: Path, cleanup_jobs: list[str], test_user: str
) -> None:
    jid = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g0:1", "-w", "n2", f"--comment={JOB_MARK}",
                 as_user=test_user)
    job = slurm.job(jid)
    assert job.user == test_user and job.comment == JOB_MARK
    assert job.pending and job.hold is HoldKind.USER  # job_submit.lua set priority 0
    for argv in (["scontrol", "release", jid], ["scontrol", "update", f"jobid={jid}", "gres=gpu:g1:1"]):
        res = run_as(test_user, argv, slurm_env)
        assert res.returncode != 0, argv
        assert isinstance(_classify("x", res.stderr, res.returncode), PermissionDenied), res.stderr
    assert slurm.job(jid).hold is HoldKind.USER and slurm.job(jid).tres_per_node.endswith("gpu:g0:1")
    slurm.hold(jid)
    assert slurm.job(jid).hold is HoldKind.ADMIN
    slurm.release(jid)
    started = wait_for(lambda: running(slurm, jid), what="root-released job running")
    assert dict(started.gpus) == {"n2": (0,)}
    # The owner may still cancel it.
    assert run_as(test_user, ["scancel", jid], slurm_env).returncode == 0
    wait_for(lambda: slurm.job(jid).state == "CANCELLED", what="cancelled")


REQUEUE_SELF = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0} cvd=${CUDA_VISIBLE_DEVICES:-} node=$SLURMD_NODENAME"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  trap 'echo got USR2; scontrol requeuehold $SLURM_JOB_ID; echo "requeuehold rc=$?"' USR2
  sleep 60 & wait
  sleep 30
fi
sleep 4  # long enough for the test to see the second run RUNNING
echo finished
"""


def test_requeue_cycle_moves_a_user_job_to_other_gpus(
    slurm: SlurmBackend, slurm_env: dict[str, str], job_dir: Path, cleanup_jobs: list[str], test_user: str
) -> None:
    """signal -> the job's own requeuehold (as its user) -> admin hold -> new node/GPUs -> release."""
    jid = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g1:1", "-w", "n1", f"--comment={JOB_MARK}",
                 script=REQUEUE_SELF, as_user=test_user, env={"SLURM_CONF": slurm_env["SLURM_CONF"]})
    slurm.hold(jid)
    slurm.release(jid)
    wait_for(lambda: running(slurm, jid), what="first start")
    out = job_dir / f"{jid}.out"
    wait_for(lambda: "start restart=0" in read(out), what="job script started")
    slurm.signal(jid, "USR2")
    held = wait_for(lambda: (j := slurm.job(jid)).pending and j.restart_count == 1 and j, timeout=30,
                    what="held requeue")
    # Only the job itself (as its non-root user) asked for this requeue: the user may requeue-hold.
    assert held.hold is HoldKind.USER and "got USR2" in read(out)
    slurm.hold(jid)
    assert slurm.job(jid).hold is HoldKind.ADMIN
    nodelist, gres = placement_gres(Placement((GpuRef("n2", 3), GpuRef("n2", 2))))
    slurm.update(jid, nodelist=nodelist, gres=gres)
    slurm.update(jid, starttime="now")
    slurm.release(jid)
    moved = wait_for(lambda: running(slurm, jid), what="job running again")
    assert moved.nodes == ("n2",) and dict(moved.gpus) == {"n2": (2, 3)} and moved.restart_count == 1
    wait_for(lambda: "finished" in read(out), timeout=30, what="second run finished")
    assert "start restart=1 cvd=2,3 node=n2" in out.read_text()
    done = wait_for(lambda: (j := slurm.job(jid)).finished and j, what="completed")
    assert done.state == "COMPLETED" and done.exit_code == 0


def gres_of(slurm: SlurmBackend, jid: str) -> frozenset[tuple[str, str]]:
    return requested_gres(slurm.job(jid).tres_per_node)


def test_gres_updates_replace_exactly_as_the_capabilities_say(
    slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """Every update leaves exactly the asked gres. 22.05 merges typed gres updates (g1 -> g2,g3 would run
    on g1,g2,g3: the backend clears first), refuses switching between gpu and shard and crashes on cleared
    shards (the backend refuses those); 23.02 on replaces and switches (`gres_kind_switch`)."""
    caps = slurm.capabilities()
    whole = submit(slurm, job_dir, cleanup_jobs, "--hold", "--gres=gpu:g1:1", "-w", "n1")
    slurm.update(whole, gres="gpu:g0:1,gpu:g2:1")
    assert gres_of(slurm, whole) == {("gpu", "g0"), ("gpu", "g2")}
    bare = submit(slurm, job_dir, cleanup_jobs, "--hold", "-w", "n1")
    slurm.update(bare, gres="shard:g1:1")  # no gres yet: a first placement may be shards
    if caps.gres_kind_switch:
        slurm.update(whole, gres="shard:g0:1")  # whole GPUs -> a shard (pack)
        assert gres_of(slurm, whole) == {("shard", "g0")}
        slurm.update(whole, gres="gpu:g0:1,gpu:g2:1")  # and back (unpack)
        assert gres_of(slurm, whole) == {("gpu", "g0"), ("gpu", "g2")}
        slurm.update(bare, gres="shard:g3:1")  # shards replaced
        assert gres_of(slurm, bare) == {("shard", "g3")}
    else:
        with pytest.raises(InvalidRequest, match="between whole GPUs and shards"):
            slurm.update(whole, gres="shard:g0:1")
        with pytest.raises(InvalidRequest, match="cannot take shards away"):
            slurm.update(bare, gres="shard:g3:1")
    slurm.update(bare, gres="shard:g1:1,shard:g3:1")  # adding is fine everywhere
    assert gres_of(slurm, bare) == {("shard", "g1"), ("shard", "g3")}
    untyped = submit(slurm, job_dir, cleanup_jobs, "--hold", "--gres=gpu:2", "-w", "n2")
    slurm.update(untyped, gres="gpu:g1:1,gpu:g3:1")  # as submitted by users: gpu:N -> exact GPUs
    for jid in (whole, bare, untyped):
        slurm.release(jid)
    got = wait_for(lambda: running(slurm, whole), what="moved job running")
    assert dict(got.gpus) == {"n1": (0, 2)}
    typed = wait_for(lambda: running(slurm, untyped), what="untyped job running")
    assert dict(typed.gpus) == {"n2": (1, 3)}
    packed = wait_for(lambda: running(slurm, bare), what="packed job running")
    assert dict(packed.shards) == {"n1": (1, 3)} and packed.gpus == {}


def test_slurm_keeps_gpu_and_shard_of_one_gpu_apart_as_the_capabilities_say(
    slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """A job holding GPU 2 whole and a job holding a shard of it never run at once (measured on every
    supported release; where a release runs both, the capability must say so, and the controller never
    books both anyway: `ClusterView.consistency_errors`)."""
    caps = slurm.capabilities()
    gpu = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g2:1", "-w", "n2")
    wait_for(lambda: running(slurm, gpu), what="whole-GPU job running")
    shard = submit(slurm, job_dir, cleanup_jobs, "--gres=shard:g2:1", "-w", "n2")
    if caps.gpu_shard_exclusive:
        waiting = wait_for(lambda: (j := slurm.job(shard)).reason == "Resources" and j, what="shard job waits")
        assert waiting.pending
        time.sleep(3)  # several scheduling passes (sched_interval=2)
        assert slurm.job(shard).pending
        slurm.cancel(gpu)
        got = wait_for(lambda: running(slurm, shard), what="shard job running once GPU 2 is free")
        assert dict(got.shards) == {"n2": (2,)}
    else:
        got = wait_for(lambda: running(slurm, shard), what="shard job running beside the whole-GPU job")
        assert dict(got.shards) == {"n2": (2,)} and running(slurm, gpu) is not None


def test_errors_map_to_the_hierarchy(slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]) -> None:
    with pytest.raises(UnknownJob):
        slurm.job("999999")
    with pytest.raises(UnknownJob):
        slurm.hold("999999")
    with pytest.raises(InvalidRequest):
        slurm.update("1", **{"nodelist": "n1 n2"})
    with pytest.raises(InvalidRequest):
        slurm.submit(SubmitRequest(SHOW_ENV, options=["--gres=gpu:g9:1", f"--chdir={job_dir}"]))
    with pytest.raises(InvalidRequest):
        slurm.signal("1", "NOT A SIGNAL")
    # Cancelling twice is fine (the second finds the job already finished).
    jid = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g0:1")
    slurm.cancel(jid)
    wait_for(lambda: slurm.job(jid).finished, what="cancelled")
    slurm.cancel(jid)
    assert slurm.job(jid).state == "CANCELLED"


def test_stopped_slurmctld_is_unreachable(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    """On a throwaway cluster, so the session cluster stays up."""
    base = int(os.environ.get("GANDIVA_TEST_PORT_BASE", "16800")) + 700
    other = DevCluster(tmp_path / "gone", nodes=1, gpus_per_node=1, port_base=base)
    other.up()
    try:
        # libslurm holds one cluster per process: under GANDIVA_SLURM_BACKEND=pyslurm this process is bound to
        # the session cluster, so the second one is asked through the CLI (the pyslurm backend's own
        # unreachable test, tests/integration/test_pyslurm_backend.py, stops its cluster instead).
        bound = os.environ.get("GANDIVA_SLURM_BACKEND", "").lower() in ("pyslurm", "auto-pyslurm")
        backend = make_backend(other.env, timeout=30, kind="cli" if bound else "auto")
        assert [n.name for n in backend.nodes()] == ["n1"]
    finally:
        other.down()
    # Each call retries for about 9 s before Slurm gives up, so only two: a query and an action.
    for call in (backend.jobs, lambda: backend.hold("1")):
        with pytest.raises(SlurmUnreachable, match="is slurmctld running"):
            call()


def test_an_arrays_long_task_list_is_read_whole(slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]) -> None:
    """Slurm's commands cut an array's task list at 64 characters unless told otherwise: 60 tasks with
    gaps, three split off (as the controller's placements split them), must all be listed, by both the
    snapshot and the full read (a task missing from them would be settled as cancelled)."""
    tasks = list(range(0, 120, 2))
    spec = ",".join(map(str, tasks))
    aid = submit(slurm, job_dir, cleanup_jobs, "--hold", f"--array={spec}", script="#!/bin/bash\nsleep 60\n")
    assert aid.isdigit()
    for t in (10, 50, 90):
        slurm.update(f"{aid}_{t}", nodelist="n1")  # splits the task off the array's record
    want = {f"{aid}_{t}" for t in tasks}
    for jobs in (slurm.snapshot().jobs, slurm.jobs(), slurm.snapshot().jobs):
        assert {j.job_id for j in jobs if j.array_id == aid} == want


def test_coalesced_reads_give_each_thread_its_own_job(
    slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """The controller's actions poll their jobs through one shared query per batch (CoalescedReads): array
    tasks (split off their array's record or not), a plain job and an unknown id asked at once must each get
    their own answer, as a read of their own would."""
    import threading

    from slurm_gandiva.slurm.coalesce import CoalescedReads, ReadsJobs

    aid = submit(slurm, job_dir, cleanup_jobs, "--hold", "--array=0-3", script="#!/bin/bash\nsleep 60\n")
    slurm.update(f"{aid}_1", nodelist="n1")  # splits the task off the array's record
    plain = submit(slurm, job_dir, cleanup_jobs, "--hold", script="#!/bin/bash\nsleep 60\n")
    ids = [f"{aid}_{t}" for t in range(4)] + [plain]
    unknown = str(int(plain) + 5000)
    reads = CoalescedReads(slurm)
    got: dict[str, list[str]] = {}
    barrier = threading.Barrier(len(ids) + 1)

    def poll(jid: str) -> None:
        barrier.wait()
        for _ in range(3):
            try:
                got.setdefault(jid, []).append(reads.job(jid).job_id)
            except UnknownJob:
                got.setdefault(jid, []).append("unknown")

    threads = [threading.Thread(target=poll, args=(j,)) for j in [*ids, unknown]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {**{j: [j, j, j] for j in ids}, unknown: ["unknown"] * 3}
    assert reads.queries < 3 * (len(ids) + 1), "every read made a query of its own"
    if isinstance(slurm, ReadsJobs):
        assert set(slurm.read_jobs([*ids, unknown])) == set(ids)


def test_scontrol_show_job_reads_as_squeue_json_does(
    slurm_cluster: DevCluster, slurm: SlurmBackend, job_dir: Path, cleanup_jobs: list[str]
) -> None:
    """Where squeue --json ignores --jobs (22.05) single jobs are read from `scontrol show job -d -o`: on every
    release, for a job on two GPUs with spaces in its name and comment, an array's waiting tasks and a running
    task on a shard, a job across two nodes and a held job, that reader must give what squeue --json gives."""
    from slurm_gandiva.slurm.cli_backend import CliBackend

    cli = CliBackend(slurm_cluster.env)
    sleep = "#!/bin/bash\nsleep 120\n"
    a = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g1:1,gpu:g2:1", "-w", "n1", "-J", "my job",
               "--comment", "gandiva x", "--time=UNLIMITED", script=sleep)  # EndTime=Unknown in scontrol
    aid = submit(slurm, job_dir, cleanup_jobs, "--hold", "--array=0-5%2", "--gres=shard:g0:1", script=sleep)
    wide = submit(slurm, job_dir, cleanup_jobs, "-N", "2", "--gres=gpu:g3:1", script=sleep)
    held = submit(slurm, job_dir, cleanup_jobs, "--hold", "--gres=gpu:g0:1", script=sleep)
    stopped = submit(slurm, job_dir, cleanup_jobs, "--gres=gpu:g0:1", "-w", "n2", script=sleep)
    slurm.release(f"{aid}_1")
    for jid in (a, f"{aid}_1", wide, stopped):
        wait_for(lambda jid=jid: running(slurm, jid), what=f"job {jid} running")  # type: ignore[misc]
    # Requeue-held, then admin-held: slurmctld keeps its description, which scontrol prints as the reason.
    slurm.requeue_hold(stopped)
    wait_for(lambda: (j := slurm.job(stopped)).pending and is_held(j), what="requeue-held")
    slurm.hold(stopped)
    by_json = {j.job_id: j for j in cli.jobs()}
    fields = ("job_id", "name", "user", "state", "reason", "hold", "nodes", "gpus", "shards", "restart_count",
              "comment", "partition", "submit_time", "work_dir", "min_cpus_per_node",
              "array_id", "array_max_tasks")  # not std_out: scontrol expands %j (as pyslurm does)

    def same(got: SlurmJob, want: SlurmJob) -> None:
        assert requested_gres(got.tres_per_node) == requested_gres(want.tres_per_node), want.job_id
        assert {f: getattr(got, f) for f in fields} == {f: getattr(want, f) for f in fields}, want.job_id
        # A running job without a time limit has EndTime=Unknown in scontrol; a past end must agree.
        assert got.end_time == want.end_time or (got.end_time == 0 and want.end_time > time.time()), want.job_id

    for jid in (a, f"{aid}_0", f"{aid}_3", f"{aid}_1", wide, held, stopped):
        records = cli._text_records([jid])
        if records is None:  # refused: the reader cannot tell this job's hold (read as JSON instead)
            assert jid == stopped, f"scontrol show job {jid} could not be read"
        else:
            same({j.job_id: j for j in cli._parse_records(list(records.values()))}[jid], by_json[jid])
        same(cli.job(jid), by_json[jid])
    assert by_json[stopped].hold is HoldKind.ADMIN
    assert by_json[a].name == "my job" and by_json[a].comment == "gandiva x"
