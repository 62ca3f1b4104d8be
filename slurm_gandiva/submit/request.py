"""Parse and validate a `gandiva sbatch` command line before anything reaches Slurm.

`parse_request(argv)` splits ``[sbatch options] [--gpus N|MIN:MAX] [--model M] [--total-samples N]
[--parsable] -- CMD ...`` into our options, the sbatch options passed through, and the command.
`validate(request, limits)` refuses what can never run, each with a one-line reason (BadRequest).
Both are pure.
"""

from __future__ import annotations

import enum
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Topology, placeable
from slurm_gandiva.requeue.contract import suspend_signal

USAGE = (
    "usage: gandiva sbatch [sbatch options] [--gpus N | --gpus MIN:MAX] [--model NAME] "
    "[--total-samples N] [--signal SIG] [--jobs-root DIR] [--topology FILE] [--array SPEC[%MAX]] [--parsable] "
    "-- CMD [ARGS...]"
)
ARRAY_ENV = "SBATCH_ARRAY_INX"  # sbatch reads --array from it

# sbatch options the controller manages: a user may not set them, however sbatch would spell them.
_MANAGED_LONG = {
    "--gres": "the controller chooses the GPUs: use --gpus N or --gpus MIN:MAX",
    "--gpus": "the controller chooses the GPUs: use gandiva's --gpus N or --gpus MIN:MAX",
    "--gpus-per-node": "use --gpus N or --gpus MIN:MAX",
    "--gpus-per-task": "use --gpus N or --gpus MIN:MAX",
    "--gpus-per-socket": "use --gpus N or --gpus MIN:MAX",
    "--tres-per-task": "the controller chooses the GPUs: use --gpus N or --gpus MIN:MAX",
    "--nodelist": "the controller chooses the nodes",
    "--nodefile": "the controller chooses the nodes",
    "--nodes": "the controller chooses the nodes (a job with more GPUs than a node has spans several)",
    "--comment": "the comment marks jobs the controller owns",
    "--no-requeue": "managed jobs are suspended by a held requeue and must stay requeueable",
    "--open-mode": "managed jobs always append to their output (they run in several slices)",
    "--signal": "use gandiva sbatch --signal SIG for the wrapper's suspend signal",
    "--wrap": "give the command after --",
    "--wait": "a managed job is held until the controller starts it: follow it with gandiva squeue",
}
_MANAGED_SHORT = {"-G": "--gpus", "-w": "--nodelist", "-F": "--nodefile", "-N": "--nodes", "-W": "--wait"}
# sbatch options that limit where a job may run, which the controller does not take into its view: Slurm would
# refuse the start it plans (BadConstraints) and the job's GPUs would idle. Refused, spelled any way.
_UNPLACEABLE_LONG = {
    "--exclude": "the controller places a job on any node of its partition: drop it (ask your admin to drain a "
                 "node no job may use)",
    "--constraint": "the controller does not know node features: drop it, or submit to a partition whose nodes "
                    "all have them (-p)",
    "--exclusive": "the controller shares nodes between jobs: drop it (a job that needs a whole node asks for "
                   "all of its GPUs with --gpus N)",
}
_UNPLACEABLE_SHORT = {"-x": "--exclude", "-C": "--constraint"}
_REFUSED_LONG = {**_MANAGED_LONG, **_UNPLACEABLE_LONG}
# sbatch options whose values set the CPUs and memory a job needs on each node (checked against the nodes).
_RESOURCE_LONG = ("--cpus-per-task", "--ntasks-per-node", "--mincpus", "--cpus-per-gpu", "--mem", "--mem-per-cpu",
                  "--mem-per-gpu")
_RESOURCE_SHORT = {"-c": "--cpus-per-task"}
_RESOURCE_ENV = {"SBATCH_CPUS_PER_GPU": "--cpus-per-gpu", "SBATCH_MEM_PER_NODE": "--mem",
                 "SBATCH_MEM_PER_CPU": "--mem-per-cpu", "SBATCH_MEM_PER_GPU": "--mem-per-gpu"}


class _Arg(enum.Enum):
    """Whether an sbatch long option takes a value (getopt_long's has_arg)."""

    NONE = "none"
    REQUIRED = "required"  # "--opt value" takes the next word
    OPTIONAL = "optional"  # only "--opt=value": the next word is never taken


# sbatch's long options (22.05 to 24.11, from `sbatch --help` and Slurm's option table) and whether they take
# a value. sbatch (getopt_long) accepts any unambiguous prefix of a long option, so a user option is matched
# against all of them as sbatch would. An option is marked REQUIRED only where sure: one wrongly marked would
# hide the next word from the check (an unsure one is OPTIONAL, which at worst refuses a legal value).
_REQUIRED = (
    "account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint "
    "core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency "
    "distribution error export-file extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket "
    "gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses mail-type mail-user "
    "mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes ntasks "
    "ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output partition power prefer "
    "priority profile qos reservation signal sockets-per-node switches thread-spec threads-per-core time "
    "time-min tmp tres-bind tres-per-task uid wckey exclude workdir"
)
_OPTIONAL = "exclusive export get-user-env nice oom-kill-step propagate wrap resv-ports container container-id"
_NO_VALUE = (
    "contiguous help hold ignore-pbs no-kill no-requeue overcommit oversubscribe parsable quiet reboot requeue "
    "spread-job test-only usage use-min-nodes verbose version wait"
)
_SBATCH_LONG: dict[str, _Arg] = {
    f"--{name}": kind
    for names, kind in ((_REQUIRED, _Arg.REQUIRED), (_OPTIONAL, _Arg.OPTIONAL), (_NO_VALUE, _Arg.NONE))
    for name in names.split()
}
# sbatch short options that take a value (the rest of the word, else the next word).
_SHORT_WITH_VALUE = set("AabBcCDdeFGiJLMmnNopqStwx")
_OURS_WITH_VALUE = ("--gpus", "--model", "--total-samples", "--signal", "--jobs-root", "--topology")
# sbatch reads these environment variables as options; command-line options override them, but gandiva does
# not set these, so they would reach a managed job.
_MANAGED_ENV = {
    "SBATCH_GRES": "--gres", "SBATCH_GPUS": "--gpus", "SBATCH_GPUS_PER_NODE": "--gpus-per-node",
    "SBATCH_GPUS_PER_TASK": "--gpus-per-task", "SBATCH_GPUS_PER_SOCKET": "--gpus-per-socket",
    "SBATCH_TRES_PER_TASK": "--tres-per-task", "SBATCH_SIGNAL": "--signal",
    "SBATCH_WAIT": "--wait", "SBATCH_NODELIST": "--nodelist",
    "SBATCH_EXCLUDE": "--exclude", "SBATCH_CONSTRAINT": "--constraint", "SBATCH_EXCLUSIVE": "--exclusive",
}


def resolve_long(name: str) -> str:
    """The sbatch long option `name` means, as getopt_long matches it: itself, or the one option it is an
    unambiguous prefix of. BadRequest (one line) when it is ambiguous between options one of which gandiva
    manages; an unknown or otherwise ambiguous name is returned as is (sbatch refuses it)."""
    if name in _SBATCH_LONG:
        return name
    matches = sorted(o for o in _SBATCH_LONG if o.startswith(name))
    if len(matches) == 1:
        return matches[0]
    managed = [m for m in matches if m in _REFUSED_LONG]
    if managed:
        raise BadRequest(
            f"sbatch option {name} is ambiguous ({', '.join(matches)}) and may mean {managed[0]}, which gandiva "
            f"{_refusal(managed[0])}: spell the option out"
        )
    return name


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse SBATCH_* environment variables that would set an option the controller manages (BadRequest)."""
    for var, option in _MANAGED_ENV.items():
        if env.get(var):
            raise BadRequest(
                f"environment variable {var} sets sbatch's {option}, which gandiva {_refusal(option)}: unset it "
                f"({_REFUSED_LONG[option]})"
            )


def _refusal(option: str) -> str:
    """How a refused option is described: one gandiva manages, or one it cannot honour."""
    return "cannot honour" if option in _UNPLACEABLE_LONG else "manages"


def _is_refused(option: str) -> str:
    return "cannot be honoured by gandiva" if option in _UNPLACEABLE_LONG else "is managed by gandiva"


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
    array: str | None = None  # --array SPEC[%MAX] as given (a job array: one managed job per task)
    resources: tuple[tuple[str, str], ...] = ()  # (long option, value) of the options in _RESOURCE_LONG
    account: str | None = None  # -A/--account, passed through (checked against the user's associations)
    qos: str | None = None  # --qos/-q, passed through (likewise)


def array_tasks(spec: str) -> tuple[tuple[int, ...], int]:
    """An --array SPEC[%MAX] -> (task ids, MAX or 0); BadRequest (one line) for one sbatch would refuse or
    that could never run (no task, a throttle of 0)."""
    from slurm_gandiva.slurm.parse import parse_array_spec

    try:
        if spec.strip().startswith("["):
            raise ValueError("brackets")
        tasks, limit = parse_array_spec(spec)
    except ValueError:
        raise BadRequest(
            f"--array {spec!r}: give task ids as sbatch takes them, e.g. --array=0-99%16, --array=1,3,5 or "
            "--array=0-30:10"
        ) from None
    if "%" in spec and limit < 1:
        raise BadRequest(f"--array {spec!r}: %0 would never run a task; give %MAX >= 1, or no %MAX")
    return tasks, limit


@dataclass(frozen=True)
class ClusterLimits:
    """What the cluster can give: GPUs per node, nodes per partition, and CPUs and memory (MB) per node
    (empty, or 0 for a node: unknown, not checked); the partitions the controller manages (empty: every one,
    or not known)."""

    node_gpus: Mapping[str, int]
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_partition: str | None = None
    node_cpus: Mapping[str, int] = field(default_factory=dict)
    node_memory: Mapping[str, int] = field(default_factory=dict)
    managed: tuple[str, ...] = ()

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
    array: str | None = None
    resources: dict[str, str] = {}
    tenant: dict[str, str] = {}  # "account" / "qos" -> the value given
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
        elif name in _OURS_WITH_VALUE:
            ours[name] = value(name, inline)
        elif tok == "--parsable":
            flags.add("parsable")
        elif name.startswith("--"):
            option = resolve_long(name)
            if option in _REFUSED_LONG:
                spelled = option if name == option else f"{name} ({option})"
                raise BadRequest(f"sbatch option {spelled} {_is_refused(option)}: {_REFUSED_LONG[option]}")
            if option == "--array":  # passed on as --array=SPEC by gandiva (sbatch_options)
                array = value(name, inline)
                i += 1
                continue
            if option not in ("--requeue", "--hold"):  # we always add these ourselves
                passthrough.append(tok)
            if _SBATCH_LONG.get(option) is _Arg.REQUIRED and inline is None:
                v = value(name, None)
                passthrough.append(v)
                inline = v
            if option == "--partition":
                partition = inline
            elif option == "--job-name":
                job_name = inline
            elif option in _RESOURCE_LONG and inline is not None:
                resources[option] = inline
            elif option in ("--account", "--qos") and inline is not None:
                tenant[option[2:]] = inline
        elif tok.startswith("-") and len(tok) >= 2:
            if tok.startswith("-a"):  # -a SPEC / -aSPEC: the array (a bundle like -va stays sbatch's)
                array = tok[2:] or value("-a", None)
                i += 1
                continue
            passthrough.append(tok)
            # Bundled short options, as getopt reads them: flags until one that takes a value, which takes
            # the rest of the word (or the next word), e.g. -vN2 is -v -N 2, -wn2 is -w n2.
            for k in range(1, len(tok)):
                letter = "-" + tok[k]
                if letter in _MANAGED_SHORT or letter in _UNPLACEABLE_SHORT:
                    long = _MANAGED_SHORT.get(letter) or _UNPLACEABLE_SHORT[letter]
                    shown = letter if tok == letter else f"{letter} in {tok}"
                    raise BadRequest(f"sbatch option {shown} ({long}) {_is_refused(long)}: {_REFUSED_LONG[long]}")
                if letter == "-a":
                    raise BadRequest(f"sbatch option -a in {tok} (--array): give the array on its own, "
                                     "e.g. --array=0-99%16")
                if tok[k] in _SHORT_WITH_VALUE:
                    v = tok[k + 1 :]
                    if not v:
                        v = value(letter, None)
                        passthrough.append(v)
                    if letter == "-p":
                        partition = v
                    elif letter == "-J":
                        job_name = v
                    elif letter in _RESOURCE_SHORT:
                        resources[_RESOURCE_SHORT[letter]] = v
                    elif letter in ("-A", "-q"):
                        tenant["account" if letter == "-A" else "qos"] = v
                    break
        else:
            raise BadRequest(f"unexpected {tok!r} before --: put the command after --; {USAGE}")
        i += 1
    if "help" in flags:
        return SbatchRequest(command=command, help=True)
    if array is not None:
        array_tasks(array)
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
        array=array,
        resources=tuple(resources.items()),
        account=tenant.get("account"),
        qos=tenant.get("qos"),
    )


def _sizes(node_gpus: Iterable[int]) -> str:
    return "/".join(str(n) for n in sorted(set(node_gpus)))


def validate(req: SbatchRequest, limits: ClusterLimits, *, check_command: bool = True,
             env: Mapping[str, str] | None = None) -> None:
    """Refuse a request that can never run (BadRequest, one line). Checks the command exists on PATH, and
    the CPUs and memory it asks for per node (its options, else sbatch's SBATCH_* variables in `env`)."""
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
    if partition is not None and limits.managed:
        # The controller schedules only its partitions' jobs: one elsewhere would wait forever.
        unmanaged = [p for p in partition.split(",") if p not in limits.managed]
        if unmanaged:
            raise BadRequest(
                f"partition {unmanaged[0]!r} is not scheduled by gandiva: choose one of {', '.join(limits.managed)}"
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
    for k in (req.gpus.min, req.gpus.max):
        if not placeable(k, nodes.values()):
            fit = max((n for n in range(1, k) if placeable(n, nodes.values())), default=1)
            fix = f"{fit}" if req.gpus.min >= fit or req.gpus.min == req.gpus.max else f"{req.gpus.min}:{fit}"
            raise BadRequest(
                f"--gpus asks for {k} GPUs, which cannot be spread evenly over the nodes{where} (a job on "
                f"several nodes gets the same GPUs on each; nodes have {_sizes(nodes.values())} GPUs): use --gpus {fix}"
            )
    check_resources(req, limits, nodes, where, env or {})


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _megabytes(text: str) -> float | None:
    """An sbatch memory size (a number, MB unless suffixed K/M/G/T) in MB; None: not one (sbatch judges it)."""
    t = text.strip().upper()
    unit = _MEM_UNITS.get(t[-1:]) if t else None
    try:
        return float(t[:-1] if unit is not None else t) * (unit if unit is not None else 1)
    except ValueError:
        return None


def check_resources(req: SbatchRequest, limits: ClusterLimits, nodes: Mapping[str, int], where: str,
                    env: Mapping[str, str]) -> None:
    """Refuse (BadRequest, one line) CPUs or memory per node that no GPU node of `nodes` (name -> GPUs) can
    hold; a request that some node holds is accepted (the controller places it only where its CPUs and memory
    fit). A job's share on a node is counted at its largest (--gpus MAX, the controller may grow it), with
    gandiva's one task."""
    asked = {opt: env[var] for var, opt in _RESOURCE_ENV.items() if env.get(var)}
    asked.update(req.resources)
    if not asked:
        return

    def count(option: str, default: int) -> int:
        try:
            return max(int(asked[option]), default) if option in asked else default
        except ValueError:
            return default  # not a number: sbatch refuses it

    per_task = count("--cpus-per-task", 1) * count("--ntasks-per-node", 1)
    gpu_nodes = 0
    short_cpus: list[tuple[int, int]] = []  # (CPUs needed, CPUs the node has) where they do not fit
    short_mem: list[tuple[float, int]] = []  # (MB needed, MB the node has) where they do not fit
    for name, gpus in sorted(nodes.items()):
        if gpus < 1:
            continue
        gpu_nodes += 1
        share = min(req.gpus.max, gpus)
        cpus = max(per_task, count("--mincpus", 0), count("--cpus-per-gpu", 0) * share)
        mem = _megabytes(asked["--mem"]) if "--mem" in asked else None
        for option, times in (("--mem-per-cpu", cpus), ("--mem-per-gpu", share)):
            each = _megabytes(asked[option]) if option in asked else None
            if each is not None:
                mem = max(mem or 0.0, each * times)
        have_cpus, have_mem = limits.node_cpus.get(name, 0), limits.node_memory.get(name, 0)
        cpus_fit = not have_cpus or cpus <= have_cpus
        mem_fit = not mem or not have_mem or mem <= have_mem  # --mem=0 is "all of the node's memory"
        if cpus_fit and mem_fit:
            return
        if not cpus_fit:
            short_cpus.append((cpus, have_cpus))
        if mem and not mem_fit:
            short_mem.append((mem, have_mem))
    if len(short_cpus) == gpu_nodes and short_cpus:
        raise BadRequest(
            f"the request needs {min(n for n, _ in short_cpus)} CPUs on a node ({_spelled(asked, _CPU_OPTIONS, req)}"
            f"), but no node{where} has more than {max(h for _, h in short_cpus)}: ask for fewer CPUs"
        )
    if len(short_mem) == gpu_nodes and short_mem:
        raise BadRequest(
            f"the request needs {min(n for n, _ in short_mem):.0f} MB of memory on a node "
            f"({_spelled(asked, _MEM_OPTIONS, req)}), but no node{where} has more than "
            f"{max(h for _, h in short_mem)} MB: ask for less memory"
        )
    if gpu_nodes:
        raise BadRequest(
            f"no node{where} has both the CPUs and the memory the request needs ({_spelled(asked, _MEM_OPTIONS, req)}"
            "): ask for fewer CPUs or less memory"
        )


_CPU_OPTIONS = ("--cpus-per-task", "--ntasks-per-node", "--mincpus", "--cpus-per-gpu")
_MEM_OPTIONS = ("--mem", "--mem-per-cpu", "--mem-per-gpu", *_CPU_OPTIONS)


def _spelled(asked: Mapping[str, str], options: Sequence[str], req: SbatchRequest) -> str:
    """The options that set a need, as `--opt=value ...` (and the GPUs, when a per-GPU option counts)."""
    words = [f"{o}={asked[o]}" for o in options if o in asked]
    if any(o.endswith("-per-gpu") for o in asked):
        words.append(f"--gpus {req.gpus.max}")
    return " ".join(words)
