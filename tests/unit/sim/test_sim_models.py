"""Speed models from the Pollux tables: step times, locality, packing, elastic ranges."""

from __future__ import annotations

import pytest

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import GpuRef, Locality, Placement, Topology
from slurm_gandiva.profiles import LOCAL_BSZ, load_profile, load_profiles
from slurm_gandiva.sim.models import SpeedModel, best_locality

TOPO = Topology.uniform(4, 4)


def test_profiles_load_every_model_at_its_batch_size() -> None:
    profs = load_profiles()
    assert set(profs) == set(LOCAL_BSZ)
    for name, p in profs.items():
        assert p.local_bsz == LOCAL_BSZ[name]
        assert (1,) in p.by_shape and (4,) in p.by_shape and (2, 2) in p.by_shape
        assert all(st > 0 for st in p.by_shape.values())


def test_step_time_is_the_table_value_averaged_over_orderings() -> None:
    p = load_profile("cifar10")
    # placements.csv, local_bsz 129: "1" -> 0.10385050773620605
    assert p.step_time((1,)) == pytest.approx(0.10385050773620605)
    assert p.throughput((1,)) == pytest.approx(129 / 0.10385050773620605)
    # shapes are order-free: "12" and "21" style entries land on the same key
    assert p.step_time((1, 2)) == p.step_time((2, 1))


def test_shapes_beyond_the_tables() -> None:
    p = load_profile("imagenet")
    assert p.step_time((8,)) == p.step_time((4,))  # more GPUs on one node than measured
    # 32 GPUs on 8 nodes: the scalability row, or a faster row measured on more nodes (12 nodes here)
    st32 = p.step_time((4,) * 8)
    more = [st for (n, k), st in p.by_scale.items() if k == 32 and n >= 8]
    assert st32 == min(more) < p.by_scale[(8, 32)]
    lo, hi = p.step_time((4,) * 4), p.step_time((4,) * 16)
    assert min(lo, hi) <= p.step_time((4,) * 10) <= max(lo, hi) * 1.5


def test_unknown_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        load_profile("gpt")


def test_locality_penalty_within_a_node() -> None:
    sm = SpeedModel(load_profile("bert"), TOPO, locality_penalty=0.1)
    same_switch = Placement((GpuRef("n1", 0), GpuRef("n1", 1)))
    two_sockets = Placement((GpuRef("n1", 0), GpuRef("n1", 2)))
    assert TOPO.locality(two_sockets.gpus) is Locality.NODE
    assert sm.rate(two_sockets) == pytest.approx(sm.rate(same_switch) / 1.2)
    across = Placement((GpuRef("n1", 0), GpuRef("n2", 0)))
    assert sm.rate(across) == pytest.approx(sm.profile.throughput((1, 1)))
    assert best_locality(2, TOPO) is Locality.SWITCH
    assert best_locality(4, TOPO) is Locality.NODE
    assert best_locality(5, TOPO) is Locality.CROSS_NODE


def test_packing_interference() -> None:
    sm = SpeedModel(load_profile("ncf"), TOPO, interference=0.25)
    whole = Placement((GpuRef("n1", 0),))
    shared = Placement((GpuRef("n1", 0),), shared=True)
    assert sm.rate(shared) == pytest.approx(0.75 * sm.rate(whole))


def test_rate_table_and_max_useful() -> None:
    sm = SpeedModel(load_profile("imagenet"), TOPO)
    table = sm.rate_table(8)
    assert table.throughput(4, Locality.NODE) == pytest.approx(sm.best_rate(4))
    assert table.throughput(2, Locality.CROSS_NODE) == pytest.approx(sm.profile.throughput((1, 1)))
    assert table.throughput(2, Locality.SWITCH) > table.throughput(2, Locality.CROSS_NODE)
    k = sm.max_useful_gpus(16)
    assert all(sm.best_rate(j) <= sm.best_rate(k) for j in range(1, 17))
