"""Reporting from inside the job: the event log (events.jsonl) and progress.json."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gandiva.requeue.contract import FILE_MODE, Progress, write_progress


def append_event(log: Path, event: str, /, **fields: Any) -> None:
    """Append one JSON line; one O_APPEND write per line, so writers in several processes do not interleave."""
    record = {"event": event, "time": time.time(), "pid": os.getpid(), **fields}
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete lines of an event log (for tests and tools)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


@dataclass(frozen=True)
class Counters:
    """A snapshot of the training loop's counters."""

    step: int
    epoch: int
    samples: int
    total_samples: int | None


class ProgressReporter:
    """Writes progress.json every `interval` seconds from a daemon thread, and once more at stop().

    The training loop only bumps counters; timing is measured here between reports, so the loop itself
    never reads a clock.
    """

    def __init__(
        self,
        path: Path,
        counters: Callable[[], Counters],
        *,
        world_size: int,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        smoothing: float = 0.3,
    ) -> None:
        self.path = path
        self._counters = counters
        self._world_size = world_size
        self._interval = interval
        self._clock = clock
        self._wall = wall_clock
        self._alpha = smoothing
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last: tuple[float, int, int] | None = None  # (clock, step, samples) at the last report
        self._measuring = False
        self._batch_time = 0.0
        self._rate = 0.0
        self._started = wall_clock()  # made after the restore: this incarnation's training starts now
        self._state = "running"
        self._parked_bytes: int | None = None
        self._request_seq: int | None = None

    def start(self) -> None:
        self.report()
        self._thread = threading.Thread(target=self._run, name="gandiva-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            # A full or flaky filesystem must not kill training; the next report retries.
            with contextlib.suppress(OSError):
                self.report(self._state)

    def park(self, parked_bytes: int, request_seq: int) -> Progress:
        """Report "parked" and stop the reports (a parked process uses no CPU) until `unpark`."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._state, self._parked_bytes, self._request_seq = "parked", parked_bytes, request_seq
        return self.report(self._state)

    def unpark(self, request_seq: int) -> None:
        """Report "running" again and resume the reports; the parked time is not counted as batch time."""
        with self._lock:
            self._state, self._parked_bytes, self._request_seq = "running", None, request_seq
            self._last = None
        self._stop = threading.Event()
        self.start()

    def report(self, state: str = "running") -> Progress:
        """Measure since the last report and replace progress.json."""
        with self._lock:
            c = self._counters()
            now = self._clock()
            if self._last is None or (not self._measuring and c.step != self._last[1]):
                # Time up to the first step seen is start-up (imports, loading), not training: measure
                # from the first report that saw a step.
                self._measuring = self._last is not None
                self._last = (now, c.step, c.samples)
            elif self._measuring and c.step > self._last[1]:
                t, step, samples = self._last
                dt, dsteps = now - t, c.step - step
                if dt > 0:
                    bt, rate = dt / dsteps, (c.samples - samples) / dt
                    first = self._batch_time == 0.0
                    self._batch_time = bt if first else self._alpha * bt + (1 - self._alpha) * self._batch_time
                    self._rate = rate if first else self._alpha * rate + (1 - self._alpha) * self._rate
                self._last = (now, c.step, c.samples)
            prog = Progress(
                step=c.step,
                epoch=c.epoch,
                samples=c.samples,
                total_samples=c.total_samples,
                batch_time_avg=self._batch_time,
                samples_per_s=self._rate,
                world_size=self._world_size,
                updated=self._wall(),
                state=state,
                started=self._started,
                parked_bytes=self._parked_bytes if state == "parked" else None,
                request_seq=self._request_seq,
            )
            write_progress(self.path, prog)
            return prog

    def stop(self, state: str) -> Progress:
        """Stop the thread and write the final report with `state` ("suspended", "done", "failed")."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        return self.report(state)
