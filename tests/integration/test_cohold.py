"""The controller drives co-held GPUs on the real local Slurm (issue 31, items 2 and 6): with `co_hold = yes`, two
one-GPU jobs time-sliced on one GPU each hold a shard of it, and Gandiva's rotations between them are parks and
unparks (no requeue, no new process). The controller is killed with kill -9 between a park and the unpark that
follows it, and the next one finishes the unpark from the store. Both jobs end with the parameters of an
uninterrupted run, their own event logs show they never computed at once, and Slurm never has the GPU held by
more jobs than it has shards. 22.05 (no switching a held job between shards and whole GPUs) keeps the requeue
path: the capabilities say so and co_hold stays off there.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import pytest

from slurm_gandiva.plan import Action
from slurm_gandiva.requeue.contract import JobFiles
from slurm_gandiva.slurm.base import SlurmBackend
from slurm_gandiva.store import Outcome
from tests.integration.test_controller import (
    EnvFactory,
    GpuWatch,
    all_finished,
    env_factory,  # noqa: F401 - the fixture
    final_hash,
    reference_hash,
    start_reference,
    states,
    store_settled,
    submit,
    wait_for,
)
from tests.integration.test_parking import computing, events

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

QUANTUM, STEPS, SLEEP = 1.5, 560, 0.05  # 28 s of training each: rotations every ~6 s (~12 s at quantum 3)
TURNS = 4


def test_controller_rotates_two_jobs_on_one_gpu_in_place_and_recovers_between_park_and_unpark(
    env_factory: EnvFactory,  # noqa: F811
    test_user: str,
    tmp_path: Path,
    slurm: SlurmBackend,
) -> None:
    caps = slurm.capabilities()
    if not caps.packing:  # 22.05: no shards to co-hold with; the controller keeps the requeue path
        assert not caps.gres_kind_switch and caps.release < (23, 2, 0), caps.describe()
        return
    env = env_factory({"n1": (0,)}, quantum=QUANTUM)
    env.conf.write_text(env.conf.read_text().replace("[policy]", "co_hold = yes\n[policy]"))
    start_reference(tmp_path, STEPS)
    with GpuWatch(slurm, env.jobs) as watch:
        env.start(crash_at="unpark:intent")  # dies at its first unpark, after the park before it
        for _ in range(2):
            submit(env, test_user, steps=STEPS, sleep=SLEEP)
        assert env.proc is not None
        code = env.proc.wait(timeout=240)
        assert code == 137, f"the controller exited {code}, not at its crash point:\n{env.log_text()[-3000:]}"
        with contextlib.closing(env.store()) as store:
            open_intents = store.open_intents()
        assert [d.action for d in open_intents] == [Action.UNPARK], open_intents
        env.start()
        wait_for(lambda: all_finished(env), 300, "both jobs to finish")
        wait_for(lambda: store_settled(env), 30, "the controller to record both jobs as finished")
        assert env.stop() == 0, env.log_text()[-3000:]
    assert watch.samples > 10 and watch.conflicts == [], watch.conflicts
    assert set(states(env).values()) == {"COMPLETED"}
    ref = reference_hash(tmp_path, STEPS)
    for jid in env.jobs:
        assert final_hash(env, jid) == ref, f"job {jid}: parameters differ from the uninterrupted run"
    with contextlib.closing(env.store()) as store:
        assert store.open_intents() == ()
        done = [d for d in store.decisions() if d.job_id in env.jobs and d.outcome is Outcome.SUCCEEDED]
        kinds = {a: [d.job_id for d in done if d.action is a] for a in Action}
        assert not kinds[Action.SUSPEND], f"a rotation went the requeue path: {kinds[Action.SUSPEND]}"
        moved = kinds[Action.UNPACK] + kinds[Action.PACK] + kinds[Action.MIGRATE]
        assert not moved, f"a job on its shard was taken for packed and moved: {kinds}"
        for jid in env.jobs:
            assert kinds[Action.PARK].count(jid) >= TURNS - 1, (jid, kinds)
            slices = store.slices(job_ids=[jid])
            assert len(slices) >= TURNS, f"job {jid} had {len(slices)} turns"
        recovered = [e for e in store.events() if e.kind == "reconcile-finished-unpark"]
        assert recovered, "the restarted controller did not finish the unpark the crash cut short"
    files = [JobFiles(env.cluster.jobs_dir / jid) for jid in env.jobs]
    for f in files:
        restarts = [e for e in events(f) if e["event"] in ("resumed", "checkpoint")]
        assert not restarts, f"{f.root}: the job was requeued: {restarts}"
    spans = []
    for f in files:
        evs = events(f)
        start = min(float(str(e["time"])) for e in evs if e["event"] == "fresh_start")
        end = max(float(str(e["time"])) for e in evs if e["event"] == "training_done")
        spans.append(computing(f, start, end))
    overlap = [(x, y) for x, y in itertools.product(spans[0], spans[1]) if min(x[1], y[1]) > max(x[0], y[0])]
    assert not overlap, f"both jobs computed at once: {overlap}"
