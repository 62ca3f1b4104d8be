from dataclasses import replace

import pytest

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import Topology
from slurm_gandiva.submit.request import ClusterLimits, GpuRange, parse_request, validate

LIMITS = ClusterLimits.from_topology(Topology.uniform(2, 4), partitions={"gpu": ("n1", "n2"), "small": ("n1",)})


def test_parse_splits_ours_sbatch_and_command() -> None:
    r = parse_request(
        [
            "-p",
            "gpu",
            "-J",
            "x",
            "--gpus",
            "1:4",
            "--time=10",
            "--mem",
            "100",
            "--model",
            "bert",
            "--total-samples=640",
            "--parsable",
            "-o",
            "out.txt",
            "--",
            "python",
            "t.py",
            "--gpus",
            "9",
            "--",
        ]
    )
    assert r.command == ("python", "t.py", "--gpus", "9", "--")
    assert r.gpus == GpuRange(1, 4)
    assert (r.model, r.total_samples, r.parsable, r.partition, r.job_name) == ("bert", 640, True, "gpu", "x")
    assert r.sbatch_options == ("-p", "gpu", "-J", "x", "--time=10", "--mem", "100", "-o", "out.txt")


@pytest.mark.parametrize(
    "argv,part", [(["-pgpu"], "gpu"), (["--partition=a,b"], "a,b"), (["--partition", "q"], "q"), ([], None)]
)
def test_partition_forms(argv: list[str], part: str | None) -> None:
    assert parse_request([*argv, "--", "x"]).partition == part


def test_a_value_is_not_taken_for_an_option() -> None:
    r = parse_request(["-J", "-w", "--", "true"])  # a job named "-w" is odd but legal
    assert r.job_name == "-w"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--gpus", "3:1"], "MIN is larger than MAX"),
        (["--gpus", "0"], "at least 1 GPU"),
        (["--gpus", "two"], "give a number"),
        (["--gpus", "1:2:3"], "give a number"),
        (["--gres=gpu:2"], "--gres is managed"),
        (["--gres", "gpu:2"], "--gres is managed"),
        (["-G", "2"], "-G (--gpus) is managed"),
        (["-w", "n1"], "-w (--nodelist) is managed"),
        (["--comment=x"], "--comment is managed"),
        (["--no-requeue"], "--no-requeue is managed"),
        (["--open-mode=truncate"], "--open-mode is managed"),
        (["--array=1-3%0"], "%0 would never run a task"),
        (["--total-samples", "-5"], "positive number"),
        (["stray"], "unexpected 'stray'"),
        (["--model"], "--model needs a value"),
    ],
)
def test_bad_command_lines_are_refused_with_one_line(argv: list[str], needle: str) -> None:
    with pytest.raises(BadRequest) as ei:
        parse_request([*argv, "--", "true"])
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


def test_help_flag() -> None:
    assert parse_request(["--help"]).help
    assert not parse_request(["--", "python", "--help"]).help


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--gpus", "9"], "the cluster has 8"),
        (["--gpus", "5"], "5 GPUs, which cannot be spread evenly over the nodes (a job on several nodes gets the "
                          "same GPUs on each; nodes have 4 GPUs): use --gpus 4"),
        (["--gpus", "2:7"], "use --gpus 2:6"),
        (["-p", "nope", "--gpus", "1"], "unknown partition 'nope': choose one of gpu, small"),
        (["-p", "small", "--gpus", "5"], "cluster has 4 in partition small"),
    ],
)
def test_validation_refusals(argv: list[str], needle: str) -> None:
    with pytest.raises(BadRequest) as ei:
        validate(parse_request([*argv, "--", "true"]), LIMITS)
    assert needle in str(ei.value)


def test_validation_accepts_what_fits() -> None:
    validate(parse_request(["--gpus", "1:4", "--", "true"]), LIMITS)
    validate(parse_request(["-p", "small", "--gpus", "4", "--", "true"]), LIMITS)
    # no partition info from Slurm: partitions are not checked
    validate(parse_request(["-p", "any", "--", "true"]), ClusterLimits({"n1": 1}))


def test_missing_command_refused() -> None:
    with pytest.raises(BadRequest, match="no command"):
        validate(parse_request(["--gpus", "1"]), LIMITS)
    with pytest.raises(BadRequest, match="not found"):
        validate(parse_request(["--", "/no/such/program"]), LIMITS)
    with pytest.raises(BadRequest, match="not found"):
        validate(parse_request(["--", "no-such-program-xyz"]), LIMITS)


@pytest.mark.parametrize(
    "argv,needle",
    [
        # any unambiguous prefix of a long option, as sbatch's getopt_long takes it
        (["--nodelis=n2"], "sbatch option --nodelis (--nodelist) is managed by gandiva"),
        (["--nodeli", "n2"], "--nodeli (--nodelist) is managed"),
        (["--gpus-per-nod=3"], "--gpus-per-nod (--gpus-per-node) is managed"),
        (["--gre=gpu:2"], "--gre is ambiguous (--gres, --gres-flags) and may mean --gres"),
        (["--comm=x"], "--comm (--comment) is managed"),
        (["--no-req"], "--no-requeue) is managed"),
        (["--open=truncate"], "--open (--open-mode) is managed"),
        (["-va1-3"], "-a in -va1-3 (--array): give the array on its own"),
        (["--wra=hostname"], "--wra (--wrap) is managed"),
        (["--tres-per-t=gres/gpu:4"], "(--tres-per-task) is managed"),
        (["--nodef=hosts.txt"], "(--nodefile) is managed"),
        (["--wai"], "(--wait) is managed"),
        # ambiguous prefixes that may mean a managed option
        (["--node=2"], "--node is ambiguous (--nodefile, --nodelist, --nodes) and may mean --nodefile"),
        (["--gpu=2"], "ambiguous"),
        # bundled and attached short options, as getopt reads them
        (["-vN2"], "-N in -vN2 (--nodes) is managed"),
        (["-wn2"], "-w in -wn2 (--nodelist) is managed"),
        (["-N", "2"], "-N (--nodes) is managed"),
        (["-Hw", "n2"], "-w in -Hw (--nodelist) is managed"),
        (["-QvG2"], "-G in -QvG2 (--gpus) is managed"),
        (["-Fhosts"], "-F in -Fhosts (--nodefile) is managed"),
        (["-W"], "-W (--wait) is managed"),
        # an option's value hides nothing: the word after a value-taking option is its value, no more
        (["--part", "gpu", "-w", "n2"], "-w (--nodelist) is managed"),
        # options that limit where a job runs, which the controller does not take into its view
        (["--exclude=n2"], "--exclude cannot be honoured by gandiva: the controller places a job on any node"),
        (["--exclud", "n2"], "--exclud (--exclude) cannot be honoured"),
        (["--excl=n2"], "--excl is ambiguous (--exclude, --exclusive) and may mean --exclude, which gandiva "
                        "cannot honour: spell the option out"),
        (["-xn2"], "-x in -xn2 (--exclude) cannot be honoured"),
        (["-vx", "n2"], "-x in -vx (--exclude) cannot be honoured"),
        (["--constraint=a100"], "--constraint cannot be honoured by gandiva: the controller does not know node "
                                "features"),
        (["-Ca100"], "-C in -Ca100 (--constraint) cannot be honoured"),
        (["--exclusive"], "--exclusive cannot be honoured by gandiva: the controller shares nodes"),
        (["--exclusive=user"], "--exclusive cannot be honoured"),
    ],
)
def test_managed_options_however_sbatch_would_spell_them(argv: list[str], needle: str) -> None:
    with pytest.raises(BadRequest) as ei:
        parse_request([*argv, "--", "true"])
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize(
    "argv,passed,part,name",
    [
        (["--part", "small", "--job-n=x"], ("--part", "small", "--job-n=x"), "small", "x"),
        (["-vpgpu"], ("-vpgpu",), "gpu", None),
        (["-Jw"], ("-Jw",), None, "w"),  # -J takes "w" as the job name
        (["-J", "-wn2"], ("-J", "-wn2"), None, "-wn2"),
        (["--time", "10", "--mem=4G", "--hint", "nomultithread"], ("--time", "10", "--mem=4G", "--hint",
                                                                    "nomultithread"), None, None),
        (["--req", "--hol"], (), None, None),  # prefixes of what gandiva always sets: dropped
    ],
)
def test_other_spellings_pass_through(argv: list[str], passed: tuple[str, ...], part: str | None,
                                      name: str | None) -> None:
    r = parse_request([*argv, "--", "true"])
    assert (r.sbatch_options, r.partition, r.job_name) == (passed, part, name)


def test_sbatch_environment_variables_that_set_managed_options_are_refused() -> None:
    from slurm_gandiva.submit.request import check_environment

    check_environment({"SBATCH_PARTITION": "gpu", "SBATCH_GRES": ""})
    for var, option in (("SBATCH_GRES", "--gres"), ("SBATCH_GPUS_PER_NODE", "--gpus-per-node"),
                        ("SBATCH_SIGNAL", "--signal")):
        with pytest.raises(BadRequest, match=f"{var} sets sbatch's {option}, which gandiva manages: unset it"):
            check_environment({var: "x"})
    for var, option in (("SBATCH_EXCLUDE", "--exclude"), ("SBATCH_CONSTRAINT", "--constraint"),
                        ("SBATCH_EXCLUSIVE", "--exclusive")):
        with pytest.raises(BadRequest, match=f"{var} sets sbatch's {option}, which gandiva cannot honour: unset"):
            check_environment({var: "x"})


NODES_8CPU = ClusterLimits({"n1": 4, "n2": 4}, {"gpu": ("n1", "n2")}, node_cpus={"n1": 8, "n2": 8},
                           node_memory={"n1": 8000, "n2": 8000})


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["-n", "8", "--ntasks-per-node=4", "-c", "4", "--gpus", "1"],
         "needs 16 CPUs on a node (--cpus-per-task=4 --ntasks-per-node=4), but no node has more than 8"),
        (["-c16"], "needs 16 CPUs"),
        (["-vc", "9"], "needs 9 CPUs"),
        (["--cpus-per-t=9"], "needs 9 CPUs"),  # a prefix of --cpus-per-task
        (["--mincpus=12"], "needs 12 CPUs"),
        (["--gpus", "1:4", "--cpus-per-gpu=3"], "needs 12 CPUs on a node (--cpus-per-gpu=3 --gpus 4)"),
        (["--mem=9G"], "needs 9216 MB of memory on a node (--mem=9G), but no node has more than 8000 MB"),
        (["--mem-per-cpu=2G", "-c", "8"], "needs 16384 MB"),
        (["--mem-per-gpu=3000", "--gpus", "4"], "needs 12000 MB"),
    ],
)
def test_cpus_and_memory_no_node_can_hold_are_refused(argv: list[str], needle: str) -> None:
    with pytest.raises(BadRequest) as ei:
        validate(parse_request([*argv, "--", "true"]), NODES_8CPU)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "argv", [["-c8"], ["-c", "4", "--ntasks-per-node=2"], ["--mem=0", "-c8"], ["--mem=7G"], ["--mem=8000"],
             ["--gpus", "4", "--cpus-per-gpu=2"], ["-n", "64"], ["-c", "x"]],
)
def test_cpus_and_memory_a_node_can_hold_are_accepted(argv: list[str]) -> None:
    validate(parse_request([*argv, "--", "true"]), NODES_8CPU)
    validate(parse_request(["-c", "64", "--", "true"]), LIMITS)  # CPUs unknown: not checked


def test_sbatch_variables_for_cpus_and_memory_count_unless_an_option_overrides_them() -> None:
    req = parse_request(["--", "true"])
    with pytest.raises(BadRequest, match="needs 102400 MB"):
        validate(req, NODES_8CPU, env={"SBATCH_MEM_PER_NODE": "100G"})
    validate(parse_request(["--mem=1G", "--", "true"]), NODES_8CPU, env={"SBATCH_MEM_PER_NODE": "100G"})


# n1: many CPUs, little memory; n2: few CPUs, much memory; n3: no GPU (never counted).
MIXED = ClusterLimits({"n1": 4, "n2": 2, "n3": 0}, {"gpu": ("n1", "n2", "n3")},
                      node_cpus={"n1": 32, "n2": 8, "n3": 128}, node_memory={"n1": 8000, "n2": 64000, "n3": 10**6})


@pytest.mark.parametrize("argv", [["-c", "16"], ["--mem=32G"], ["-c", "8", "--mem=60G"], ["-c", "32", "--mem=8000"],
                                  ["--gpus", "2", "--cpus-per-gpu=16"]])
def test_a_request_some_node_can_hold_is_accepted(argv: list[str]) -> None:
    validate(parse_request([*argv, "--", "true"]), MIXED)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["-c", "64"], "needs 64 CPUs on a node (--cpus-per-task=64), but no node in partition gpu has more than 32"),
        (["--mem=100G"], "needs 102400 MB of memory on a node (--mem=100G), but no node in partition gpu has more "
                         "than 64000 MB"),
        (["-c", "16", "--mem=32G"], "no node in partition gpu has both the CPUs and the memory the request needs "
                                    "(--mem=32G --cpus-per-task=16): ask for fewer CPUs or less memory"),
    ],
)
def test_a_request_no_gpu_node_can_hold_is_refused(argv: list[str], needle: str) -> None:
    with pytest.raises(BadRequest) as ei:
        validate(parse_request(["-p", "gpu", *argv, "--", "true"]), MIXED)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_a_partition_the_controller_does_not_manage_is_refused() -> None:
    managed = replace(LIMITS, managed=("gpu",))
    with pytest.raises(BadRequest, match=r"^partition 'small' is not scheduled by gandiva: choose one of gpu$"):
        validate(parse_request(["-p", "small", "--", "true"]), managed)
    with pytest.raises(BadRequest, match="partition 'small' is not scheduled"):  # one of several
        validate(parse_request(["-p", "gpu,small", "--", "true"]), managed)
    with pytest.raises(BadRequest, match="partition 'small' is not scheduled"):  # Slurm's default, when known
        validate(parse_request(["--", "true"]), replace(managed, default_partition="small"))
    validate(parse_request(["-p", "gpu", "--", "true"]), managed)
    validate(parse_request(["--", "true"]), managed)  # the default partition not known: Slurm's choice
    validate(parse_request(["-p", "small", "--", "true"]), LIMITS)  # no controller config read: not checked


@pytest.mark.parametrize("gpus", ["8", "6", "3:8", "2"])
def test_a_job_wider_than_a_node_is_accepted_when_it_splits_evenly(gpus: str) -> None:
    validate(parse_request(["--gpus", gpus, "--", "true"]), LIMITS)
