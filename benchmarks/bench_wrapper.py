"""Job-wrapper costs: per-mini-batch overhead of the API, and checkpoint time vs checkpoint size.

    .venv/bin/python benchmarks/bench_wrapper.py [--iters 2000000] [--sizes-mb 1,8,64] [--repeat 3]

Table 1: ns per loop iteration (CPU time of the loop's thread, so a loaded machine does not inflate it), a
bare Python loop as the baseline side by side (overhead = difference).
Table 2: gandiva checkpoint save (torch.save + sha256 + write + fsync + rename + keep previous) and load
(read + verify + torch.load) against a plain torch.save / torch.load of the same state (no fsync).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def per_iter_ns(fn: Callable[[int], None], iters: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.thread_time_ns()  # CPU time of this thread: other processes share this machine
        fn(iters)
        times.append((time.thread_time_ns() - t0) / iters)
    return min(times)


def bench_loop(iters: int, repeat: int) -> list[tuple[str, float]]:
    import torch

    from job_wrapper import Session

    tmp = Path(tempfile.mkdtemp(prefix="bench-wrapper-"))
    model = torch.nn.Linear(2, 2)
    job = Session(model, state_dir=tmp, progress_interval=3600)

    def bare(n: int) -> None:
        for _ in range(n):
            pass

    def flag(n: int) -> None:
        j = job
        for _ in range(n):
            if j._signalled:
                raise AssertionError

    def step(n: int) -> None:
        s = job.step
        for _ in range(n):
            s(1)

    rows = [("bare loop (baseline)", per_iter_ns(bare, iters, repeat)),
            ("flag check (attribute read)", per_iter_ns(flag, iters, repeat)),
            ("job.step(samples=1)", per_iter_ns(step, iters, repeat))]

    # The data iterator: gandiva's batches() (+ implicit step) against slicing the same permutation by hand.
    data = (torch.randn(4096, 8), torch.arange(4096))
    bs, epochs = 32, max(1, iters // 200_000)

    def manual(_: int) -> None:
        for e in range(epochs):
            order = torch.randperm(4096, generator=torch.Generator().manual_seed(e)).tolist()
            for i in range(0, 4096, bs):
                ix = torch.as_tensor(order[i : i + bs], dtype=torch.long)
                _batch = (data[0][ix], data[1][ix])

    def gandiva(_: int) -> None:
        j = Session(torch.nn.Linear(2, 2), state_dir=tmp / "it", progress_interval=3600,
                    install_signal_handler=False)
        for _b in j.batches(data, batch_size=bs, epochs=epochs):
            pass

    nb = epochs * (4096 // bs)
    rows.append(("per batch: manual randperm + index (baseline)", per_iter_ns(manual, 1, repeat) / nb))
    rows.append(("per batch: job.batches() + implicit step()", per_iter_ns(gandiva, 1, repeat) / nb))
    signal.signal(job.signal, signal.SIG_DFL)
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def bench_checkpoint(sizes_mb: list[float], repeat: int) -> list[tuple[float, float, float, float, float]]:
    import torch

    from job_wrapper import checkpoint as ckpt
    from slurm_gandiva.requeue.contract import JobFiles

    rows = []
    for mb in sizes_mb:
        n = int(mb * 2**20 / 4)
        w = torch.randn(n)
        state = {"model": {"w": w}, "step": 1}
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
            files = JobFiles(Path(d))
            plain = Path(d) / "plain.pt"
            save_t, base_t, load_t, base_load_t = [], [], [], []
            nbytes = 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                nbytes = ckpt.save(files, state).nbytes
                save_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                torch.save(state, plain)
                base_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                loaded = ckpt.load(files)
                load_t.append(time.perf_counter() - t0)
                assert loaded is not None and torch.equal(loaded.state["model"]["w"], w)
                t0 = time.perf_counter()
                torch.load(plain, weights_only=True)
                base_load_t.append(time.perf_counter() - t0)
            rows.append((nbytes / 2**20, statistics.median(save_t), statistics.median(base_t),
                         statistics.median(load_t), statistics.median(base_load_t)))
    return rows


def bench_suspend(nprocs: int) -> tuple[float, float, float]:
    """gandiva-wrapper running examples/train.py, no Slurm: signal -> checkpoint written -> wrapper exited (s)."""
    import subprocess
    import sys

    from job_wrapper.progress import read_events
    from slurm_gandiva.requeue.contract import JobFiles, read_progress

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="bench-suspend-") as d:
        files = JobFiles(Path(d))
        argv = [str(Path(sys.executable).with_name("gandiva-wrapper")), "--state-dir", d, "--nprocs", str(nprocs),
                "--progress-interval", "0.1", "--", sys.executable, str(root / "examples" / "train.py"),
                "--epochs", "1000", "--sleep-per-step", "0.02"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while (p := read_progress(files.progress)) is None or p.step < 20:
                time.sleep(0.02)
            t0 = time.time()
            proc.send_signal(signal.SIGUSR2)
            proc.wait(120)
            t_exit = time.time()
        finally:
            proc.kill()
        ev = {e["event"]: e for e in read_events(files.events)}
        t_ckpt = float(ev["checkpoint"]["time"])
        return t_ckpt - t0, float(ev["checkpoint"]["seconds"]), t_exit - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2_000_000)
    ap.add_argument("--sizes-mb", default="1,8,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-suspend", action="store_true", help="skip the signal -> exit runs (real processes)")
    args = ap.parse_args()
    os.environ.pop("GANDIVA_TEST_CHECKPOINT_PAUSE", None)

    rows = bench_loop(args.iters, args.repeat)
    base = rows[0][1]
    print(f"\nPer-iteration CPU cost ({args.iters:,} iterations, best of {args.repeat})")
    print(f"{'loop':<48} {'ns/iter':>10} {'overhead ns':>12} {'x bare loop':>12}")
    for name, ns in rows[:3]:
        print(f"{name:<48} {ns:>10.1f} {ns - base:>12.1f} {ns / base:>12.2f}")
    (mname, mns), (gname, gns) = rows[3], rows[4]
    print(f"{mname:<48} {mns:>10.1f} {'':>12} {1.0:>12.2f}")
    print(f"{gname:<48} {gns:>10.1f} {gns - mns:>12.1f} {gns / mns:>12.2f}")

    sizes = [float(s) for s in args.sizes_mb.split(",") if s]
    print(f"\nCheckpoint wall time vs size (median of {args.repeat}; baseline: torch.save/torch.load, no fsync)")
    print(f"{'size MB':>8} {'save s':>8} {'torch.save s':>13} {'ratio':>6} {'save MB/s':>10} "
          f"{'load s':>8} {'torch.load s':>13} {'ratio':>6}")
    for mb, s, bs, ld, bl in bench_checkpoint(sizes, args.repeat):
        print(f"{mb:>8.1f} {s:>8.3f} {bs:>13.3f} {s / bs:>6.2f} {mb / s:>10.0f} {ld:>8.3f} {bl:>13.3f} {ld / bl:>6.2f}")

    if not args.no_suspend:
        print("\nSuspend outside Slurm (examples/train.py, 0.02 s steps): wall seconds after the signal")
        print(f"{'processes':>9} {'checkpoint written':>19} {'of which write':>15} {'wrapper exited':>15}")
        for n in (1, 2):
            c, w, e = bench_suspend(n)
            print(f"{n:>9} {c:>19.3f} {w:>15.3f} {e:>15.3f}")


if __name__ == "__main__":
    main()

