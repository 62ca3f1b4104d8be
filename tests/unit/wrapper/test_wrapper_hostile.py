"""Issue 17 on the job side: the state directory is the user's alone and refused when planted, job files are
0600, a checkpoint names its job and is refused for another, and a checkpoint of another model shape, a
changed dataset or an unwritable directory end the job with one line (exit 1), never a traceback."""

from __future__ import annotations

import os
import pwd
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from job_wrapper import Session
from job_wrapper import checkpoint as ckpt
from job_wrapper.cli import main as wrapper_main
from job_wrapper.progress import append_event
from slurm_gandiva.requeue import contract
from slurm_gandiva.requeue.contract import (
    JOB_SUBMITTED_ENV,
    JobFiles,
    Progress,
    StateDirError,
    check_state_dir,
    ensure_state_dir,
    write_progress,
)

DATA = torch.randn(12, 3, generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("RANK", "WORLD_SIZE", "GANDIVA_STATE_DIR", "GANDIVA_SIGNAL", "GANDIVA_FAST_EXIT",
                "SLURM_JOB_ID", JOB_SUBMITTED_ENV):
        monkeypatch.delenv(var, raising=False)
    old = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def other_uid() -> int:
    return pwd.getpwnam("nobody").pw_uid


# -- the state directory ---------------------------------------------------------------------------------

def test_ensure_state_dir_makes_it_private(tmp_path: Path) -> None:
    os.umask(0o022)
    d = ensure_state_dir(tmp_path / "42")
    assert d.is_dir() and mode(d) == 0o700
    assert ensure_state_dir(d) == d  # an existing one of ours, as a requeued job finds it


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "42"
    d.mkdir(mode=0o755)
    os.chown(d, other_uid(), -1)
    with pytest.raises(StateDirError, match=r"belongs to nobody .* not to .*planted"):
        ensure_state_dir(d)


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o777])
def test_a_directory_others_can_write_is_refused(tmp_path: Path, bits: int) -> None:
    d = tmp_path / "42"
    d.mkdir()
    d.chmod(bits)
    with pytest.raises(StateDirError, match="writable by others"):
        check_state_dir(d)


def test_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(StateDirError, match="symbolic link"):
        ensure_state_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(StateDirError, match="not a directory"):
        ensure_state_dir(tmp_path / "file")
    with pytest.raises(StateDirError, match="does not exist"):
        ensure_state_dir(tmp_path / "no" / "such")


def test_an_unwritable_directory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "42"
    d.mkdir(mode=0o500)
    monkeypatch.setattr(contract.os, "access", lambda *a, **k: False)  # type: ignore[attr-defined]  # root could write anyway
    with pytest.raises(StateDirError, match="not writable"):
        check_state_dir(d)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_the_wrapper_refuses_a_planted_directory_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "42"
    d.mkdir(mode=0o755)
    os.chown(d, other_uid(), -1)
    ran = tmp_path / "ran"
    code = wrapper_main(["--state-dir", str(d), "--", "touch", str(ran)])
    err = capsys.readouterr().err
    assert code == 1 and not ran.exists() and list(d.iterdir()) == []
    assert len(err.strip().splitlines()) == 1 and "the job does not run" in err and "Traceback" not in err


def test_the_wrapper_turns_a_write_error_into_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import job_wrapper.launcher as launcher

    def fail(*_a: object, **_k: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "42" / "events.jsonl"))

    monkeypatch.setattr(launcher, "append_event", fail)
    code = wrapper_main(["--state-dir", str(tmp_path / "42"), "--", "true"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip() == f"gandiva-wrapper: cannot write {tmp_path / '42' / 'events.jsonl'}: Permission denied; " \
                          "check the job's state directory"


# -- file modes ------------------------------------------------------------------------------------------

def test_job_files_are_private(tmp_path: Path) -> None:
    os.umask(0o022)
    files = JobFiles(ensure_state_dir(tmp_path / "7"))
    write_progress(files.progress, Progress(1, 0, 8, None, 0.1, 80.0, 1, 1.0))
    append_event(files.events, "start")
    ckpt.save(files, {"x": torch.zeros(2)})
    ckpt.save(files, {"x": torch.ones(2)})  # the first becomes checkpoint.prev.pt
    for f in (files.progress, files.events, files.checkpoint, files.checkpoint_prev):
        assert mode(f) == 0o600, f


# -- whose checkpoint ------------------------------------------------------------------------------------

def _train(state: Path, model: torch.nn.Module | None = None, data: torch.Tensor = DATA,
           suspend_after: int | None = None) -> Session:
    model = model or torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = Session(model, opt, state_dir=state, progress_interval=60)
    for done, x in enumerate(job.batches(data, batch_size=4, epochs=2), start=1):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if done == suspend_after:
            job.request_suspend()
    return job


def _suspend_as(monkeypatch: pytest.MonkeyPatch, state: Path, job_id: str, submitted: str = "") -> None:
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv(JOB_SUBMITTED_ENV, submitted)
    with pytest.raises(SystemExit) as stop:
        _train(state, suspend_after=2)
    assert stop.value.code == 75


def _refused(capsys: pytest.CaptureFixture[str], **kw: object) -> str:
    with pytest.raises(SystemExit) as stop:
        _train(**kw)  # type: ignore[arg-type]
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_checkpoint_names_its_job_and_resumes_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "42"
    _suspend_as(monkeypatch, state, "42", "1700000000.000000")
    saved = ckpt.decode(JobFiles(state).checkpoint.read_bytes())
    assert saved["job"] == {"job_id": "42", "submitted": "1700000000.000000"}
    job = _train(state)  # the same job, requeued: resumes
    assert job.resumed_from == JobFiles(state).checkpoint


def test_a_planted_checkpoint_of_another_job_is_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "41"
    _suspend_as(monkeypatch, theirs, "41", "1700000000.000000")
    mine = tmp_path / "43"
    mine.mkdir(mode=0o700)
    for f in ("checkpoint.pt", "checkpoint.prev.pt"):
        if (theirs / f).exists():
            (mine / f).write_bytes((theirs / f).read_bytes())
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    err = _refused(capsys, state=mine)
    assert "belongs to job 41" in err and "not to this job 43" in err and "start from scratch" in err


def test_the_same_job_id_submitted_again_is_another_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "42"
    _suspend_as(monkeypatch, state, "42", "1700000000.000000")
    monkeypatch.setenv(JOB_SUBMITTED_ENV, "1800000000.000000")  # Slurm's ids started over
    assert "submitted 1700000000.000000" in _refused(capsys, state=state)


def test_a_checkpoint_naming_no_job_is_refused_inside_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "42"
    with pytest.raises(SystemExit):
        _train(state, suspend_after=1)  # outside Slurm: no job to name
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert "names no job" in _refused(capsys, state=state)


# -- one line instead of a traceback ---------------------------------------------------------------------

def test_a_checkpoint_of_another_model_shape_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _train(tmp_path / "s", suspend_after=1)
    err = _refused(capsys, state=tmp_path / "s", model=torch.nn.Linear(3, 5))
    assert "does not fit this model" in err and "size mismatch" in err


def test_a_changed_dataset_size_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _train(tmp_path / "s", suspend_after=1)
    err = _refused(capsys, state=tmp_path / "s", data=torch.randn(20, 3))
    assert "the dataset has 20 samples" in err and "over 12" in err


def test_a_planted_state_directory_stops_the_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "s"
    d.mkdir()
    d.chmod(0o777)
    err = _refused(capsys, state=d)
    assert "writable by others" in err
