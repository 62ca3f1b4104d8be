"""Checkpoint files: atomic, verified, with the previous complete one kept as a fallback.

A file is `MAGIC | payload length | sha256(payload) | payload`, the payload being `torch.save` of the state.
A write goes to a temp file in the same directory, is fsynced, then renamed over checkpoint.pt; the old
checkpoint.pt is hard-linked to checkpoint.prev.pt first, so at every instant checkpoint.pt is complete.
Files are mode 0600 (the job's user's; root, the controller, reads them anyway).

A checkpoint names the job it belongs to (`job_identity`: Slurm job id and the time `gandiva sbatch` wrote
the job, saved under the state's "job" key); `check_identity` refuses one of another job, so a checkpoint
planted in (or left over in) a job's directory is never resumed.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gandiva.requeue.contract import JOB_SUBMITTED_ENV, JobFiles, stale_temps, write_atomic

MAGIC = b"GNDVCKP1"
_HEADER = struct.Struct(">8sQ32s")  # magic, payload length, sha256 of the payload
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """No loadable checkpoint although one exists, or a checkpoint could not be written."""


@dataclass(frozen=True)
class SavedCheckpoint:
    """What one save did."""

    path: Path
    nbytes: int
    seconds: float  # serialize + write + fsync + rename


@dataclass(frozen=True)
class LoadedCheckpoint:
    """The newest complete checkpoint; `fallback_reason` says why a newer file was skipped."""

    state: dict[str, Any]
    path: Path
    fallback_reason: str | None


def encode(state: Mapping[str, Any]) -> bytes:
    """The file bytes for `state` (header + torch.save payload)."""
    import torch

    buf = io.BytesIO()
    torch.save(dict(state), buf)
    payload = buf.getvalue()
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes, name: str = "checkpoint") -> dict[str, Any]:
    """Parse and verify file bytes; raises CheckpointError on a partial or corrupt file."""
    import torch

    if len(data) < _HEADER.size:
        raise CheckpointError(f"{name} is truncated ({len(data)} bytes)")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"{name} is not a gandiva checkpoint (bad magic)")
    payload = memoryview(data)[_HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(f"{name} is truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{name} is corrupt (checksum mismatch)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad pickle
        raise CheckpointError(f"{name} cannot be unpickled: {type(exc).__name__}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{name} does not hold a state dict")
    return state


def save(
    files: JobFiles,
    state: Mapping[str, Any],
    *,
    clock: Callable[[], float] = time.monotonic,
    pause_s: float = 0.0,
    on_pause: Callable[[], None] | None = None,
) -> SavedCheckpoint:
    """Write `state` atomically as files.checkpoint, keeping the old one as files.checkpoint_prev.

    `pause_s` > 0 (test hook) stops half-way through the write for that long, after calling `on_pause`.
    """
    t0 = clock()
    files.root.mkdir(parents=True, exist_ok=True)
    for stale in [*stale_temps(files.checkpoint), *stale_temps(files.checkpoint_prev)]:
        stale.unlink(missing_ok=True)  # left by a writer killed mid-write
    try:
        data = encode(state)
    except Exception as exc:  # pickling errors come as many types
        raise CheckpointError(f"cannot write {files.checkpoint}: state not serializable: {exc}") from None

    def write(fd: int) -> None:
        view = memoryview(data)
        pause_at = len(data) // 2 if pause_s > 0 else -1
        off = 0
        while off < len(view):
            end = min(len(view), off + _CHUNK)
            if off <= pause_at < end:
                end = pause_at
            off += os.write(fd, view[off:end])
            if off == pause_at:
                pause_at = -1
                os.fsync(fd)
                if on_pause is not None:
                    on_pause()
                time.sleep(pause_s)

    try:
        write_atomic(files.checkpoint, write, durable=True, keep=files.checkpoint_prev)
    except OSError as exc:
        raise CheckpointError(f"cannot write {files.checkpoint}: {exc.strerror or exc}") from None
    return SavedCheckpoint(files.checkpoint, len(data), clock() - t0)


def load(files: JobFiles) -> LoadedCheckpoint | None:
    """The newest complete checkpoint, None when there is none at all.

    Raises CheckpointError when checkpoint files exist but none is loadable: never restart from zero silently.
    """
    problems: list[str] = []
    for path in (files.checkpoint, files.checkpoint_prev):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if path == files.checkpoint and files.checkpoint_prev.exists():
                problems.append(f"{path.name} is missing")
            continue
        except OSError as exc:
            problems.append(f"{path.name}: {exc.strerror or exc}")
            continue
        try:
            state = decode(data, path.name)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        return LoadedCheckpoint(state, path, "; ".join(problems) or None)
    if problems:
        raise CheckpointError(
            f"no loadable checkpoint in {files.root} ({'; '.join(problems)}): "
            "restore a good checkpoint.pt or delete the checkpoint files to restart from scratch"
        )
    return None


def job_identity(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """This job's identity ({"job_id", "submitted"}) from $SLURM_JOB_ID and $GANDIVA_JOB_SUBMITTED (the job
    script of `gandiva sbatch` exports it; "" for a plain sbatch job); None outside Slurm. A job array's task
    is "ARRAY_TASK", as the controller, its spec and its state directory name it (its numeric job id is the
    one Slurm gave it when the task was split off the array)."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        job_id = f"{array}_{task}"
    return {"job_id": job_id, "submitted": env.get(JOB_SUBMITTED_ENV, "").strip()}


def _describe_job(ident: Mapping[str, Any]) -> str:
    when = str(ident.get("submitted") or "")
    return f"job {ident.get('job_id')}" + (f" (submitted {when})" if when else "")


def check_identity(state: Mapping[str, Any], current: Mapping[str, str] | None, name: str, root: Path) -> None:
    """Refuse (CheckpointError, one line) a checkpoint that names another job than `current`, or none while
    this is a Slurm job. Outside Slurm (`current` None) any checkpoint is accepted."""
    if current is None:
        return
    fix = f"delete the checkpoint files in {root} to start from scratch"
    saved = state.get("job")
    if not isinstance(saved, Mapping) or not saved.get("job_id"):
        raise CheckpointError(f"{name} names no job: refused for {_describe_job(current)} "
                              f"(it was not written by this job); {fix}")
    same_id = str(saved.get("job_id")) == current["job_id"]
    saved_when, when = str(saved.get("submitted") or ""), current.get("submitted", "")
    if not same_id or (saved_when and when and saved_when != when):
        raise CheckpointError(
            f"{name} belongs to {_describe_job(saved)}, not to this {_describe_job(current)}: refused "
            f"(planted, or left by an earlier job with the same id); {fix}"
        )


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (python, numpy if installed, torch CPU and CUDA) in loadable form."""
    import torch

    ver, internal, gauss = random.getstate()
    rng: dict[str, Any] = {
        "python": (ver, list(internal), gauss),
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np_state: Any = np.random.get_state(legacy=True)
        name, keys, pos, has_gauss, cached = np_state
        rng["numpy"] = (str(name), torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    """Inverse of capture_rng."""
    import torch

    ver, internal, gauss = rng["python"]
    random.setstate((int(ver), tuple(int(x) for x in internal), gauss))
    torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        import numpy as np

        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
