"""Rank agreement on when to stop: every rank stops at the same mini-batch boundary, on one node or many.

The suspend signal reaches the ranks at different steps (it is forwarded node by node, process by process),
and a rank that stopped alone would leave the others hanging in their next collective. So each boundary
starts an all-reduce MAX of "stop" over a gloo group of its own: a CPU collective even when training uses
NCCL (a GPU tensor's .item() would wait for the GPU at every step), never queued behind DDP's gradient
all-reduces. It is asynchronous: it runs during the next step, and the ranks stop one boundary after the
first that any of them flagged. torch is imported only when there are ranks to connect.

Gloo groups are destroyed before the interpreter tears down (ours at `close`, the default one at exit): a gloo
group left to the teardown can abort the process after training has ended ("terminate called without an active
exception", pytorch/pytorch#190489), and the job would end FAILED. Hugging Face's Trainer and Lightning never
destroy the group they create.
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Any


class StopAgreement:
    """The per-boundary agreement of a job's ranks (see the module). Every rank must create it at the same
    point (`connect`), then call `agree` at every boundary and `close` once at the end."""

    def __init__(self, group: Any, buf: Any) -> None:
        self._group = group
        self._buf = buf
        self._work: Any = None  # the all-reduce in flight

    @classmethod
    def connect(cls) -> StopAgreement | None:
        """The agreement of the ranks of torch.distributed's default group; None for a single process (or
        when torch.distributed is not initialised). A collective: it creates a process group."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        atexit.unregister(destroy_gloo_default_group)  # registered once, however many agreements
        atexit.register(destroy_gloo_default_group)
        return cls.on(dist.new_group(backend="gloo"))

    @classmethod
    def on(cls, group: Any) -> StopAgreement:
        """The agreement over `group` (a gloo group of the ranks), with its buffer: (stop, park seq)."""
        import torch

        return cls(group, torch.zeros(2, dtype=torch.int64))

    def agree(self, stop: bool) -> bool:
        """Whether the ranks stop at this boundary; every rank gets the same answer (the previous boundary's
        MAX of `stop`). A collective: every rank calls it at every boundary."""
        return self.decide(stop, 0)[0]

    def decide(self, stop: bool, park_seq: int) -> tuple[bool, int]:
        """`agree` carrying a park request too: (stop, park seq) as the previous boundary's MAX over the ranks
        of (`stop`, `park_seq`); park seq 0 when no rank asked. A collective, at every boundary."""
        import torch.distributed as dist

        buf = self._buf
        if self._work is not None:
            self._work.wait()
            self._work = None
            stop_all, seq_all = int(buf[0]), int(buf[1])
            if stop_all or seq_all:
                buf.zero_()  # a decision is acted on once; the next boundary starts a fresh round
                return bool(stop_all), seq_all
        buf[0], buf[1] = int(stop), park_seq
        self._work = dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return False, 0

    def barrier(self) -> None:
        """Wait for every rank."""
        import torch.distributed as dist

        dist.barrier(group=self._group)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value, group=self._group)
        return out

    def close(self) -> None:
        """Finish the all-reduce in flight (every rank started it, so it completes), then destroy the group (a
        local step for gloo)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._group is not None:
            import torch.distributed as dist

            with contextlib.suppress(ValueError, RuntimeError):  # gone already: the default group was destroyed
                dist.destroy_process_group(self._group)
            self._group = None


def destroy_gloo_default_group() -> None:
    """At exit: destroy torch.distributed's default group when it is gloo and still there (see the module).
    NCCL's is left alone: its teardown is collective in some NCCL versions, and a rank exiting alone would hang."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        with contextlib.suppress(ValueError, RuntimeError):
            dist.destroy_process_group()
