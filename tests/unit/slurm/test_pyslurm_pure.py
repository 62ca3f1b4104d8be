"""The pyslurm backend's pure parts and backend selection, without pyslurm or Slurm (fakes only)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from slurm_gandiva.errors import (
    ConfigError,
    InvalidRequest,
    PermissionDenied,
    SlurmError,
    SlurmUnreachable,
    UnknownJob,
)
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmJob
from slurm_gandiva.slurm.cli_backend import CliBackend
from slurm_gandiva.slurm.pyslurm_backend import (
    _modify_value,
    _rpc_error,
    base_state,
    gres_of,
    gres_used,
    load_pyslurm,
    reason_of,
    typed_allocation,
)


def test_state_words_map_to_the_base_state_squeue_lists_first() -> None:
    assert base_state("RUNNING") == "RUNNING" and base_state("COMPLETING") == "COMPLETING"
    assert base_state("REQUEUED") == "PENDING" and base_state("REQUEUE_HOLD") == "PENDING"
    assert base_state("SIGNALING") == "RUNNING" and base_state("CONFIGURING") == "RUNNING"
    assert base_state("STAGE_OUT") is None and base_state("REVOKED") is None  # squeue must say


def test_reasons_are_enum_names_or_asked_from_squeue() -> None:
    assert reason_of("") == "None" and reason_of("JobHeldAdmin") == "JobHeldAdmin"
    assert reason_of("job requeued in held state") is None  # may be JobHeldUser or JobHeldAdmin
    assert reason_of("ReqNodeNotAvail, UnavailableNodes:n1") is None
    assert reason_of("RaisedSignal:15(Terminated)") == "RaisedSignal"


def test_gpus_come_from_per_gpu_typed_requests_only() -> None:
    assert typed_allocation("gres/gpu:g1:1,gres/gpu:g3:1") == ((1, 3), ())
    assert typed_allocation("gres/shard:g2:1") == ((), (2,))
    assert typed_allocation("gres/gpu:2") is None  # untyped: squeue's gres detail says which
    assert typed_allocation("gres/gpu:a100:2") is None
    assert typed_allocation("") == ((), ())
    assert gres_of({"gres/gpu:g0": 1, "gres/gpu": 2}) == "gres/gpu:g0:1,gres/gpu:2"
    assert gres_of({"gpu:g0": {"count": 1}}) == "gpu:g0:1"


def _job(jid: str, tres: str, gpus: dict[str, tuple[int, ...]], shards: dict[str, tuple[int, ...]]) -> SlurmJob:
    from slurm_gandiva.slurm.base import HoldKind

    return SlurmJob(job_id=jid, name="", user="u", state="RUNNING", reason="None", hold=HoldKind.NONE,
                    nodes=tuple(gpus) or tuple(shards), gpus=gpus, shards=shards, tres_per_node=tres)


def test_gres_used_is_rebuilt_in_sinfos_format() -> None:
    conf = "gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2"
    jobs = [_job("1", "gres/gpu:g1:1", {"n1": (1,)}, {}), _job("2", "gres/shard:g0:1", {}, {"n1": (0,), "n2": (0,)})]
    assert gres_used(conf, "n1", jobs) == "gpu:g0:0(IDX:N/A),gpu:g1:1(IDX:1),shard:g0:1(1/2),shard:g1:0(0/2)"
    assert gres_used("gpu:a100:4", "n1", jobs) == ""


def test_rpc_errors_map_to_the_hierarchy() -> None:
    def err(errno: int, msg: str) -> Exception:
        e = Exception(msg)
        e.errno = errno  # type: ignore[attr-defined]
        e.msg = msg  # type: ignore[attr-defined]
        return e

    assert isinstance(_rpc_error("x", err(2017, "Invalid job id specified")), UnknownJob)
    assert isinstance(_rpc_error("x", err(2002, "Access/permission denied")), PermissionDenied)
    assert isinstance(_rpc_error("x", err(1001, "Unable to contact slurm controller")), SlurmUnreachable)
    assert isinstance(_rpc_error("x", err(2072, "Invalid generic resource (gres) specification")), InvalidRequest)


def test_cli_is_chosen_without_pyslurm_and_forcing_pyslurm_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    import importlib.util

    monkeypatch.delenv("GANDIVA_SLURM_BACKEND", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert isinstance(make_backend({"SLURM_CONF": "/nonexistent"}), CliBackend)
    assert isinstance(make_backend({"SLURM_CONF": "/nonexistent"}, kind="cli"), CliBackend)
    with pytest.raises(ConfigError, match="pyslurm is not installed") as exc:
        make_backend({"SLURM_CONF": "/nonexistent"}, kind="pyslurm")
    assert "\n" not in str(exc.value)
    assert isinstance(make_backend({"GANDIVA_SLURM_BACKEND": "cli"}), CliBackend)
    with pytest.raises(ConfigError, match="unknown Slurm backend"):
        make_backend({"GANDIVA_SLURM_BACKEND": "rest"})


def test_by_default_pyslurm_is_tried_only_for_the_slurm_commands_of_its_release(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """The default picks pyslurm where its package's release is that of `scontrol --version` on PATH, without
    importing it elsewhere (libslurm of another release may end the process on that release's slurm.conf)."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    import slurm_gandiva.slurm as slurm_pkg

    monkeypatch.delenv("GANDIVA_SLURM_BACKEND", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "pyslurm" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "25.11.2")
    tried: list[object] = []
    sentinel = SimpleNamespace(kind="pyslurm")
    monkeypatch.setattr(slurm_pkg, "_pyslurm_backend", lambda env, timeout: tried.append(env) or sentinel)  # type: ignore[func-returns-value]
    bin_ = Path(str(tmp_path)) / "bin"
    bin_.mkdir()
    scontrol = bin_ / "scontrol"
    for printed, picked in (("slurm 24.11.5", False), ("slurm 25.11.7", True)):
        scontrol.write_text(f"#!/bin/sh\necho '{printed}'\n")
        scontrol.chmod(0o755)
        tried.clear()
        backend = make_backend({"PATH": str(bin_)})
        assert (backend is sentinel) is picked and bool(tried) is picked, printed
        assert isinstance(make_backend({"PATH": str(bin_), "GANDIVA_SLURM_BACKEND": "cli"}), CliBackend)
    scontrol.unlink()  # no Slurm commands at all: the CLI backend, which then says what is missing
    assert isinstance(make_backend({"PATH": str(bin_)}), CliBackend)


def test_pyslurm_is_bound_to_one_slurm_conf_per_process(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from pathlib import Path

    a, b = Path(str(tmp_path)) / "a.conf", Path(str(tmp_path)) / "b.conf"
    a.write_text("")
    b.write_text("")
    calls: list[object] = []
    fake = SimpleNamespace(slurm_init=calls.append)
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(ConfigError, match="already talks to"):  # imported (auto-initialised) by someone else
        load_pyslurm(str(a))
    fake1 = SimpleNamespace(slurm_init=calls.append)
    monkeypatch.setitem(sys.modules, "pyslurm", fake1)
    monkeypatch.setenv("SLURM_CONF", str(a))
    assert load_pyslurm(str(a)) is fake1  # ... from the same SLURM_CONF: usable
    assert calls == []  # never initialised twice
    fake2 = SimpleNamespace(slurm_init=calls.append, _slurm_gandiva_conf=str(a))
    monkeypatch.setitem(sys.modules, "pyslurm", fake2)
    assert load_pyslurm(str(a)) is fake2
    with pytest.raises(ConfigError, match="one configuration per process"):
        load_pyslurm(str(b))
    with pytest.raises(ConfigError, match=r"readable slurm\.conf"):
        load_pyslurm(str(Path(str(tmp_path)) / "missing.conf"))


def test_a_begin_time_of_now_plus_n_counts_from_the_whole_second_as_scontrol_does() -> None:
    assert _modify_value("starttime", "now", lambda: 1000.7) == 1000
    assert _modify_value("starttime", "now+2", lambda: 1000.7) == 1002
    assert _modify_value("begintime", "NOW+1", lambda: 5.2) == 6


class _Refused(Exception):
    def __init__(self, errno: int) -> None:
        super().__init__(f"slurm errno {errno}")
        self.errno = errno


def test_a_stop_or_cont_refused_while_the_last_is_delivered_is_sent_again_until_the_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """slurmctld refuses SIGSTOP / SIGCONT with "try again later" while the previous one is still being delivered
    to a multi-node job's nodes (JOB_SIGNALING); scancel sends again, so the pyslurm backend must too."""
    from pathlib import Path

    from slurm_gandiva.slurm.pyslurm_backend import PyslurmBackend

    conf = Path(str(tmp_path)) / "slurm.conf"
    conf.write_text("")
    answers: list[int | None] = []
    sent: list[tuple[int, int, str]] = []

    class Job:
        def __init__(self, jid: int) -> None:
            self.jid = jid

        def send_signal(self, num: int, steps: str) -> None:
            sent.append((self.jid, num, steps))
            errno = answers.pop(0)
            if errno is not None:
                raise _Refused(errno)

    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setitem(sys.modules, "pyslurm", SimpleNamespace(slurm_init=lambda conf: None, Job=Job))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    backend = PyslurmBackend({"SLURM_CONF": str(conf)}, timeout=3.0, clock=lambda: now[0], sleep=sleep,
                             cli=SimpleNamespace())  # type: ignore[arg-type]
    answers[:] = [2020, 2020, None]
    backend.signal("50", "CONT", batch_only=False)
    assert [s[1:] for s in sent] == [(18, "all")] * 3 and slept == [0.1, 0.2]
    sent.clear()
    answers[:] = [2020] * 20  # still refused when the timeout is spent: the refusal, as one line
    with pytest.raises(InvalidRequest, match="signal STOP to job 50"):
        backend.signal("50", "STOP", batch_only=False)
    assert 1 < len(sent) < 20 and now[0] <= 3.0 + 0.3
    answers[:] = [2017]  # any other refusal is not retried
    sent.clear()
    with pytest.raises(SlurmError):
        backend.signal("50", "STOP", batch_only=False)
    assert len(sent) == 1
