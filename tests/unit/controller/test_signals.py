"""One signal contract: the controller stops each job with the signal that job catches (its
`gandiva sbatch --signal`, recorded with the job), and only signals a job can catch that are not NCCL's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gandiva.controller.act import JobSignals
from slurm_gandiva.controller.config import parse_config
from slurm_gandiva.controller.service import Controller
from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import ClusterView, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.requeue.contract import REFUSED_SIGNALS, suspend_signal
from slurm_gandiva.slurm.base import HoldKind, SlurmJob
from slurm_gandiva.store import Store
from slurm_gandiva.submit.request import parse_request
from slurm_gandiva.submit.spec import SubmitSpec, write_spec
from tests.unit.controller.controller_fakes import FakeBackend, sjob

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
    cfg = parse_config(f"state_dir = {tmp_path}\ntick = 0.2\nquantum = 1\nsignal = URG\nsuspend_timeout = 5\n")
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
    assert backend.signals == {"1": "ALRM", "2": "URG"}
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


def test_job_signals_routes_each_job_to_the_protocol_of_its_signal() -> None:
    made: list[str] = []

    class Recorder:
        def __init__(self, sig: str) -> None:
            self.sig = sig
            self.suspend_timeout = 1.0
            made.append(sig)

        def suspend(self, job_id: str) -> str:
            return f"{job_id}:{self.sig}"

    own = {"1": "ALRM", "2": "", "3": "ALRM"}
    js = JobSignals(Recorder, own.__getitem__, "USR2")  # type: ignore[arg-type]
    assert [js.suspend(j) for j in ("1", "2", "3")] == ["1:ALRM", "2:USR2", "3:ALRM"]  # type: ignore[comparison-overlap]
    assert made == ["ALRM", "USR2"]  # one protocol per signal, kept
    before = list(js._by_signal.values())
    js.configure("XCPU", suspend_timeout=9.0)
    assert all(p.suspend_timeout == 9.0 for p in before)  # type: ignore[attr-defined]
    assert js.suspend("2") == "2:XCPU"  # type: ignore[comparison-overlap]


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
