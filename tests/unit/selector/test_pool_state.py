"""A pool that books the same placements as an earlier fresh pool reuses its state (`pool_state.Booked`):
it must behave exactly as one that booked them itself."""

from __future__ import annotations

from slurm_gandiva.model import Job, JobSpec, Topology
from slurm_gandiva.selector.common import Memo
from slurm_gandiva.selector.placement import GpuPool
from slurm_gandiva.selector.pool_state import booked_cache
from tests.helpers import gp

TOPO = Topology.uniform(4, 4, gpus_per_switch=2, sockets=2)
# two jobs whose shards share one GPU, a whole node, and a placement that collides with it (not booked)
BUSY = (
    gp("n1", 0, shared=True),
    gp("n1", 0, shared=True),
    gp("n2", 0, 1, 2, 3),
    gp("n2", 3),
    gp("n3", 1, 2),
)


def job(jid: str, gpus: int) -> Job:
    return Job(JobSpec(jid, "u", gpus, gpus, 0.0, total_work=1.0))


def state(pool: GpuPool) -> object:
    """Everything a pool's later answers depend on, orders included."""
    return (
        [(n, list(st.free), dict(st.sizes)) for n, st in pool._nodes.items()],
        sorted(pool._whole), list(pool._shards.items()),
        [(k, list(v)) for k, v in pool._index.items()], pool._keys, pool.free_count,
        pool.shard_slots(), [pool.find(job(f"j{k}", k), k) for k in (1, 2, 3, 4, 6)],
    )


def test_a_reused_booking_gives_the_same_pool_as_booking_afresh() -> None:
    memo = Memo()
    first = GpuPool(TOPO, memo)
    booked = first.book_many(BUSY)
    assert booked == [True, True, True, False, True]
    assert len(memo.per_topology(TOPO, booked_cache)) == 1
    again = GpuPool(TOPO, memo)
    assert again.book_many(BUSY) == booked
    assert state(again) == state(first) == state(_uncached())
    # the reused state is a copy: booking on one pool leaves the other and the cached state alone
    assert again.book(gp("n4", 0, 1))
    third = GpuPool(TOPO, memo)
    third.book_many(BUSY)
    assert state(third) == state(_uncached())


def _uncached() -> GpuPool:
    pool = GpuPool(TOPO)
    pool.book_many(BUSY)
    return pool


def test_only_a_fresh_pool_reuses_a_booking() -> None:
    memo = Memo()
    GpuPool(TOPO, memo).book_many(BUSY)
    used = GpuPool(TOPO, memo)
    assert used.find(job("big", 17), 17) is None  # remembered as failed: the pool is no longer fresh
    assert used.book_many(BUSY) == [True, True, True, False, True]
    assert used._failed == set()  # booking cleared it, as booking afresh does
    other = list(BUSY)
    other[2] = gp("n2", 0, 1, 2, 3)  # an equal placement, another object: not the same booking
    assert GpuPool(TOPO, memo).book_many(other) == [True, True, True, False, True]
    assert len(memo.per_topology(TOPO, booked_cache)) == 2
