"""`gandiva sbatch` against the real local Slurm, as a non-root user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from job_wrapper.progress import read_events
from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.requeue.contract import JobFiles, read_progress
from slurm_gandiva.requeue.namespace import job_paths, private_name
from slurm_gandiva.requeue.spec import load_spec_file, spec_from_script
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend
from tests.helpers import run_as, wait_for

pytestmark = pytest.mark.slurm  # every test here uses the real cluster

GANDIVA = str(Path(sys.executable).parent / "gandiva")
TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
NASTY_ARG = "it's \"odd\"; $(touch /tmp/gandiva-h8-pwned) `id` && echo  two  spaces"


def _user_job_ids(slurm: SlurmBackend, user: str) -> set[str]:
    return {j.job_id for j in slurm.jobs() if j.user == user}


def test_sbatch_as_user_creates_a_held_marked_job(
    slurm_cluster: DevCluster, slurm: SlurmBackend, slurm_env: dict[str, str], test_user: str,
    job_dir: Path, cleanup_jobs: list[str],
) -> None:
    proc = run_as(
        test_user,
        [GANDIVA, "sbatch", "--parsable", "--gpus", "1:2", "--model", "demo", "--total-samples", "640",
         "-J", "h8-submit", "-o", f"{job_dir}/%j.out", "--", "/bin/echo", NASTY_ARG],
        slurm_env,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    cleanup_jobs.append(job_id)
    job = slurm.job(job_id)
    assert job.user == test_user
    private = private_name(job.comment)  # gandiva:<user>.<random>, the submission's private directory
    assert private is not None and private.startswith(f"{test_user}.")
    paths = job_paths(slurm_cluster.jobs_dir, job_id, job.comment, test_user)
    assert job.pending and job.hold is not HoldKind.NONE
    assert "gpu" not in job.tres_per_node and "shard" not in job.tres_per_node  # no gres until placed
    assert job.name == "h8-submit"
    # the spec file: written by the user, readable by the controller
    path = paths.spec
    assert path.stat().st_uid == int(run_as(test_user, ["id", "-u"]).stdout)
    spec = load_spec_file(path, job_id, owner=test_user)
    assert spec is not None
    assert (spec.min_gpus, spec.max_gpus, spec.model, spec.total_samples) == (1, 2, "demo", 640)
    assert spec.command == ("/bin/echo", NASTY_ARG)
    # the script as Slurm stores it
    script = subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"], env=slurm_env, capture_output=True, text=True,
        check=True, timeout=30,
    ).stdout
    embedded = spec_from_script(script)
    assert embedded is not None and embedded.with_job_id(job_id) == spec
    assert f'export GANDIVA_STATE_DIR={slurm_cluster.jobs_dir / private}/"$SLURM_JOB_ID"' in script
    last = script.rstrip("\n").splitlines()[-1]
    assert last.startswith("exec ") and "gandiva-wrapper --signal USR2 -- /bin/echo " in last
    # the script, run by bash with a stand-in wrapper, hands the command over verbatim and runs nothing
    shim = job_dir / "shim"
    shim.mkdir()
    fake = shim / "fake-wrapper"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    patched = script.replace(last.split(" --signal")[0], f"exec {fake}")
    out = subprocess.run(["bash", "-c", patched], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job_id},
                         capture_output=True, text=True, check=True, timeout=30, cwd=job_dir).stdout
    assert out.split("\n")[:4] == ["--signal", "USR2", "--", "/bin/echo"]
    assert NASTY_ARG in out
    assert not Path("/tmp/gandiva-h8-pwned").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpus", "5", "--", "/bin/true"], "nodes have 4 GPUs"),
        (["--gpus", "9", "--", "/bin/true"], "cluster has 8"),
        (["--gpus", "3:1", "--", "/bin/true"], "MIN is larger than MAX"),
        (["-p", "no-such-partition", "--", "/bin/true"], "unknown partition"),
        (["--gpus", "1"], "no command"),
        (["--", "/no/such/command"], "not found"),
        # what the controller cannot place (issue 29): refused before Slurm sees it, never a start that fails
        (["--gpus", "8", "--exclude=n2", "--", "/bin/true"], "--exclude cannot be honoured by gandiva"),
        (["--gpus", "8", "-xn2", "--", "/bin/true"], "-x in -xn2 (--exclude) cannot be honoured"),
        (["-n", "8", "--ntasks-per-node=4", "-c", "4", "--gpus", "1", "--", "/bin/true"],
         "needs 16 CPUs on a node (--cpus-per-task=4 --ntasks-per-node=4), but no node has more than 8"),
        (["--mem=9G", "--", "/bin/true"], "needs 9216 MB of memory on a node (--mem=9G), but no node has more than "
                                          "8000 MB"),
    ],
)
def test_bad_requests_exit_nonzero_with_one_line_and_submit_nothing(
    slurm_cluster: DevCluster, slurm: SlurmBackend, slurm_env: dict[str, str], test_user: str,
    args: list[str], needle: str,
) -> None:
    before = _user_job_ids(slurm, test_user)
    def private_dirs() -> set[str]:
        return {n for n in os.listdir(slurm_cluster.jobs_dir) if n.startswith(f"{test_user}.")}

    dirs_before = private_dirs()
    proc = run_as(test_user, [GANDIVA, "sbatch", *args], slurm_env)
    assert proc.returncode == 2, proc.stderr  # a bad request
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and needle in err, err
    assert proc.stdout == ""
    # No new job: earlier tests' finished jobs may leave Slurm's list meanwhile (MinJobAge), so not `==`.
    assert not _user_job_ids(slurm, test_user) - before
    assert private_dirs() == dirs_before  # no job directory made either


def test_a_partition_the_controller_does_not_manage_is_refused(
    slurm: SlurmBackend, slurm_env: dict[str, str], test_user: str,
) -> None:
    # The controller's config (named by $GANDIVA_CONF) manages another partition: a job in `gpu` would wait
    # forever, so it is refused with one line and nothing reaches Slurm.
    here = Path(tempfile.mkdtemp(prefix="gandiva-conf-"))  # readable by the test user
    here.chmod(0o755)
    conf = here / "gandiva.conf"
    conf.write_text("partitions = cpu\n")
    conf.chmod(0o644)
    before = _user_job_ids(slurm, test_user)
    proc = run_as(test_user, [GANDIVA, "sbatch", "-p", "gpu", "--", "/bin/true"],
                  {**slurm_env, "GANDIVA_CONF": str(conf)})
    assert proc.returncode == 2, proc.stderr
    refusal = "gandiva: error: partition 'gpu' is not scheduled by gandiva: choose one of cpu"
    assert proc.stderr.strip() == refusal, proc.stderr
    assert not _user_job_ids(slurm, test_user) - before
    # The same request where the controller manages `gpu` is submitted.
    conf.write_text("partitions = gpu\n")
    proc = run_as(test_user, [GANDIVA, "sbatch", "--parsable", "-p", "gpu", "-o", "/dev/null", "--", "/bin/true"],
                  {**slurm_env, "GANDIVA_CONF": str(conf)})
    assert proc.returncode == 0, proc.stderr
    slurm.cancel(proc.stdout.strip())
    shutil.rmtree(here)


def test_sbatch_job_starts_on_exact_gpus_then_resizes_to_another_node(
    slurm_cluster: DevCluster, slurm: SlurmBackend, slurm_env: dict[str, str], test_user: str,
    job_dir: Path, cleanup_jobs: list[str],
) -> None:
    """A job `gandiva sbatch` submitted (no gres) takes typed per-GPU gres at its first start and after."""
    # 40 steps of 0.3 s: long enough that `gandiva suspend`, started once training is seen, finds the job running
    train = ["--epochs", "1", "--samples", "640", "--batch-size", "16", "--hidden", "8", "--sleep-per-step", "0.3"]
    proc = run_as(test_user, [GANDIVA, "sbatch", "--parsable", "--gpus", "1:2", "--mem=1G", "--cpus-per-task=2",
                              "-o", f"{job_dir}/%j.out", "--", sys.executable, TRAIN, *train], slurm_env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    cleanup_jobs.append(job_id)
    files = JobFiles(job_paths(slurm_cluster.jobs_dir, job_id, slurm.job(job_id).comment, test_user).state_dir)
    admin = {**slurm_env, "GANDIVA_JOBS_ROOT": str(slurm_cluster.jobs_dir)}

    def gandiva(*argv: str) -> None:
        res = subprocess.run([GANDIVA, *argv, "--start-timeout", "60"], env=admin, capture_output=True, text=True,
                             timeout=200, check=False)
        assert res.returncode == 0, f"gandiva {' '.join(argv)}: {res.stdout}{res.stderr}"

    def events(name: str) -> list[dict[str, object]]:
        return [e for e in read_events(files.events) if e["event"] == name]

    gandiva("resume", job_id, "--node", "n1", "--gpus", "1,3")
    job = slurm.job(job_id)
    assert job.running and job.nodes == ("n1",) and job.gpus == {"n1": (1, 3)}, job
    assert "gpu:g1:1" in job.tres_per_node and "gpu:g3:1" in job.tres_per_node  # typed, set by the protocol
    wait_for(lambda: events("fresh_start"), timeout=60, what="training on n1")
    first = events("start")[0]
    assert (first["gpus"], first["gpu_env"], first["nprocs"]) == (["1", "3"], "CUDA_VISIBLE_DEVICES", 2)

    gandiva("suspend", job_id)
    job = slurm.job(job_id)
    assert job.pending and job.hold is not HoldKind.NONE, job
    gandiva("resize", job_id, "--gpus", "1", "--node", "n2")
    job = slurm.job(job_id)
    assert job.running and job.nodes == ("n2",) and len(job.gpus.get("n2", ())) == 1, job
    resumed = wait_for(lambda: events("resumed"), timeout=60, what="training on n2")
    assert resumed[0]["saved_world_size"] == 2 and resumed[0]["world_size"] == 1
    assert events("start")[1]["gpus"] == [str(job.gpus["n2"][0])]
    wait_for(lambda: (j := slurm.job(job_id)).finished and j, timeout=120, what="the job to finish")
    assert slurm.job(job_id).state == "COMPLETED"
    assert read_progress(files.progress).state == "done"
