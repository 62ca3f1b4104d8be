"""What the running Slurm can and cannot do: the one place where Slurm releases differ.

Learned once from the running Slurm (`scontrol show config` names slurmctld's release and its scheduler
parameters; `slurmctld -V` names an installed release before any daemon runs). The rest of the project
asks this object questions ("does a requeued job keep its old GPU indices?") and never compares versions
itself. Each behaviour below was measured on the real daemons; the capability tests in tests/integration
(test_slurm_adapter.py, test_requeue_cycle.py, test_controller.py: "...as the capabilities say", "...where
slurm allows") check them against the running Slurm of each supported release (22.05, 24.11, 25.11, 26.05).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gandiva.errors import SlurmError, SlurmUnreachable

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    """"24.11.5" / "slurm 24.11.5" / "slurm-wlm 22.05.8" -> (24, 11, 5); SlurmError if there is none."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise SlurmError(f"cannot read a Slurm release from {text.strip()[:80]!r}: check `scontrol version`")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)))


@dataclass(frozen=True)
class SlurmCapabilities:
    """The running Slurm's release and the behaviours the protocol, placement and policies depend on."""

    release: Version
    # Slurm 21.08.0-23.02.1 keeps a requeued job's old GRES indices: released onto other GPUs of a node where
    # another job holds one of those indices, it stays pending (fixed in 23.02.2).
    requeue_keeps_gpu_indices: bool
    # `scontrol update gres=` merges typed gres into the job's earlier request (22.05): clear TresPerNode
    # first to replace it.
    gres_update_merges: bool
    # A held job's gres can be switched between shards and whole GPUs and its shards replaced (22.05: the
    # update is refused, and clearing shards crashes slurmctld).
    gres_kind_switch: bool
    # Slurm keeps a GPU's `gpu` and its `shard`s apart. Measured so on 22.05.8 as on 24.11 on (in either
    # order, typed or not, held and released together); SchedMD's 23.11.5 changelog fixes a case of it that
    # these clusters do not show. Kept as a capability so that a release where it fails is caught by its test.
    gpu_shard_exclusive: bool
    # squeue --json honours filters such as --jobs (22.05 always prints every job).
    squeue_json_filters: bool
    # Shards of one job on several GPUs of a node need SelectTypeParameters=MULTIPLE_SHARING_GRES_PJ
    # (23.11.1 on); before, they were always allowed.
    multiple_sharing_gres_param: bool
    # SchedulerParameters=requeue_delay=N sets the begin-time delay Slurm gives a requeued job (25.11 on);
    # before, it is always cred_expire + 1 s (121 s) and the protocol clears it with starttime=now.
    requeue_delay_param: bool
    # The requeue delay slurmctld runs with, when it says (requeue_delay=N in SchedulerParameters).
    requeue_delay: int | None = None
    # Slurm counts memory as a consumable resource (SelectTypeParameters CR_*_Memory): a node's jobs hold
    # their --mem, and a job starts only where its memory is free. Otherwise memory is not allocated.
    memory_consumable: bool = False
    # SelectTypeParameters names MULTIPLE_SHARING_GRES_PJ (see `multiple_sharing_gres_param`).
    multiple_sharing_gres_set: bool = False

    @property
    def release_text(self) -> str:
        major, minor, micro = self.release
        return f"{major}.{minor:02d}.{micro}"

    @property
    def packing(self) -> bool:
        """Packing (two jobs on shards of one GPU, moved back to whole GPUs) is safe on the live cluster:
        Slurm itself keeps gpu and shard apart and a held job can switch between them."""
        return self.gpu_shard_exclusive and self.gres_kind_switch

    @property
    def shards_on_several_gpus(self) -> bool:
        """One job may hold shards of several GPUs of a node (a co-held job on more than one GPU)."""
        return not self.multiple_sharing_gres_param or self.multiple_sharing_gres_set

    @classmethod
    def for_release(
        cls, release: Version, scheduler_parameters: str = "", select_type_parameters: str = ""
    ) -> SlurmCapabilities:
        """The behaviours of `release` (measured per release; see the module docstring), with what its
        configuration says (SchedulerParameters, SelectTypeParameters)."""
        delay = None
        m = re.search(r"(?:^|,)requeue_delay=(\d+)", scheduler_parameters.replace(" ", ""))
        if m:
            delay = int(m.group(1))
        return cls(
            release=release,
            requeue_keeps_gpu_indices=(21, 8, 0) <= release < (23, 2, 2),
            gres_update_merges=release < (23, 2, 0),
            gres_kind_switch=release >= (23, 2, 0),
            gpu_shard_exclusive=True,
            squeue_json_filters=release >= (23, 2, 0),
            multiple_sharing_gres_param=release >= (23, 11, 1),
            requeue_delay_param=release >= (25, 11, 0),
            requeue_delay=delay,
            memory_consumable=memory_consumable(select_type_parameters),
            multiple_sharing_gres_set="MULTIPLE_SHARING_GRES_PJ" in select_type_parameters.upper(),
        )

    @classmethod
    def from_config(cls, show_config: str) -> SlurmCapabilities:
        """From `scontrol show config` output (SLURM_VERSION, SchedulerParameters, SelectTypeParameters)."""
        fields = parse_show_config(show_config)
        if "SLURM_VERSION" not in fields:
            raise SlurmError("`scontrol show config` printed no SLURM_VERSION: is slurmctld running?")
        return cls.for_release(
            parse_version(fields["SLURM_VERSION"]), fields.get("SchedulerParameters", ""),
            fields.get("SelectTypeParameters", ""),
        )

    def describe(self) -> str:
        """One line for logs and --check: the release and what it means here."""
        yes = [name for name, on in (
            ("requeued jobs keep GPU indices", self.requeue_keeps_gpu_indices),
            ("gres updates merge", self.gres_update_merges),
            ("held jobs switch shards and whole GPUs", self.gres_kind_switch),
            ("gpu and shard exclusive", self.gpu_shard_exclusive),
            ("packing", self.packing),
            ("memory counted", self.memory_consumable),
        ) if on]
        return f"Slurm {self.release_text} ({', '.join(yes) or 'no special behaviour'})"


def memory_consumable(select_type_parameters: str) -> bool:
    """Whether SelectTypeParameters (e.g. "CR_CORE_MEMORY,MULTIPLE_SHARING_GRES_PJ") make memory consumable:
    CR_Memory, CR_Core_Memory, CR_CPU_Memory, CR_Socket_Memory (any case)."""
    return any(
        p.strip().upper().startswith("CR_") and p.strip().upper().endswith("MEMORY")
        for p in select_type_parameters.split(",")
    )


def parse_show_config(text: str) -> Mapping[str, str]:
    """`scontrol show config` lines "Key = value" -> {Key: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def installed_release(slurmctld: str = "slurmctld") -> Version:
    """The release of the slurmctld on PATH (`slurmctld -V`), before any daemon runs."""
    exe = shutil.which(slurmctld) or shutil.which(slurmctld, path="/usr/sbin:/usr/local/sbin")
    if exe is None:
        raise SlurmUnreachable("slurmctld not found: install Slurm (bash scripts/setup.sh) or put its sbin on PATH")
    try:
        out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnreachable(f"{exe} -V failed ({exc}): check the Slurm installation") from None
    return parse_version(out.stdout or out.stderr)
