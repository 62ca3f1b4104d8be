"""The `slurm` baseline (backfilling FIFO) in the simulator against strict FIFO, on a trace where backfill
matters: a short job fills the GPUs held for a big one, a long one may not."""

from __future__ import annotations

import pytest

from slurm_gandiva.selector import make_policy
from slurm_gandiva.sim.engine import Overheads, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob

CFG = SimConfig(nodes=1, gpus_per_node=4, overheads=Overheads(start=0, suspend=0, resume=0))
# `big` waits for `wide` (t=1000); `short` (ends t=502) fits before that on the idle GPUs, `long` does
# not and would hold a GPU `big` needs.
TRACE = Trace(
    "backfill",
    (
        TraceJob("wide", 0.0, 1000.0, 2, model="cifar10"),
        TraceJob("big", 1.0, 100.0, 4, model="cifar10"),
        TraceJob("short", 2.0, 500.0, 1, model="cifar10"),
        TraceJob("long", 3.0, 2000.0, 1, model="cifar10"),
    ),
)


def run(name: str, **params: object) -> SimResult:
    return Simulator(TRACE, make_policy(name, **params), CFG).run()


def starts(res: SimResult) -> dict[str, float | None]:
    return {j.job_id: j.first_start for j in res.jobs}


def avg_jct(res: SimResult) -> float:
    jcts = [j.jct for j in res.jobs]
    assert all(x is not None for x in jcts)
    return sum(x for x in jcts if x is not None) / len(jcts)


def test_slurm_backfills_without_delaying_the_head_and_beats_strict_fifo() -> None:
    fifo, slurm, greedy = run("fifo"), run("slurm"), run("fifo", backfill=True)
    s, f = starts(slurm), starts(fifo)
    assert s["short"] == pytest.approx(2.0) and f["short"] == pytest.approx(1100.0, rel=0.01)
    assert s["big"] == pytest.approx(f["big"]) == pytest.approx(1000.0, rel=0.01)  # the head is not delayed
    assert s["long"] == pytest.approx(f["long"])  # it would have delayed `big`: it waits as under FIFO
    assert starts(greedy)["long"] == pytest.approx(3.0)  # backfill without reservations starts it...
    assert starts(greedy)["big"] > 2000.0  # type: ignore[operator]  # ...and `big` waits for it
    assert avg_jct(slurm) < avg_jct(fifo)
    assert avg_jct(slurm) == pytest.approx(avg_jct(fifo) - (1100.0 - 2.0) / 4, rel=0.01)  # only `short` gains
