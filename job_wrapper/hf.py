"""The Hugging Face Trainer under slurm-gandiva (`pip install 'slurm-gandiva[hf]'`).

    gandiva = job_wrapper.hf.GandivaTrainerCallback()
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[gandiva])
    gandiva.train(trainer)       # trainer.train(resume_from_checkpoint=<newest checkpoint of this job or None>)

The suspend signal only sets a flag. At the next `on_step_end` (an optimizer step: the end of a mini-batch, or of
`gradient_accumulation_steps` of them) the callback asks the Trainer to save (`control.should_save`): its own
`checkpoint-N` (model, optimizer, scheduler, scaler, trainer state, RNG states) goes to `hf/` in the job's
state directory. When the save is complete the callback writes `gandiva.json` into it (the job's identity and
counters; a checkpoint without it is incomplete and never resumed), keeps the two newest and exits 75
(`ExitCode.SUSPENDED`). `train()` resumes from the newest complete one; the Trainer then skips exactly the
mini-batches of the epoch already trained and restores the RNG states.

With several processes the ranks agree at every step end (an all-reduce MAX of the flag over gloo), so all stop
at the same step; each writes its part of the Trainer's checkpoint, and rank 0 writes `gandiva.json` once all
have (a barrier), after fsyncing the directory's files.

On the controller's park request the ranks park at the same `on_step_end` instead (job_wrapper.park: the
model's and optimizer's tensors to host memory, no CPU used, the same process goes on after the unpark); a
suspend signal while parked saves from host memory and exits 75.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from job_wrapper import checkpoint as ckpt
from job_wrapper._integration import Suspender

SUBDIR = "hf"
MARK = "gandiva.json"  # written last: its presence says the checkpoint directory is complete
KEEP = 2
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class GandivaTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """Suspend at a step boundary on the controller's signal through the Trainer's own save, exit 75; resume
    from the job's newest checkpoint in `train()`. Park in place on the controller's park request (the model's
    and optimizer's device state to host memory until the unpark). `state_dir`/`fast_exit`: as for `Session`."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, fast_exit: bool | None = None,
                 progress_interval: float | None = None) -> None:
        self.job = Suspender(state_dir, fast_exit=fast_exit, progress_interval=progress_interval)
        self.job.listen()  # now, not at train(): a signal during start-up (model build, data) waits for the flag
        self.checkpoints = self.job.files.root / SUBDIR
        self.resumed_from: Path | None = None
        self._suspending: str | None = None  # the user's output_dir while the suspend save goes to ours
        self._per_step = 0

    def _checkpoint_dirs(self) -> list[Path]:
        """The `checkpoint-N` directories, complete or not, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoints.iterdir() if (m := _CHECKPOINT.match(p.name))]
        return [p for _, p in sorted(found)]

    def _complete(self) -> list[Path]:
        """Complete checkpoint directories (with the marker), oldest first."""
        return [p for p in self._checkpoint_dirs() if (p / MARK).is_file()]

    def resume_path(self) -> Path | None:
        """The newest complete checkpoint of this job, or None."""
        done = self._complete()
        return done[-1] if done else None

    def _usable(self, path: Path) -> tuple[dict[str, Any] | None, str]:
        """`path`'s marker if the checkpoint can be resumed, else (None, why not)."""
        try:
            mark = json.loads((path / MARK).read_text())
            if not isinstance(mark, dict):
                return None, f"{MARK} is not a JSON object"
            int(mark["step"]), int(mark["samples"])
            for name, size in dict(mark.get("files", {})).items():
                if (path / name).stat().st_size != size:
                    return None, f"{name} is {(path / name).stat().st_size} bytes, {size} were written"
            json.loads((path / "trainer_state.json").read_text())
        except FileNotFoundError as exc:
            return None, f"{Path(exc.filename).name if exc.filename else 'a file'} is missing"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"unreadable ({type(exc).__name__}: {exc})"
        return mark, ""

    def _choose(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest resumable checkpoint and its marker (rank 0 decides; a damaged newer one is set aside as
        `checkpoint-N.corrupt` with one line, an incomplete one is skipped with one), or None to start fresh."""
        skipped: list[str] = []
        for path in reversed(self._checkpoint_dirs()):
            if not (path / MARK).is_file():
                skipped.append(path.name)
                self.job.warn(f"{path} is incomplete (no {MARK}): skipped", path=str(path))
                continue
            mark, why = self._usable(path)
            if mark is not None:
                return path, mark
            skipped.append(path.name)
            aside = path.with_name(path.name + ".corrupt")
            self.job.warn(f"{path} is damaged ({why}): set aside as {aside.name}", path=str(path))
            shutil.rmtree(aside, ignore_errors=True)
            with contextlib.suppress(OSError):  # else it stays, still damaged, and is skipped again
                path.rename(aside)
        if skipped:
            self.job.warn(f"no complete checkpoint in {self.checkpoints}: training starts from the beginning")
        return None

    def train(self, trainer: Trainer, **kwargs: Any) -> Any:
        """`trainer.train(**kwargs)`, resuming from this job's newest checkpoint when there is one (a first run
        just starts, or resumes from the `resume_from_checkpoint` you pass); exits 75 when suspended. A newest
        checkpoint that is incomplete or damaged is skipped (one line each): the one before, or a fresh start."""
        # The Trainer initialised torch.distributed (from the wrapper's RANK/WORLD_SIZE) when it was built.
        self.job.connect_ranks()
        choice = self.job.broadcast(self._choose() if self.job.rank == 0 else None)
        if choice is not None:
            path, mark = choice
            try:
                ckpt.check_identity(mark, self.job.identity, str(path), self.job.files.root)
            except ckpt.CheckpointError as exc:
                self.job.fail(str(exc))
            self.job.step, self.job.samples = int(mark["step"]), int(mark["samples"])
            kwargs["resume_from_checkpoint"] = str(path)
            self.resumed_from = path
            self.job.event("resumed", path=str(path), step=self.job.step)
        try:
            out = trainer.train(**kwargs)
        finally:
            self.job.stop_listening()
        self.job.event("training_done", step=self.job.step, samples=self.job.samples)
        self.job.close("done")
        return out

    # -- hooks ---------------------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self._per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        if state.max_steps > 0:
            self.job.total_samples = state.max_steps * self._per_step
        self.job.connect_ranks()
        self.job.start_progress()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.job.batch_done(self._per_step)
        self.job.epoch = int(state.epoch or 0)
        stop, seq = self.job.boundary()
        if seq and not stop:
            stop = not self.job.park(seq, _device_state(kwargs))
        if stop and self._suspending is None:
            self.job.event("stop_requested", step=self.job.step)
            # The Trainer saves into args.output_dir: point it at the state directory for this one save.
            self._suspending = args.output_dir
            args.output_dir = str(self.checkpoints)
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self._suspending is None:
            return
        args.output_dir, self._suspending = self._suspending, None
        path = self.checkpoints / f"checkpoint-{state.global_step}"
        self.job.barrier()  # every rank has written its part (rng_state_<rank>.pth)
        if state.is_world_process_zero:
            files = _fsync_tree(path)
            mark = {"job": self.job.identity, "step": self.job.step, "samples": self.job.samples,
                    "global_step": state.global_step, "world_size": args.world_size, "files": files}
            tmp = path / f"{MARK}.tmp"
            tmp.write_text(json.dumps(mark))
            self.job.fsync_replace(tmp, path / MARK, path / f"{MARK}.prev")
            for old in self._complete()[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
            self.job.event("checkpoint", reason="suspend", step=self.job.step, path=str(path))
        self.job.exit_suspended()


def _device_state(kwargs: dict[str, Any]) -> list[Any]:
    """What holds the Trainer's device state, from a callback's arguments: its model (DDP's wrapper shares its
    tensors) and optimizer, and the optimizer that accelerate's wrapper holds (its `state` is that one's)."""
    found = [kwargs.get("model"), kwargs.get("optimizer")]
    inner = getattr(found[1], "optimizer", None)
    return [o for o in (*found, inner) if o is not None]


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file under `root` and the directories; returns {relative path: size}."""
    sizes: dict[str, int] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(MARK):
                continue
            p = Path(dirpath) / name
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                sizes[str(p.relative_to(root))] = os.fstat(fd).st_size
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return sizes
