"""`gandiva sbatch` against the real local Slurm, as a non-root user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_as

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.slurm.base import HoldKind, SlurmBackend
from slurm_gandiva.submit.spec import read_spec, spec_from_script, spec_path

GANDIVA = str(Path(sys.executable).parent / "gandiva")
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
    assert job.comment == "gandiva"
    assert job.pending and job.hold is not HoldKind.NONE
    assert job.tres_per_node.endswith("gpu:1")  # untyped gpu:MIN (see submit.cli.sbatch_options)
    assert job.name == "h8-submit"
    # the spec file: written by the user, readable by the controller
    path = spec_path(slurm_cluster.jobs_dir, job_id)
    assert path.stat().st_uid == int(run_as(test_user, ["id", "-u"]).stdout)
    spec = read_spec(slurm_cluster.jobs_dir, job_id, owner=test_user)
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
    assert f'export GANDIVA_STATE_DIR={slurm_cluster.jobs_dir}/"$SLURM_JOB_ID"' in script
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
        (["--gpus", "5", "--", "/bin/true"], "largest node has 4"),
        (["--gpus", "9", "--", "/bin/true"], "cluster has 8"),
        (["--gpus", "3:1", "--", "/bin/true"], "MIN is larger than MAX"),
        (["-p", "no-such-partition", "--", "/bin/true"], "unknown partition"),
        (["--gpus", "1"], "no command"),
        (["--", "/no/such/command"], "not found"),
    ],
)
def test_bad_requests_exit_nonzero_with_one_line_and_submit_nothing(
    slurm_cluster: DevCluster, slurm: SlurmBackend, slurm_env: dict[str, str], test_user: str,
    args: list[str], needle: str,
) -> None:
    before = _user_job_ids(slurm, test_user)
    spec_dir = slurm_cluster.jobs_dir / "spec"
    specs_before = set(os.listdir(spec_dir)) if spec_dir.is_dir() else set()
    proc = run_as(test_user, [GANDIVA, "sbatch", *args], slurm_env)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and needle in err, err
    assert proc.stdout == ""
    assert _user_job_ids(slurm, test_user) == before
    specs_after = set(os.listdir(spec_dir)) if spec_dir.is_dir() else set()
    assert specs_after == specs_before
