"""`gandiva sbatch --array`: one sbatch, one managed job per task "ARRAY_TASK" (state directory and spec)."""

from __future__ import annotations

import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.contract import StateDirError
from slurm_gandiva.requeue.spec import SubmitSpec
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import SlurmNode, SubmitRequest
from slurm_gandiva.submit.cli import sbatch_options, submit
from slurm_gandiva.submit.render import render_script
from slurm_gandiva.submit.request import array_tasks, parse_request
from slurm_gandiva.topology.file import write_topology
from tests.unit.submit.test_submit_cli import private_dir, submitted_spec


@dataclass
class FakeBackend:
    submitted: list[SubmitRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def user_associations(self, user: str) -> UserAssociations | None:
        return None  # no accounting

    def nodes(self) -> tuple[SlurmNode, ...]:
        gres = ",".join(f"gpu:g{k}:1" for k in range(4))
        return tuple(SlurmNode(n, "IDLE", ("gpu",), gres, "") for n in ("n1", "n2"))

    def submit(self, req: SubmitRequest) -> str:
        self.submitted.append(req)
        return "101"

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        self.cancelled.append(job_id)


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "etc").mkdir()
    (tmp_path / "jobs").mkdir()
    write_topology(Topology.uniform(2, 4), tmp_path / "topology.json")
    return {"SLURM_CONF": str(tmp_path / "etc" / "slurm.conf")}


def _submit(argv: list[str], backend: FakeBackend, env: dict[str, str]) -> str:
    return submit(parse_request(argv), backend=backend, env=env, user="alice", now=lambda: 5.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "spec"),
    [(["--array=0-11%4"], "0-11%4"), (["--array", "1,3"], "1,3"), (["-a", "0-30:10"], "0-30:10"),
     (["-a5-7"], "5-7"), (["--arr=2"], "2")],
)
def test_every_spelling_of_the_array_option(argv: list[str], spec: str) -> None:
    req = parse_request([*argv, "-J", "hp", "--", "true"])
    assert req.array == spec and "--array" not in " ".join(req.sbatch_options)
    assert sbatch_options(req, "hp").count(f"--array={spec}") == 1


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("0-3%0", "%0 would never run"), ("x", "give task ids as sbatch takes them"), ("3-1", "give task ids"),
     ("[0-3]", "give task ids"), ("0-4:0", "give task ids"), ("", "give task ids")],
)
def test_impossible_arrays_are_refused_in_one_line(spec: str, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle) as ei:
        array_tasks(spec)
    assert "\n" not in str(ei.value)


def test_an_array_is_one_sbatch_and_every_task_a_managed_job(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    job = _submit(["--array=0-11%4", "--gpus", "1", "--", "true"], be, cluster)
    assert job == "101" and len(be.submitted) == 1
    assert "--array=0-11%4" in be.submitted[0].options and "--hold" in be.submitted[0].options
    jobs = tmp_path / "jobs"
    private = private_dir(be.submitted[0], jobs)
    assert [p.name for p in jobs.iterdir()] == [private.name]  # one directory for the whole array
    for t in range(12):
        d = private / f"101_{t}"
        assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700
        spec = submitted_spec(be.submitted[0], jobs, f"101_{t}")
        assert spec is not None and spec.job_id == f"101_{t}" and spec.user == "alice"
    assert not (private / "101").exists() and submitted_spec(be.submitted[0], jobs, "101") is None


def test_sbatch_array_inx_is_an_array_too(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    _submit(["--", "true"], be, {**cluster, "SBATCH_ARRAY_INX": "2,5"})
    assert "--array=2,5" in be.submitted[0].options
    private = private_dir(be.submitted[0], tmp_path / "jobs")
    assert sorted(p.name for p in private.iterdir() if p.is_dir()) == ["101_2", "101_5"]
    with pytest.raises(BadRequest, match="give task ids"):
        _submit(["--", "true"], be, {**cluster, "SBATCH_ARRAY_INX": "oops"})
    assert len(be.submitted) == 1


def test_planted_task_directories_are_not_in_the_way(cluster: dict[str, str], tmp_path: Path) -> None:
    for name in ("101_3", "101", "spec"):  # what another user can guess in the shared jobs root
        (tmp_path / "jobs" / name).mkdir(mode=0o777)
        (tmp_path / "jobs" / name).chmod(0o777)
    be = FakeBackend()
    assert _submit(["--array=0-3", "--", "true"], be, cluster) == "101"
    assert be.cancelled == []
    private = private_dir(be.submitted[0], tmp_path / "jobs")
    assert sorted(p.name for p in private.iterdir() if p.is_dir()) == [f"101_{t}" for t in range(4)]


def test_a_failing_task_directory_cancels_the_whole_array(cluster: dict[str, str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path, uid: int | None = None) -> Path:
        raise StateDirError(f"state directory {path} is not writable: chmod u+rwx {path}")

    monkeypatch.setattr("slurm_gandiva.submit.cli.ensure_state_dir", refuse)
    be = FakeBackend()
    with pytest.raises(BadRequest, match=r"job array 101 \(all 4 tasks\) was cancelled") as ei:
        _submit(["--array=0-3", "--", "true"], be, cluster)
    assert be.cancelled == ["101"] and "\n" not in str(ei.value)


def test_ten_thousand_tasks_take_seconds(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    t0 = time.monotonic()
    _submit(["--array=0-9999%100", "--", "true"], be, cluster)
    took = time.monotonic() - t0
    private = private_dir(be.submitted[0], tmp_path / "jobs")
    assert len(list(private.glob("*.json"))) == 10_000 and len(list(private.glob("101_*/"))) == 10_000
    assert took < 20, f"{took:.1f} s for 10,000 tasks"


@pytest.mark.parametrize(("env", "state"), [({"SLURM_JOB_ID": "57", "SLURM_ARRAY_JOB_ID": "50",
                                               "SLURM_ARRAY_TASK_ID": "7"}, "/r/50_7"),
                                              ({"SLURM_JOB_ID": "57"}, "/r/57")])
def test_the_job_script_names_a_tasks_state_directory_array_task(env: dict[str, str], state: str,
                                                                  tmp_path: Path) -> None:
    spec = SubmitSpec(job_id="", user="u", min_gpus=1, max_gpus=1, command=("true",), signal="USR2")
    script = render_script(spec, "/r", wrapper="/bin/true")
    # run only the exports: the part before the mkdir
    head = script.split("(umask 077", 1)[0] + 'printf %s "$GANDIVA_STATE_DIR"\n'
    out = subprocess.run(["bash", "-c", head], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         text=True, check=True)
    assert out.stdout == state
