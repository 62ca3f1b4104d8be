"""Per-step cost of the ranks' agreement (`Suspender.agree`: an asynchronous all-reduce MAX of one int over
gloo), 2 ranks (results in
benchmarks/results/wrapper_frameworks.txt). Run under the wrapper:

    gandiva-wrapper --state-dir /tmp/agree --nprocs 2 -- python benchmarks/bench_agreement.py [STEPS RUNS MS]

Steps of MS ms (time.sleep, standing for GPU time: the CPU is free meanwhile) that end with a blocking all-reduce
of 1,000 floats on the default group (standing for DDP's gradient sync, which already makes every step wait for
the slowest rank), without and with agree(); the time spent inside agree() itself; and agree() back to back (no
step: the all-reduce's whole latency). Rank 0 prints the medians."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import job_wrapper
from job_wrapper._integration import Suspender


def main() -> int:
    steps, runs, ms = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])) if len(sys.argv) > 3 else (1000, 5, 1.0)
    torch.set_num_threads(1)
    rank, _ = job_wrapper.init_distributed()
    job = Suspender(fast_exit=False, progress_interval=60)
    assert job.connect_ranks(), "run it with 2 ranks: gandiva-wrapper --nprocs 2"
    grads = torch.zeros(1000)
    step_s = ms / 1000
    inside: list[float] = []

    def ddp() -> None:
        time.sleep(step_s)
        dist.all_reduce(grads)

    def ddp_agree() -> None:
        ddp()
        t0 = time.perf_counter()
        job.agree(False)
        inside.append(time.perf_counter() - t0)

    def back_to_back() -> None:
        job.agree(False)

    cases: dict[str, Callable[[], None]] = {"ddp": ddp, "ddp_agree": ddp_agree, "back_to_back": back_to_back}
    res: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            job.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            res[name].append((time.perf_counter() - t0) / steps * 1e6)
    if rank == 0:
        m = {k: statistics.median(v) for k, v in res.items()}
        print(f"2 ranks, {steps} steps of {ms:g} ms x {runs} runs, median us/step: step + gradient all-reduce "
              f"{m['ddp']:.0f}; with agree() {m['ddp_agree']:.0f} ({m['ddp_agree'] - m['ddp']:+.0f}); inside agree() "
              f"{statistics.median(inside) * 1e6:.0f}; agree() back to back {m['back_to_back']:.0f}", flush=True)
    job.close("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
