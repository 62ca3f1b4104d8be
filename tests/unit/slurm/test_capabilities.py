"""SlurmCapabilities: one object says what the running Slurm does; releases differ only there."""

from __future__ import annotations

import pytest

from slurm_gandiva.errors import SlurmError
from slurm_gandiva.slurm.capabilities import SlurmCapabilities, parse_show_config, parse_version

SHOW_CONFIG = """Configuration data as of 2026-11-25T03:41:00
AccountingStorageBackupHost = (null)
SchedulerParameters     = sched_interval=2,bf_interval=2,requeue_delay=5
SLURM_CONF              = /tmp/x/etc/slurm.conf
SLURM_VERSION           = 25.11.7
"""


def test_version_forms() -> None:
    assert parse_version("slurm 24.11.5") == (24, 11, 5)
    assert parse_version("slurm-wlm 22.05.8") == (22, 5, 8)
    assert parse_version("26.05.3") == (26, 5, 3)
    with pytest.raises(SlurmError, match="scontrol version"):
        parse_version("slurm_load_ctl_conf error")


def test_from_show_config() -> None:
    assert parse_show_config(SHOW_CONFIG)["SLURM_VERSION"] == "25.11.7"
    caps = SlurmCapabilities.from_config(SHOW_CONFIG)
    assert caps.release == (25, 11, 7) and caps.requeue_delay_param and caps.requeue_delay == 5
    assert caps.release_text == "25.11.7"
    with pytest.raises(SlurmError, match="slurmctld running"):
        SlurmCapabilities.from_config("slurm_load_ctl_conf error: Unable to contact slurm controller\n")


@pytest.mark.parametrize(
    ("release", "ties", "merges", "switch", "exclusive", "packing"),
    [
        ((22, 5, 8), True, True, False, True, False),  # Debian 12: exclusive, but no switching back
        ((23, 2, 1), True, False, True, True, True),  # the index bug's last release
        ((23, 2, 2), False, False, True, True, True),
        ((23, 11, 5), False, False, True, True, True),
        ((24, 11, 5), False, False, True, True, True),  # Debian 13
        ((25, 11, 7), False, False, True, True, True),
        ((26, 5, 3), False, False, True, True, True),
    ],
)
def test_behaviour_per_release(
    release: tuple[int, int, int], ties: bool, merges: bool, switch: bool, exclusive: bool, packing: bool
) -> None:
    caps = SlurmCapabilities.for_release(release)
    assert caps.requeue_keeps_gpu_indices is ties
    assert caps.gres_update_merges is merges
    assert caps.gres_kind_switch is switch
    assert caps.gpu_shard_exclusive is exclusive
    assert caps.packing is packing
    assert caps.squeue_json_filters is (release >= (23, 2, 0))
    assert caps.requeue_delay is None
    assert caps.release_text in caps.describe()


def test_release_text_is_slurms_spelling() -> None:
    assert SlurmCapabilities.for_release((22, 5, 8)).release_text == "22.05.8"
    assert SlurmCapabilities.for_release((24, 11, 5)).describe().startswith("Slurm 24.11.5 (")


@pytest.mark.parametrize(
    ("params", "counted"),
    [
        ("CR_CORE_MEMORY", True),  # as scontrol show config prints it
        ("CR_Core_Memory,MULTIPLE_SHARING_GRES_PJ", True),
        ("CR_CPU_MEMORY", True),
        ("CR_SOCKET_MEMORY", True),
        ("CR_MEMORY", True),
        ("CR_CORE", False),
        ("CR_CORE,MULTIPLE_SHARING_GRES_PJ", False),
        ("CR_CPU", False),
        ("", False),
    ],
)
def test_memory_is_counted_where_select_type_parameters_make_it_consumable(params: str, counted: bool) -> None:
    text = SHOW_CONFIG + f"SelectTypeParameters    = {params}\n"
    caps = SlurmCapabilities.from_config(text)
    assert caps.memory_consumable is counted
    assert ("memory counted" in caps.describe()) is counted
    assert SlurmCapabilities.for_release((24, 11, 5)).memory_consumable is False  # not said: not counted
