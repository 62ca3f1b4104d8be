"""One signal contract: the controller stops each job with the signal that job catches (its
`gandiva sbatch --signal`, recorded with the job), and only signals a job can catch that are not NCCL's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.config import load_config, parse_config
from slurm_gandiva.controller.act import Actor
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import ClusterView, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.requeue.contract import REFUSED_SIGNALS, suspend_signal
from slurm_gandiva.requeue.protocol import RequeueProtocol
from slurm_gandiva.requeue.spec import SubmitSpec, write_spec
from slurm_gandiva.slurm.base import HoldKind, SlurmJob
from slurm_gandiva.store import Store
from slurm_gandiva.submit.request import parse_request
from slurm_gandiva.topology.file import write_topology
from tests.unit.controller.controller_fakes import FakeBackend, FakeProtocol, pl, sjob

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


class WrapperBackend(FakeBackend):
    """A running job's wrapper answers the signal it catches: checkpoint, status.json, requeue-hold."""

    def __init__(self, jobs: list[SlurmJob], jobs_root: Path) -> None:
        super().__init__(jobs)
        self.jobs_root = jobs_root
        self.signals: dict[str, str] = {}

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        self.signals[job_id] = signal_name
        d = self.jobs_root / job_id
        d.mkdir(parents=True, exist_ok=True)
        (d / "status.json").write_text(json.dumps({"outcome": "suspended"}))
        j = self.job(job_id)
        self.set(replace(j, state="PENDING", gpus={}, hold=HoldKind.USER, reason="job_requeued_in_held_state",
                         restart_count=j.restart_count + 1))


class SuspendAll:
    name = "suspend-all"
    quantum = None

    def decide(self, view: ClusterView, now: float) -> Plan:
        return Plan(tuple(Decision(Action.SUSPEND, j.job_id) for j in view.running))


def test_each_job_is_suspended_with_its_own_signal(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\nsignal = XCPU\nsuspend_timeout = 5\n")
    running = {"gpus": {"n1": (0,)}, "hold": HoldKind.NONE}
    jobs = [sjob("1", "RUNNING", **running), sjob("2", "RUNNING", **{**running, "gpus": {"n1": (1,)}})]  # type: ignore[arg-type]
    cfg.job_root.mkdir()
    write_spec(cfg.job_root, SubmitSpec(job_id="1", user="alice", min_gpus=1, max_gpus=1, signal="ALRM"))
    backend = WrapperBackend(jobs, cfg.job_root)
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    ctl = Controller(cfg, backend, store, policy=SuspendAll(), topology=TOPO, progress_reader=lambda _p, _u: None)
    rep = ctl.tick()
    assert rep.error == "" and all(r.ok for r in rep.results) and len(rep.results) == 2
    # job 1 asked for ALRM at submission; job 2 has no spec (plain sbatch): the configured signal
    assert backend.signals == {"1": "ALRM", "2": "XCPU"}
    assert store.get_job("1").signal == "ALRM" and store.get_job("2").signal == ""


def test_a_spec_edited_to_a_refused_signal_falls_back_to_the_configured_one(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\n")
    spec = SubmitSpec(job_id="1", user="alice", min_gpus=1, max_gpus=1, signal="KILL")  # written by hand
    cfg.job_root.mkdir()
    write_spec(cfg.job_root, spec)
    backend = FakeBackend([sjob("1")])
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    ctl = Controller(cfg, backend, store, policy=SuspendAll(), topology=TOPO, progress_reader=lambda _p, _u: None)
    found = ctl.reconcile()
    assert any(f.kind == "signal-refused" and "KILL cannot suspend a job" in f.detail for f in found)
    assert store.get_job("1").signal == ""


def test_each_operation_is_given_its_jobs_signal(tmp_path: Path) -> None:
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\nsignal = XCPU\n")
    jobs = [sjob(j, "RUNNING", gpus={"n1": (i,)}, hold=HoldKind.NONE) for i, j in enumerate(("1", "2", "3"))]
    cfg.job_root.mkdir()
    for jid in ("1", "3"):
        write_spec(cfg.job_root, SubmitSpec(job_id=jid, user="alice", min_gpus=1, max_gpus=1, signal="ALRM"))
    backend = FakeBackend(jobs)
    proto = FakeProtocol(backend)
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    ctl = Controller(cfg, backend, store, policy=SuspendAll(), protocol=proto, topology=TOPO,
                     progress_reader=lambda _p, _u: None)
    rep = ctl.tick()
    assert rep.error == "" and all(r.ok for r in rep.results) and len(rep.results) == 3
    # jobs 1 and 3 asked for ALRM at submission; job 2 has none: the protocol's configured signal
    assert proto.signals == {"1": "ALRM", "2": None, "3": "ALRM"}
    actor = Actor(backend, store, clock=lambda: 0.0)
    actor.protocol = proto
    actor._call(Decision(Action.MIGRATE, "1", pl("n2", 0)))
    actor._call(Decision(Action.RESIZE, "2", pl("n2", 1, 2)))
    assert (proto.signals["1"], proto.signals["2"]) == ("ALRM", None)


def test_a_reload_changes_the_configured_signal(tmp_path: Path) -> None:
    topo = tmp_path / "topology.json"
    write_topology(TOPO, topo)
    conf = tmp_path / "gandiva.conf"
    base = f"state_dir = {tmp_path / 'state'}\ntopology_file = {topo}\npartitions = gpu\n"
    conf.write_text(base + "signal = XCPU\n")
    cfg = load_config(conf)
    (tmp_path / "state").mkdir()
    ctl = Controller(cfg, FakeBackend([]), Store(cfg.db_url), config_path=conf, progress_reader=lambda _p, _u: None)
    proto = ctl.protocol
    assert isinstance(proto, RequeueProtocol) and proto.signal_name == "XCPU"
    conf.write_text(base + "signal = XCPU\nsuspend_timeout = 9\n")
    assert ctl.reload()
    assert (proto.signal_name, proto.suspend_timeout) == ("XCPU", 9.0)


@pytest.mark.parametrize("name", ["KILL", "SIGSTOP", "9", "usr1", "TERM", "CONT"])
def test_refused_signals(name: str) -> None:
    with pytest.raises(ValueError, match="cannot suspend a job") as ei:
        suspend_signal(name)
    assert "\n" not in str(ei.value) and "USR2" in str(ei.value)
    with pytest.raises(BadRequest, match=f"--signal {name}: signal .* cannot suspend a job"):
        parse_request(["--signal", name, "--", "true"])


def test_accepted_signals_are_normalised() -> None:
    assert suspend_signal(None).name == "SIGUSR2"
    assert parse_request(["--signal", "sigalrm", "--", "true"]).signal == "ALRM"
    assert parse_request(["--", "true"]).signal is None
    with pytest.raises(BadRequest, match="unknown signal"):
        parse_request(["--signal", "NOPE", "--", "true"])
    assert all(s not in REFUSED_SIGNALS for s in (suspend_signal("USR2"), suspend_signal("ALRM")))


def test_admin_verbs_refuse_a_signal_a_job_cannot_catch(capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gandiva.cli import main

    assert main(["suspend", "42", "--signal", "KILL"]) == 2
    err = capsys.readouterr().err
    assert "KILL cannot suspend a job" in err and err.count("\n") == 1
