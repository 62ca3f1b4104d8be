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
"""

from __future__ import annotations

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
    from the job's newest checkpoint in `train()`. `state_dir`/`fast_exit`: as for `Session`."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, fast_exit: bool | None = None,
                 progress_interval: float | None = None) -> None:
        self.job = Suspender(state_dir, fast_exit=fast_exit, progress_interval=progress_interval)
        self.job.listen()  # now, not at train(): a signal during start-up (model build, data) waits for the flag
        self.checkpoints = self.job.files.root / SUBDIR
        self.resumed_from: Path | None = None
        self._suspending: str | None = None  # the user's output_dir while the suspend save goes to ours
        self._per_step = 0

    def _complete(self) -> list[Path]:
        """Complete checkpoint directories, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoints.iterdir()
                 if (m := _CHECKPOINT.match(p.name)) and (p / MARK).is_file()]
        return [p for _, p in sorted(found)]

    def resume_path(self) -> Path | None:
        """The newest complete checkpoint of this job, or None."""
        done = self._complete()
        return done[-1] if done else None

    def train(self, trainer: Trainer, **kwargs: Any) -> Any:
        """`trainer.train(**kwargs)`, resuming from this job's newest checkpoint when there is one (a first run
        just starts, or resumes from the `resume_from_checkpoint` you pass); exits 75 when suspended."""
        path = self.resume_path()
        if path is not None:
            try:
                mark = json.loads((path / MARK).read_text())
                ckpt.check_identity(mark, self.job.identity, str(path), self.job.files.root)
            except (OSError, ValueError) as exc:
                self.job.fail(f"{path / MARK} is unreadable ({exc}): delete {path} to resume from the one before")
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
        self.job.start_progress()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.job.batch_done(self._per_step)
        self.job.epoch = int(state.epoch or 0)
        if self.job.flag and self._suspending is None:
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
        if state.is_world_process_zero:
            mark = {"job": self.job.identity, "step": self.job.step, "samples": self.job.samples,
                    "global_step": state.global_step}
            tmp = path / f"{MARK}.tmp"
            tmp.write_text(json.dumps(mark))
            self.job.fsync_replace(tmp, path / MARK, path / f"{MARK}.prev")
            for old in self._complete()[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
            self.job.event("checkpoint", reason="suspend", step=self.job.step, path=str(path))
        self.job.exit_suspended()
