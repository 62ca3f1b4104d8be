"""submit() against a fake backend: what reaches Slurm, what does not, and the spec file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_gandiva.errors import BadRequest, ConfigError
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.namespace import private_name
from slurm_gandiva.requeue.spec import SubmitSpec, load_spec_file, spec_file, spec_from_script
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import SlurmNode, SubmitRequest
from slurm_gandiva.submit.cli import resolve_paths, submit
from slurm_gandiva.submit.request import parse_request
from slurm_gandiva.topology.file import write_topology


@dataclass
class FakeBackend:
    submitted: list[SubmitRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    next_id: int = 100

    def user_associations(self, user: str) -> UserAssociations | None:
        return None  # no accounting

    def nodes(self) -> tuple[SlurmNode, ...]:
        gres = ",".join(f"gpu:g{k}:1" for k in range(4)) + ",shard:g0:2"
        return tuple(SlurmNode(n, "IDLE", ("gpu",), gres, "", cpus=8, memory=8000) for n in ("n1", "n2"))

    def submit(self, req: SubmitRequest) -> str:
        self.submitted.append(req)
        self.next_id += 1
        return str(self.next_id)

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


def private_dir(req: SubmitRequest, jobs: Path) -> Path:
    """The submission's private directory, as its comment `gandiva:<name>` names it."""
    (comment,) = [o.removeprefix("--comment=") for o in req.options if o.startswith("--comment=")]
    name = private_name(comment)
    assert name is not None, comment
    return jobs / name


def submitted_spec(req: SubmitRequest, jobs: Path, job_id: str) -> SubmitSpec | None:
    return load_spec_file(spec_file(private_dir(req, jobs), job_id), job_id, owner=None)


def test_good_request_is_held_marked_and_spec_written(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    job = _submit(
        [
            "-p",
            "gpu",
            "-o",
            "log.txt",
            "--gpus",
            "1:4",
            "--model",
            "bert",
            "--total-samples",
            "640",
            "--",
            "python3",
            "train.py",
            "--x",
        ],
        be,
        cluster,
    )
    assert job == "101"
    (req,) = be.submitted
    opts = list(req.options)
    assert private_dir(req, tmp_path / "jobs").name.startswith("alice.")
    for must in (
        "--hold",
        "--requeue",
        "--open-mode=append",
        "--nodes=1",
        "--ntasks=1",
        "--job-name=train.py",
    ):
        assert must in opts
    assert opts[:4] == ["-p", "gpu", "-o", "log.txt"]
    # no gres at all: the controller sets typed per-GPU gres (whole or shards) before the first start
    assert not [o for o in opts if o.startswith(("--gres", "--gpus", "-G"))]
    assert req.as_user is None  # as the caller
    private = private_dir(req, tmp_path / "jobs")
    assert f'export GANDIVA_STATE_DIR={private}/"$SLURM_JOB_ID"' in req.script
    assert req.script.rstrip().endswith("--signal USR2 -- python3 train.py --x")
    spec = submitted_spec(req, tmp_path / "jobs", "101")
    assert spec is not None and spec.user == "alice"
    assert (spec.min_gpus, spec.max_gpus, spec.model, spec.total_samples) == (1, 4, "bert", 640)
    assert (spec.submitted, spec.partition, spec.command) == (5.0, "gpu", ("python3", "train.py", "--x"))
    embedded = spec_from_script(req.script)
    assert embedded is not None and embedded.with_job_id("101") == spec


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "9", "--", "true"],
        ["--gpus", "5", "--", "true"],
        ["--gpus", "4:2", "--", "true"],
        ["-p", "nope", "--", "true"],
        ["--gpus", "1"],
        ["--", "/no/such/cmd"],
        ["--gres=gpu:1", "--", "true"],
        ["--gpus", "8", "--exclude=n2", "--", "true"],
        ["--gpus", "8", "--excl=n2", "--", "true"],
        ["-xn2", "--", "true"],
        ["-C", "a100", "--", "true"],
        ["--exclusive", "--", "true"],
        ["-n", "8", "--ntasks-per-node=4", "-c", "4", "--gpus", "1", "--", "true"],
        ["--mem=9G", "--", "true"],
    ],
)
def test_bad_requests_submit_nothing(argv: list[str], cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    with pytest.raises(BadRequest):
        _submit(argv, be, cluster)
    assert be.submitted == []
    assert not any((tmp_path / "jobs").iterdir())  # no private directory either


def test_sbatch_variables_that_limit_placement_submit_nothing(cluster: dict[str, str], tmp_path: Path) -> None:
    be = FakeBackend()
    for var, value in (("SBATCH_EXCLUDE", "n2"), ("SBATCH_CONSTRAINT", "a100"), ("SBATCH_MEM_PER_NODE", "9G")):
        with pytest.raises(BadRequest, match=var if var != "SBATCH_MEM_PER_NODE" else "needs 9216 MB"):
            _submit(["--", "true"], be, {**cluster, var: value})
    assert be.submitted == []
    assert _submit(["-c", "8", "--mem=8000", "--", "true"], be, cluster) == "101"


def test_cli_refuses_a_constraint_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gandiva.cli import main

    assert main(["sbatch", "--gpus", "8", "--exclude=n2", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--exclude cannot be honoured by gandiva" in err


def test_without_topology_file_gpus_come_from_slurm(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    be = FakeBackend()
    env = {"GANDIVA_JOBS_ROOT": str(tmp_path / "jobs")}
    with pytest.raises(BadRequest, match="nodes have 4 GPUs"):
        _submit(["--gpus", "5", "--", "true"], be, env)
    assert _submit(["--gpus", "4", "--", "true"], be, env) == "101"


def test_unwritable_spec_cancels_the_job(cluster: dict[str, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("slurm_gandiva.submit.cli.write_specs_in", fail)
    be = FakeBackend()
    with pytest.raises(BadRequest, match=r"No space left on device.*job 101 was cancelled"):
        _submit(["--", "true"], be, cluster)
    assert be.cancelled == ["101"]


def test_a_failed_sbatch_leaves_no_private_directory(cluster: dict[str, str], tmp_path: Path) -> None:
    class Refusing(FakeBackend):
        def submit(self, req: SubmitRequest) -> str:
            raise BadRequest("sbatch: error: invalid account")

    with pytest.raises(BadRequest, match="invalid account"):
        _submit(["--", "true"], Refusing(), cluster)
    assert not any((tmp_path / "jobs").iterdir())


def test_missing_jobs_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--jobs-root"):
        resolve_paths(parse_request(["--jobs-root", str(tmp_path / "nope"), "--", "true"]), {})


def test_resolve_from_devcluster_layout(cluster: dict[str, str], tmp_path: Path) -> None:
    r = resolve_paths(parse_request(["--", "true"]), cluster)
    assert (r.jobs_root, r.topology) == (tmp_path / "jobs", tmp_path / "topology.json")


def test_cli_refuses_with_one_line_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gandiva.cli import main

    assert main(["sbatch", "--gpus", "3:1", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "MIN is larger than MAX" in err


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gandiva.cli import main

    assert main(["sbatch", "--help"]) == 0
    assert "usage: gandiva sbatch" in capsys.readouterr().out


def test_resolve_from_the_controller_config(tmp_path: Path) -> None:
    (tmp_path / "jobs-here").mkdir()
    write_topology(Topology.uniform(1, 2), tmp_path / "topo.json")
    conf = tmp_path / "gandiva.conf"
    conf.write_text(
        f"state_dir = {tmp_path}\njobs_dir = {tmp_path / 'jobs-here'}\ntopology_file = {tmp_path / 'topo.json'}\n"
    )
    r = resolve_paths(parse_request(["--", "true"]), {"GANDIVA_CONF": str(conf)})
    assert (r.jobs_root, r.topology) == (tmp_path / "jobs-here", tmp_path / "topo.json")
    assert r.signal == "USR2"
    conf.write_text(conf.read_text() + "signal = SIGALRM\n")
    assert resolve_paths(parse_request(["--", "true"]), {"GANDIVA_CONF": str(conf)}).signal == "ALRM"
    # a bad config is an error that names it, not a silent fallback
    conf.write_text("quantum = -1\n")
    with pytest.raises(ConfigError, match=r"gandiva\.conf:1"):
        resolve_paths(parse_request(["--", "true"]), {"GANDIVA_CONF": str(conf)})


def test_the_controllers_signal_is_the_default(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    conf = tmp_path / "gandiva.conf"
    conf.write_text(f"state_dir = {tmp_path}\nsignal = ALRM\n")
    be = FakeBackend()
    env = {"GANDIVA_CONF": str(conf)}
    _submit(["--", "true"], be, env)
    assert "--signal ALRM --" in be.submitted[0].script
    _submit(["--signal", "sigxcpu", "--", "true"], be, env)  # the user's choice wins
    assert "--signal XCPU --" in be.submitted[1].script
    spec = submitted_spec(be.submitted[0], tmp_path / "jobs", "101")
    assert spec is not None and spec.signal == "ALRM"
