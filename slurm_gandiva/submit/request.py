"""Parse and validate a `gandiva sbatch` command line before anything reaches Slurm.

`parse_request(argv)` splits ``[sbatch options] [--gpus N|MIN:MAX] [--model M] [--total-samples N]
[--parsable] -- CMD ...`` into our options, the sbatch options passed through, and the command.
`validate(request, limits)` refuses what can never run, each with a one-line reason (BadRequest).
Both are pure.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Topology
from slurm_gandiva.requeue.contract import suspend_signal

USAGE = (
    "usage: gandiva sbatch [sbatch options] [--gpus N | --gpus MIN:MAX] [--model NAME] "
    "[--total-samples N] [--signal SIG] [--jobs-root DIR] [--topology FILE] [--parsable] -- CMD [ARGS...]"
)

# sbatch options the controller manages: a user may not set them (long names; a prefix "=..." too).
_MANAGED_LONG = {
    "--gres": "the controller chooses the GPUs: use --gpus N or --gpus MIN:MAX",
    "--gpus-per-node": "use --gpus N or --gpus MIN:MAX",
    "--gpus-per-task": "use --gpus N or --gpus MIN:MAX",
    "--gpus-per-socket": "use --gpus N or --gpus MIN:MAX",
    "--nodelist": "the controller chooses the nodes",
    "--nodes": "managed jobs run on one node",
    "--comment": "the comment marks jobs the controller owns",
    "--no-requeue": "managed jobs are suspended by a held requeue and must stay requeueable",
    "--open-mode": "managed jobs always append to their output (they run in several slices)",
    "--signal": "use gandiva sbatch --signal SIG for the wrapper's suspend signal",
    "--wrap": "give the command after --",
    "--array": "job arrays are not supported: submit one job per command",
}
_MANAGED_SHORT = {"-G": "--gpus-per-node", "-w": "--nodelist", "-N": "--nodes", "-a": "--array"}
# sbatch short options that take a value (so the value is not mistaken for an option).
_SHORT_WITH_VALUE = set("AabcCDdeFGiJLMmnNopqStwx")
# sbatch long options that take a separate value when written without "=".
_LONG_WITH_VALUE = {
    "--account", "--begin", "--cpus-per-task", "--constraint", "--chdir", "--dependency", "--error",
    "--input", "--job-name", "--licenses", "--clusters", "--distribution", "--ntasks", "--output",
    "--partition", "--qos", "--core-spec", "--time", "--exclude", "--mem", "--mem-per-cpu",
    "--mail-type", "--mail-user", "--export", "--time-min", "--nice", "--reservation", "--ntasks-per-node",
    "--mem-per-gpu", "--cpus-per-gpu", "--tmp", "--uid", "--gid", "--workdir", "--wckey",
}


@dataclass(frozen=True)
class GpuRange:
    """GPUs a job may run on; rigid when min == max."""

    min: int
    max: int

    @staticmethod
    def parse(text: str) -> GpuRange:
        parts = text.split(":")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise BadRequest(f"--gpus {text!r}: give a number N or a range MIN:MAX, e.g. --gpus 1:4") from None
        if len(nums) == 1:
            nums = nums * 2
        if len(nums) != 2:
            raise BadRequest(f"--gpus {text!r}: give a number N or a range MIN:MAX, e.g. --gpus 1:4")
        lo, hi = nums
        if lo < 1:
            raise BadRequest(f"--gpus {text!r}: a job needs at least 1 GPU")
        if lo > hi:
            raise BadRequest(f"--gpus {text!r}: MIN is larger than MAX; write it as {hi}:{lo}")
        return GpuRange(lo, hi)


@dataclass(frozen=True)
class SbatchRequest:
    """A parsed `gandiva sbatch` command line."""

    command: tuple[str, ...]
    gpus: GpuRange = GpuRange(1, 1)
    model: str = ""
    total_samples: int | None = None
    signal: str | None = None  # None: the controller's configured signal, else USR2
    parsable: bool = False
    jobs_root: str | None = None
    topology: str | None = None
    sbatch_options: tuple[str, ...] = ()
    partition: str | None = None
    job_name: str | None = None
    help: bool = False


@dataclass(frozen=True)
class ClusterLimits:
    """What the cluster can give: GPUs per node, and nodes per partition (empty: unknown, not checked)."""

    node_gpus: Mapping[str, int]
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_partition: str | None = None

    @staticmethod
    def from_topology(topo: Topology, partitions: Mapping[str, tuple[str, ...]] | None = None,
                      default_partition: str | None = None) -> ClusterLimits:
        return ClusterLimits(
            {n.name: len(n.gpus) for n in topo.nodes}, dict(partitions or {}), default_partition
        )


def parse_request(argv: Sequence[str]) -> SbatchRequest:
    """Split the command line; raises BadRequest with a one-line reason."""
    args = list(argv)
    if "--" in args:
        cut = args.index("--")
        opts, command = args[:cut], tuple(args[cut + 1 :])
    else:
        opts, command = args, ()
    ours: dict[str, str] = {}
    flags: set[str] = set()
    passthrough: list[str] = []
    partition: str | None = None
    job_name: str | None = None
    i = 0

    def value(name: str, inline: str | None) -> str:
        nonlocal i
        if inline is not None:
            return inline
        if i + 1 >= len(opts):
            raise BadRequest(f"{name} needs a value; {USAGE}")
        i += 1
        return opts[i]

    while i < len(opts):
        tok = opts[i]
        name, eq, inline_val = tok.partition("=")
        inline = inline_val if eq else None
        if tok in ("-h", "--help"):
            flags.add("help")
        elif name in ("--gpus", "--model", "--total-samples", "--signal", "--jobs-root", "--topology"):
            ours[name] = value(name, inline)
        elif tok == "--parsable":
            flags.add("parsable")
        elif name.startswith("--"):
            managed = next((m for m in _MANAGED_LONG if name == m), None)
            if managed:
                raise BadRequest(f"sbatch option {managed} is managed by gandiva: {_MANAGED_LONG[managed]}")
            if name not in ("--requeue", "--hold"):  # we always add these ourselves
                passthrough.append(tok)
            if name in _LONG_WITH_VALUE and inline is None:
                v = value(name, None)
                passthrough.append(v)
                inline = v
            if name == "--partition":
                partition = inline
            elif name == "--job-name":
                job_name = inline
        elif tok.startswith("-") and len(tok) >= 2:
            letter = tok[:2]
            if letter in _MANAGED_SHORT:
                long = _MANAGED_SHORT[letter]
                raise BadRequest(f"sbatch option {letter} ({long}) is managed by gandiva: {_MANAGED_LONG[long]}")
            passthrough.append(tok)
            if tok[1] in _SHORT_WITH_VALUE:
                v = tok[2:] if len(tok) > 2 else value(letter, None)
                if len(tok) == 2:
                    passthrough.append(v)
                if letter == "-p":
                    partition = v
                elif letter == "-J":
                    job_name = v
        else:
            raise BadRequest(f"unexpected {tok!r} before --: put the command after --; {USAGE}")
        i += 1
    if "help" in flags:
        return SbatchRequest(command=command, help=True)
    total: int | None = None
    if "--total-samples" in ours:
        try:
            total = int(ours["--total-samples"])
        except ValueError:
            total = 0
        if total < 1:
            raise BadRequest(f"--total-samples {ours['--total-samples']!r}: give a positive number of samples")
    signal: str | None = None
    if "--signal" in ours:
        try:
            signal = suspend_signal(ours["--signal"]).name.removeprefix("SIG")
        except ValueError as exc:
            raise BadRequest(f"--signal {ours['--signal']}: {exc}") from None
    return SbatchRequest(
        command=command,
        gpus=GpuRange.parse(ours["--gpus"]) if "--gpus" in ours else GpuRange(1, 1),
        model=ours.get("--model", ""),
        total_samples=total,
        signal=signal,
        parsable="parsable" in flags,
        jobs_root=ours.get("--jobs-root"),
        topology=ours.get("--topology"),
        sbatch_options=tuple(passthrough),
        partition=partition,
        job_name=job_name,
    )


def validate(req: SbatchRequest, limits: ClusterLimits, *, check_command: bool = True) -> None:
    """Refuse a request that can never run (BadRequest, one line). Checks the command exists on PATH."""
    if not req.command:
        raise BadRequest("no command: give the training command after --, e.g. gandiva sbatch --gpus 2 -- "
                         "python train.py")
    if check_command and shutil.which(req.command[0]) is None:
        raise BadRequest(f"command {req.command[0]!r} not found or not executable: give its full path")
    nodes = limits.node_gpus
    partition = req.partition or limits.default_partition
    if req.partition is not None and limits.partitions:
        unknown = [p for p in req.partition.split(",") if p not in limits.partitions]
        if unknown:
            raise BadRequest(
                f"unknown partition {unknown[0]!r}: choose one of {', '.join(sorted(limits.partitions))}"
            )
    if partition is not None and limits.partitions:
        members = {n for p in partition.split(",") for n in limits.partitions.get(p, ())}
        nodes = {n: g for n, g in nodes.items() if n in members}
    where = f" in partition {partition}" if partition and limits.partitions else ""
    total = sum(nodes.values())
    if total == 0:
        raise BadRequest(f"the cluster has no GPUs{where}: ask your admin which partition has GPUs")
    if req.gpus.min > total:
        raise BadRequest(f"--gpus asks for at least {req.gpus.min} GPUs but the cluster has {total}{where}")
    biggest = max(nodes.values())
    if req.gpus.max > biggest:
        fix = f"{biggest}" if req.gpus.min >= biggest else f"{req.gpus.min}:{biggest}"
        raise BadRequest(
            f"--gpus asks for up to {req.gpus.max} GPUs but the largest node{where} has {biggest} "
            f"(a job runs on one node): use --gpus {fix}"
        )
