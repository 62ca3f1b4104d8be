"""What the framework integrations (Lightning, Hugging Face) share with `Session`: the signal flag, the state
directory, progress.json, park/unpark in place (job_wrapper.park) and the exit into the held requeue. No
framework is imported here."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, NoReturn

from job_wrapper import checkpoint as ckpt
from job_wrapper.agree import StopAgreement
from job_wrapper.api import _local_state_dir, exit_suspended, rank_and_world_size
from job_wrapper.launcher import FAST_EXIT_ENV
from job_wrapper.park import ParkControl
from job_wrapper.progress import Counters, ProgressReporter, append_event
from slurm_gandiva.requeue.contract import (
    PARK_SIGNAL,
    PROGRESS_INTERVAL_ENV,
    SIGNAL_ENV,
    STATE_DIR_ENV,
    ExitCode,
    JobFiles,
    StateDirError,
    ensure_state_dir,
    job_files,
    replace_atomic,
    signal_from_name,
)


def open_state_dir(state_dir: str | os.PathLike[str] | None) -> JobFiles:
    """The job's files: `state_dir`, $GANDIVA_STATE_DIR, or ./gandiva-state outside Slurm (as `Session`)."""
    files = job_files(state_dir or os.environ.get(STATE_DIR_ENV) or _local_state_dir())
    try:
        if not files.root.parent.exists():
            files.root.parent.mkdir(parents=True, exist_ok=True)
        ensure_state_dir(files.root)
    except (StateDirError, OSError) as exc:
        why = exc if isinstance(exc, StateDirError) else f"cannot create {files.root}: {exc.strerror}"
        print(f"gandiva: {why}", file=sys.stderr, flush=True)
        raise SystemExit(int(ExitCode.FAILED)) from None
    return files


class Suspender:
    """The suspend signal as a flag (the handler does nothing else), progress.json, and the exits.

    `fast_exit` (default: on under gandiva-wrapper) ends a suspended process with os._exit after flushing;
    otherwise `exit_suspended` raises SystemExit(75), which a test can catch. The controller's park request
    (owned by `park_request_owner`, root) is read as `Session` reads it (`ParkControl`): see `boundary`.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        fast_exit: bool | None = None,
        progress_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        park_request_owner: int = 0,
    ) -> None:
        self.rank, self.world_size = rank_and_world_size()
        self.files = open_state_dir(state_dir)
        self.parking = ParkControl(self.files, self.rank, owner=park_request_owner)
        self.identity = ckpt.job_identity()
        self.signal = signal_from_name(os.environ.get(SIGNAL_ENV))
        self.flag = False
        self.step = 0  # mini-batches trained since the job first started (restored from the checkpoint)
        self.samples = 0  # global samples likewise
        self.epoch = 0
        self.total_samples: int | None = None
        self._fast_exit = os.environ.get(FAST_EXIT_ENV) == "1" if fast_exit is None else fast_exit
        self._interval = progress_interval if progress_interval is not None else float(
            os.environ.get(PROGRESS_INTERVAL_ENV, "5"))
        self._clock = clock
        self._progress: ProgressReporter | None = None
        self._listening = False
        self._agreement: StopAgreement | None = None  # once connect_ranks() found several ranks

    # -- the signal -----------------------------------------------------------------------------------

    @staticmethod
    def signal_number() -> signal.Signals:
        """The suspend signal the wrapper forwards ($GANDIVA_SIGNAL, USR2 by default)."""
        return signal_from_name(os.environ.get(SIGNAL_ENV))

    def listen(self) -> None:
        """Catch the suspend and park signals (flags only) and unblock them (the wrapper starts us with them
        blocked)."""
        if self._listening or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(self.signal, self._on_signal)
        signal.signal(PARK_SIGNAL, self.parking.on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {self.signal, PARK_SIGNAL})
        atexit.register(self.stop_listening)
        self._listening = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.flag = True

    def request_suspend(self) -> None:
        """Ask for a suspend at the next batch boundary, as the signal does."""
        self.flag = True

    def stop_listening(self) -> None:
        """Ignore the signal from now on: at interpreter teardown its default action would kill the process."""
        atexit.unregister(self.stop_listening)
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(self.signal) == self._on_signal:
                signal.signal(self.signal, signal.SIG_IGN)
            if signal.getsignal(PARK_SIGNAL) == self.parking.on_signal:
                signal.signal(PARK_SIGNAL, signal.SIG_DFL)  # ignored by default
        self._listening = False

    # -- agreement between ranks ---------------------------------------------------------------------------

    def connect_ranks(self) -> bool:
        """Prepare `agree()` once torch.distributed is initialised with more than one rank (every rank must call
        this, at the same point: it creates a process group). Returns whether the ranks must agree."""
        if self._agreement is None:
            self._agreement = StopAgreement.connect()
        return self._agreement is not None

    def agree(self, stop: bool) -> bool:
        """Whether the ranks stop at this boundary; every rank gets the same answer (`StopAgreement.agree`:
        one boundary after the first that any rank flagged). `stop` itself when the ranks are not connected.
        A collective: every rank calls it at every boundary."""
        return stop if self._agreement is None else self._agreement.agree(stop)

    def boundary(self) -> tuple[bool, int]:
        """At every batch boundary: (stop, park seq) as the ranks agree on them (`StopAgreement.decide`: the
        suspend flag, and a new park request read after the park signal); park seq 0 when there is none to act
        on. Without connected ranks, this process's own. A collective: every rank calls it at every boundary."""
        seq = self.parking.wanted(self.step)
        if self._agreement is None:
            return self.flag, seq
        stop, seq = self._agreement.decide(self.flag, seq)
        return stop, seq if seq > self.parking.handled else 0

    def park(self, seq: int, objects: Iterable[Any]) -> bool:
        """Park on request `seq` at this boundary (every rank at the same one, from `boundary`): the device
        state of `objects` (modules, optimizers) to host memory, no CPU used until the unpark request, then back
        (job_wrapper.park). True once unparked; False when the suspend signal came while parked: the state is
        still in host memory, for the caller to checkpoint before it exits."""
        return self.parking.park_ranks(seq, self.step, objects, agreement=self._agreement, progress=self._progress,
                                       suspend_requested=lambda: self.flag)

    def barrier(self) -> None:
        """Wait for every rank (no-op when the ranks are not connected)."""
        if self._agreement is not None:
            self._agreement.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (itself when the ranks are not connected)."""
        return value if self._agreement is None else self._agreement.broadcast(value)

    # -- progress -------------------------------------------------------------------------------------

    def _counters(self) -> Counters:
        return Counters(self.step, self.epoch, self.samples, self.total_samples)

    def start_progress(self) -> None:
        """Start progress.json (rank 0): mini-batch times and samples/s for the controller."""
        if self.rank == 0 and self._progress is None:
            self._progress = ProgressReporter(self.files.progress, self._counters, world_size=self.world_size,
                                              interval=self._interval, clock=self._clock)
            self._progress.start()

    def batch_done(self, samples: int) -> None:
        """One mini-batch of `samples` global samples trained (two additions: no clock, no system call)."""
        self.step += 1
        self.samples += samples

    def event(self, name: str, **fields: Any) -> None:
        if self.rank == 0:
            append_event(self.files.events, name, **fields)

    def warn(self, message: str, **fields: Any) -> None:
        """One line on stderr (rank 0) and a `warning` event."""
        if self.rank == 0:
            print(f"gandiva: {message}", file=sys.stderr, flush=True)
        self.event("warning", message=message, **fields)

    def close(self, state: str) -> None:
        if self._agreement is not None:
            self._agreement.close()
            self._agreement = None  # its group is gone; connecting again makes a new one
        self.stop_listening()
        if self._progress is not None:
            self._progress.stop(state)
            self._progress = None

    # -- exits ----------------------------------------------------------------------------------------

    def exit_suspended(self) -> NoReturn:
        self.close("suspended")
        exit_suspended(fast=self._fast_exit)

    def fail(self, message: str) -> NoReturn:
        self.event("error", message=message)
        print(f"gandiva: {message}", file=sys.stderr, flush=True)
        self.close("failed")
        raise SystemExit(int(ExitCode.FAILED))

    def fsync_replace(self, tmp: os.PathLike[str], final: os.PathLike[str], prev: os.PathLike[str]) -> None:
        """Make `tmp` durable, keep the current `final` as `prev`, then rename `tmp` over `final`."""
        replace_atomic(tmp, final, durable=True, keep=prev)


def batch_samples(batch: Any) -> int:
    """Samples in one process's mini-batch: the first dimension of its first tensor (0 when none is found)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 0
