"""Checkpoint files: atomic rotation, verification, fallback, RNG capture."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from job_wrapper import checkpoint as ckpt
from slurm_gandiva.requeue.contract import JobFiles, stale_temps


def state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.arange(1000, dtype=torch.float32) * step, "meta": {"a": [1, 2, (3, None)]}}


def test_round_trip_and_rotation_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    s1 = ckpt.save(files, state(1))
    assert s1.path == files.checkpoint and s1.nbytes == files.checkpoint.stat().st_size and s1.seconds >= 0
    assert not files.checkpoint_prev.exists()
    ckpt.save(files, state(2))
    assert ckpt.decode(files.checkpoint.read_bytes())["step"] == 2
    assert ckpt.decode(files.checkpoint_prev.read_bytes())["step"] == 1
    loaded = ckpt.load(files)
    assert loaded is not None and loaded.path == files.checkpoint and loaded.fallback_reason is None
    assert torch.equal(loaded.state["w"], state(2)["w"])  # type: ignore[arg-type]
    assert loaded.state["meta"] == {"a": [1, 2, (3, None)]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    assert ckpt.load(JobFiles(tmp_path)) is None


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:10], "truncated"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
        (lambda b: b"", "truncated"),
    ],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, damage: object, message: str) -> None:
    files = JobFiles(tmp_path)
    ckpt.save(files, state(1))
    ckpt.save(files, state(2))
    files.checkpoint.write_bytes(damage(files.checkpoint.read_bytes()))  # type: ignore[operator]
    loaded = ckpt.load(files)
    assert loaded is not None and loaded.path == files.checkpoint_prev and loaded.state["step"] == 1
    assert loaded.fallback_reason is not None and message in loaded.fallback_reason


def test_a_damaged_checkpoint_without_fallback_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    ckpt.save(files, state(1))
    files.checkpoint.write_bytes(files.checkpoint.read_bytes()[:100])
    with pytest.raises(ckpt.CheckpointError) as exc:
        ckpt.load(files)
    msg = str(exc.value)
    assert "\n" not in msg and str(tmp_path) in msg and "truncated" in msg and "restart from scratch" in msg


def test_only_a_previous_checkpoint_is_used_with_a_warning(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    ckpt.save(files, state(1))
    ckpt.save(files, state(2))
    files.checkpoint.unlink()
    loaded = ckpt.load(files)
    assert loaded is not None and loaded.state["step"] == 1 and "missing" in (loaded.fallback_reason or "")


def test_a_pickle_that_is_not_a_state_dict_is_rejected(tmp_path: Path) -> None:
    data = ckpt.encode({"x": 1})
    assert ckpt.decode(data) == {"x": 1}
    import hashlib
    import io
    import struct

    buf = io.BytesIO()
    torch.save([1, 2], buf)
    payload = buf.getvalue()
    bad = struct.pack(">8sQ32s", ckpt.MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload
    with pytest.raises(ckpt.CheckpointError, match="state dict"):
        ckpt.decode(bad)


def test_pause_hook_stops_half_way_and_leftover_temp_files_are_cleaned(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    ckpt.save(files, state(1))
    seen: list[int] = []

    def on_pause() -> None:
        tmps = stale_temps(files.checkpoint)
        assert len(tmps) == 1
        seen.append(tmps[0].stat().st_size)
        # the complete old checkpoint is still in place while the new one is half-written
        assert ckpt.decode(files.checkpoint.read_bytes())["step"] == 1

    (tmp_path / ".checkpoint.pt.99999.tmp").write_bytes(b"left by a killed writer")
    saved = ckpt.save(files, state(2), pause_s=0.01, on_pause=on_pause)
    assert len(seen) == 1 and 0 < seen[0] < saved.nbytes
    assert not list(tmp_path.glob("*.tmp*"))
    assert ckpt.decode(files.checkpoint.read_bytes())["step"] == 2


def test_write_failure_raises_checkpoint_error_and_leaves_the_old_one(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    ckpt.save(files, state(1))
    with pytest.raises(ckpt.CheckpointError, match="cannot write"):
        ckpt.save(files, {"bad": (lambda: None)})  # unpicklable -> raised before any file is touched
    assert ckpt.decode(files.checkpoint.read_bytes())["step"] == 1


def test_rng_capture_and_restore_reproduce_all_streams() -> None:
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    np.random.standard_normal()  # a cached gaussian is part of numpy's state
    rng = ckpt.decode(ckpt.encode({"rng": ckpt.capture_rng()}))["rng"]
    first = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    ckpt.restore_rng(rng)
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == first


def test_an_array_task_is_named_array_task_in_its_checkpoints() -> None:
    """A task's checkpoint names it "ARRAY_TASK", as the controller, its spec and its state directory do (its
    numeric job id is whatever Slurm gave it when the task was split off the array)."""
    first = ckpt.job_identity({"SLURM_JOB_ID": "50", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7",
                               "GANDIVA_JOB_SUBMITTED": "5.0"})
    later = ckpt.job_identity({"SLURM_JOB_ID": "61", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7",
                               "GANDIVA_JOB_SUBMITTED": "5.0"})
    assert first == later == {"job_id": "50_7", "submitted": "5.0"}
    ckpt.check_identity({"job": first}, later, "checkpoint.pt", Path("/r"))
    other = ckpt.job_identity({"SLURM_JOB_ID": "62", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "8",
                               "GANDIVA_JOB_SUBMITTED": "5.0"})
    with pytest.raises(ckpt.CheckpointError):
        ckpt.check_identity({"job": first}, other, "checkpoint.pt", Path("/r"))
    assert ckpt.job_identity({"SLURM_JOB_ID": "57"}) == {"job_id": "57", "submitted": ""}
