"""PNG plots of simulation runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_gandiva.sim.engine import SimResult


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_jct_cdf(results: Sequence[SimResult], path: Path) -> Path:
    """CDF of job completion times, one line per run (log time axis)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for res in results:
        jct = sorted(j.jct / 3600.0 for j in res.finished if j.jct is not None)
        if not jct:
            continue
        ys = [(i + 1) / len(jct) for i in range(len(jct))]
        ax.step(jct, ys, where="post", label=res.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT CDF: {results[0].trace if results else ''}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_timeline(result: SimResult, path: Path) -> Path:
    """GPU utilisation and queue length over time for one run."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    ts = [s.time / 3600.0 for s in result.samples]
    ax1.step(ts, [100.0 * s.gpus_busy / result.total_gpus for s in result.samples], where="post")
    ax1.set_ylabel("GPUs busy (%)")
    ax1.set_ylim(0, 105)
    ax1.grid(True, alpha=0.3)
    ax2.step(ts, [s.waiting for s in result.samples], where="post", color="tab:red", label="waiting")
    ax2.step(ts, [s.running for s in result.samples], where="post", color="tab:green", label="running")
    ax2.set_ylabel("jobs")
    ax2.set_xlabel("time (h)")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    ax1.set_title(f"{result.policy} on {result.trace}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
