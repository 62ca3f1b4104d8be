"""NVIDIA's CUDA checkpoint on a parked job (issue 31, item 1's measured option): does it free the CUDA context too?

A parked job (job_wrapper/park.py) keeps its CUDA context on the GPU: its state is in host memory and torch's
cache is emptied, but the context (and what torch still reserves) stays, several hundred MB per process. The
driver's checkpoint API (CUDA 12.8 on, driver 570 on: cuCheckpointProcessLock / Checkpoint / Restore / Unlock,
what NVIDIA's `cuda-checkpoint` tool calls) can move a process's whole GPU side to host memory from another
process. This runs examples/train.py under gandiva-wrapper on the GPU (size gpu1g, >= 1 GB of state), parks it,
then checkpoints its CUDA side from here and measures: the process's GPU memory before and after (nvidia-smi),
how long lock+checkpoint and restore+unlock take, and that the job trains on after restore and unpark.

    python3 benchmarks/bench_cuda_checkpoint.py [--json FILE]        (a GPU host; scripts/gpu_check.py check 7)

Not for NCCL jobs: the driver does not checkpoint NCCL communicators (DESIGN.md); the controller does not use it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_park import SIZES, TRAIN, WRAPPER, wait
from job_wrapper.progress import read_events
from slurm_gandiva.requeue.contract import PARK_SIGNAL, JobFiles, read_progress, write_park_request


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


def gpu_mib(pid: int) -> int | None:
    """The GPU memory (MiB) nvidia-smi lists for `pid`; None when it lists none."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    for line in out.splitlines():
        p, _, mib = line.partition(",")
        if p.strip() == str(pid):
            return int(mib.strip())
    return None


class Driver:
    """The driver's checkpoint entry points through ctypes (RuntimeError when this driver has none)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                     "cuCheckpointProcessUnlock"):
            if not hasattr(self.lib, name):
                raise RuntimeError(f"this driver has no {name} (CUDA 12.8 / driver 570 on)")
        self.call("cuInit", 0)

    def call(self, name: str, *args: Any) -> None:
        rc = int(getattr(self.lib, name)(*args))
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(msg))
            raise RuntimeError(f"{name}: {msg.value.decode() if msg.value else rc}")

    def checkpoint(self, pid: int) -> float:
        t = time.monotonic()
        self.call("cuCheckpointProcessLock", ctypes.c_int(pid), ctypes.byref(_LockArgs(10_000)))
        self.call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), ctypes.create_string_buffer(128))
        return time.monotonic() - t

    def restore(self, pid: int) -> float:
        t = time.monotonic()
        self.call("cuCheckpointProcessRestore", ctypes.c_int(pid), ctypes.create_string_buffer(128))
        self.call("cuCheckpointProcessUnlock", ctypes.c_int(pid), ctypes.create_string_buffer(128))
        return time.monotonic() - t


def measure(size: str = "gpu1g") -> dict[str, Any]:
    drv = Driver()
    dim, hidden = SIZES[size]
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        files = JobFiles(Path(tmp) / "state")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GANDIVA_"))}
        argv = [*WRAPPER, "--state-dir", str(files.root), "--nprocs", "1", "--progress-interval", "0.01", "--",
                sys.executable, str(TRAIN), "--epochs", "100000", "--samples", "256", "--batch-size", "16",
                "--dim", str(dim), "--hidden", str(hidden), "--device", "cuda", "--sleep-per-step", "0.02"]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            start = wait(lambda: next((e for e in read_events(files.events) if e["event"] == "start"), None))
            child = int(start["children"][0])
            wait(lambda: (p := read_progress(files.progress)) is not None and p.step >= 3)
            running_mib = gpu_mib(child)
            write_park_request(files.park_request, "park", 1, None)
            os.kill(proc.pid, PARK_SIGNAL)
            prog = wait(lambda: (p := read_progress(files.progress)) is not None and p.state == "parked" and p)
            time.sleep(0.5)
            parked_mib = gpu_mib(child)
            ckpt_s = drv.checkpoint(child)
            time.sleep(0.5)
            checkpointed_mib = gpu_mib(child)
            restore_s = drv.restore(child)
            restored_mib = gpu_mib(child)
            t = time.monotonic()
            write_park_request(files.park_request, "unpark", 2, None)
            os.kill(proc.pid, PARK_SIGNAL)
            wait(lambda at=prog.step: (p := read_progress(files.progress)) is not None and p.step > at + 2)
            trained_s = time.monotonic() - t
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()
    return {"size": size, "state_bytes": prog.parked_bytes, "gpu_mib_running": running_mib,
            "gpu_mib_parked": parked_mib, "gpu_mib_checkpointed": checkpointed_mib, "gpu_mib_restored": restored_mib,
            "lock_checkpoint_s": ckpt_s, "restore_unlock_s": restore_s, "unpark_to_3_steps_s": trained_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    try:
        r = measure()
    except (OSError, RuntimeError) as exc:
        print(f"bench_cuda_checkpoint: {exc} (a GPU host with NVIDIA's driver 570 or later is needed)", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
