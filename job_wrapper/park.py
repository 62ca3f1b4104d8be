"""Parking a training process in place: its device state to host memory and back, and the CPU-free wait.

The protocol (request file, signal, progress report) is in slurm_gandiva.requeue.contract; the Session
drives it (job_wrapper.api). Every tensor is moved by replacing its `.data` (as `Module.to` does), so the
Parameters, buffers and optimizer-state tensors keep their identity: the optimizer, DDP's parameter and
buffer lists and the user's own references stay valid, and the values are copied exactly (bit-identical
after the round trip). On the CPU nothing moves; the protocol runs the same.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from job_wrapper.progress import append_event
from slurm_gandiva.requeue.contract import JobFiles, ParkRequest, ParkRequestError, read_park_request

if TYPE_CHECKING:
    from job_wrapper.agree import StopAgreement
    from job_wrapper.progress import ProgressReporter

PARK_RECHECK_S = 30.0  # a parked rank re-reads the request this often even without a signal (a lost signal)


def _tensors(objects: Iterable[Any]) -> Iterator[Any]:
    """Every tensor of the model (parameters, their gradients, buffers) and the optimizers' state, once."""
    import torch

    seen: set[int] = set()

    def once(t: Any) -> bool:
        if not isinstance(t, torch.Tensor) or id(t) in seen:
            return False
        seen.add(id(t))
        return True

    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                if once(p):
                    yield p
                if p.grad is not None and once(p.grad):
                    yield p.grad
            for b in obj.buffers():
                if once(b):
                    yield b
        state = getattr(obj, "state", None)  # torch.optim.Optimizer: {param: {name: tensor}}
        if isinstance(obj, torch.optim.Optimizer) and isinstance(state, dict):
            for per_param in state.values():
                if isinstance(per_param, dict):
                    for t in per_param.values():
                        if once(t):
                            yield t


@dataclass
class Parked:
    """What `to_host` moved: each tensor and the device it came from."""

    moved: list[tuple[Any, Any]] = field(default_factory=list)  # (tensor, original device)
    nbytes: int = 0  # bytes of all the state (moved or already on the host)
    device_bytes: int = 0  # of them, bytes that were on a device

    def restore(self) -> None:
        """Move every tensor back to its device; waits for the copies."""
        import torch

        cuda = False
        for t, device in self.moved:
            t.data = t.data.to(device, non_blocking=True)
            cuda = cuda or device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        self.moved.clear()


def device_bytes(objects: Iterable[Any]) -> int:
    """Bytes of the state of `objects` that lives on a device (what `to_host` would move)."""
    return sum(t.numel() * t.element_size() for t in _tensors(objects) if t.device.type != "cpu")


def host_room() -> int | None:
    """Bytes this process may still take in host memory: the tightest cgroup v2 memory limit over it less
    what that cgroup uses (Slurm's --mem where the site constrains RAM), else the node's MemAvailable; None
    when neither can be read."""
    rooms: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if not line.startswith("0::"):
                continue
            d = CGROUP_ROOT / line[3:].strip().lstrip("/")
            while d != CGROUP_ROOT and CGROUP_ROOT in d.parents:
                with contextlib.suppress(OSError, ValueError):
                    limit = (d / "memory.max").read_text().strip()
                    if limit != "max":
                        rooms.append(int(limit) - int((d / "memory.current").read_text()))
                d = d.parent
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                rooms.append(int(line.split()[1]) * 1024)
    return min(rooms) if rooms else None


CGROUP_ROOT = Path("/sys/fs/cgroup")
PARK_MARGIN = 0.9  # a park takes at most this share of the host memory left (the rest: what the job allocates)


def to_host(objects: Iterable[Any]) -> Parked:
    """Move the device tensors of `objects` (modules, optimizers) to host memory (pinned where CUDA is: its
    caching host allocator keeps the buffers for the next park), then release the device's cached memory."""
    import torch

    parked = Parked()
    tensors = list(_tensors(objects))
    cuda = False
    for t in tensors:
        size = t.numel() * t.element_size()
        parked.nbytes += size
        if t.device.type == "cpu":
            continue
        parked.device_bytes += size
        pin = t.device.type == "cuda"
        host = torch.empty_like(t.data, device="cpu", pin_memory=pin)
        host.copy_(t.data, non_blocking=pin)
        parked.moved.append((t, t.device))
        t.data = host
        cuda = cuda or pin
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return parked


def _device_reserved() -> dict[str, int]:
    """{"device_reserved": bytes torch's CUDA allocator still holds} where CUDA is in use, else {}."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
        return {}
    return {"device_reserved": int(torch.cuda.memory_reserved())}


def wait_for(ready: Callable[[], Any], recheck_s: float = PARK_RECHECK_S) -> Any:
    """Block, using no CPU, until `ready()` returns something other than None; returns it.

    `ready` is called first, after every signal that has a Python handler (the handlers run first, in this
    thread; Python's C-level handler writes to the wakeup pipe from whichever thread the kernel picked, so a
    signal that lands on one of torch's threads still wakes this one: a sigtimedwait would miss it), and
    every `recheck_s` seconds. Main thread only.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        while True:
            got = ready()
            if got is not None:
                return got
            readable, _, _ = select.select([r], [], [], recheck_s)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(r, 4096)
    finally:
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)


class ParkControl:
    """One rank's side of park/unpark (the Session holds one): the signal flag, the request it accepts
    (`contract.read_park_request`: root's file, of this job, a seq not yet handled), the park itself."""

    def __init__(self, files: JobFiles, rank: int, *, owner: int = 0, job_id: str | None = None) -> None:
        self.files = files
        self.rank = rank
        self.owner = owner
        self.job_id = job_id if job_id is not None else (os.environ.get("SLURM_JOB_ID") or None)
        self.signalled = False  # set by the park signal's handler; the only thing it does
        self.handled = 0  # seq of the last request acted on (or found void)
        self.parked = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def read(self) -> ParkRequest | None:
        """The request in the job's file, None when there is none or it is refused (a `park_refused` event)."""
        try:
            return read_park_request(self.files.park_request, owner=self.owner, job_id=self.job_id)
        except ParkRequestError as exc:
            append_event(self.files.events, "park_refused", rank=self.rank, reason=str(exc))
            return None

    def wanted(self, step: int) -> int:
        """At a boundary: the seq of a new park request when the signal came (0 otherwise). An unpark request
        that finds the job running is a no-op (recorded as handled)."""
        if not self.signalled:
            return 0
        self.signalled = False
        req = self.read()
        if req is None or req.seq <= self.handled:
            return 0
        if req.action == "unpark":
            self.handled = req.seq
            append_event(self.files.events, "unpark_ignored", rank=self.rank, seq=req.seq, step=step,
                         reason="not parked")
            return 0
        return req.seq

    def park(
        self,
        seq: int,
        step: int,
        objects: Iterable[Any],
        *,
        total_bytes: Callable[[int], int],
        on_parked: Callable[[int, int], None],
        on_unparked: Callable[[int], None],
        suspend_requested: Callable[[], bool],
    ) -> bool:
        """Park on request `seq` at this boundary: device state to host, report, wait for an unpark request
        of a later seq (True: state back on its devices) or a suspend signal (False: state left on the host,
        for the caller to checkpoint). `total_bytes(mine)` sums the ranks' bytes (a collective),
        `on_parked(bytes, seq)` / `on_unparked(seq)` report (rank 0's progress).

        A park whose device state would not fit the host memory left to the job (`host_room`, shared by the
        node's ranks) is declined by every rank alike: False at once, for the caller to checkpoint and leave
        by the requeue path (the controller then takes it off its co-held GPUs), not an out-of-memory kill."""
        t0 = time.monotonic()
        self.handled = seq
        objects = list(objects)
        need, room = device_bytes(objects), host_room()
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        declines = total_bytes(int(bool(need) and room is not None and need > PARK_MARGIN * room / local))
        if declines:
            if self.rank == 0:
                append_event(self.files.events, "park_declined", step=step, seq=seq, device_bytes=need,
                             host_room=room, ranks_declining=declines)
            return False
        held = to_host(objects)
        total = total_bytes(held.nbytes)
        self.parked = True
        # The event before the report: the controller freezes (SIGSTOP) the job once it reads "parked", and an
        # event written after that would carry the time of the thaw, a park that seems to end turns later.
        if self.rank == 0:
            append_event(self.files.events, "parked", step=step, seq=seq, bytes=total, device_bytes=held.device_bytes,
                         seconds=round(time.monotonic() - t0, 6), **_device_reserved())
        on_parked(total, seq)

        def woken() -> str | int | None:
            if suspend_requested():
                return "suspend"
            self.signalled = False
            req = self.read()
            if req is not None and req.action == "unpark" and req.seq > seq:
                return req.seq
            return None

        got = wait_for(woken)
        if got == "suspend":
            if self.rank == 0:
                append_event(self.files.events, "suspend_while_parked", step=step, seq=seq)
            return False
        assert isinstance(got, int)
        t1 = time.monotonic()
        held.restore()
        self.handled = got
        self.parked = False
        on_unparked(got)
        if self.rank == 0:
            append_event(self.files.events, "unparked", step=step, seq=got, parked_s=round(t1 - t0, 6),
                         seconds=round(time.monotonic() - t1, 6))
        return True

    def park_ranks(
        self,
        seq: int,
        step: int,
        objects: Iterable[Any],
        *,
        agreement: StopAgreement | None,
        progress: ProgressReporter | None,
        suspend_requested: Callable[[], bool],
    ) -> bool:
        """`park` for one of a job's ranks (Session and the framework integrations): the bytes summed over
        `agreement` (None: a single process), "parked"/"running" reported in `progress` (rank 0's, else None)."""

        def total_bytes(mine: int) -> int:
            return mine if agreement is None else sum(agreement.gather(mine))

        def on_parked(nbytes: int, seq: int) -> None:
            if progress is not None:
                progress.park(nbytes, seq)

        def on_unparked(seq: int) -> None:
            if progress is not None:
                progress.unpark(seq)

        return self.park(seq, step, objects, total_bytes=total_bytes, on_parked=on_parked, on_unparked=on_unparked,
                         suspend_requested=suspend_requested)
