"""Job-array groups in simulator traces: the `group` / `group_max` columns (CSV and JSON), their checks,
and every policy keeping a capped group within its throttle in the simulator."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.errors import TraceError
from slurm_gandiva.model import ClusterView, Job, Placement
from slurm_gandiva.plan import Plan
from slurm_gandiva.selector import POLICY_NAMES, make_policy
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.sim.engine import Overheads, PlanRejected, SimConfig, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob, load_philly, load_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---- parsing ------------------------------------------------------------------------------------

GOOD_CSV = (
    "job_id,submit_time,duration,gpus,group,group_max\n"
    "a,0,100,1,lr-search,2\n"
    "b,5,100,1,lr-search,2\n"
    "c,10,100,1,,\n"
    "d,15,100,2,sweep,\n"
    "e,20,100,1,lr-search,2\n"
)


def test_csv_groups_and_caps(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, "t.csv", GOOD_CSV))
    assert [(j.job_id, j.group, j.group_max) for j in tr.jobs] == [
        ("a", "lr-search", 2),
        ("b", "lr-search", 2),
        ("c", None, None),
        ("d", "sweep", None),
        ("e", "lr-search", 2),
    ]
    assert tr.groups == {"lr-search": ("a", "b", "e"), "sweep": ("d",)}
    assert tr.group_caps == {"lr-search": 2}  # sweep: a group without a throttle


def test_transformations_keep_the_groups(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, "t.csv", GOOD_CSV))
    for other in (tr.compressed(2.0), tr.capped(1), Trace(tr.name, tr.jobs[:2])):
        assert [(j.job_id, j.group, j.group_max) for j in other.jobs] == [
            (j.job_id, j.group, j.group_max) for j in tr.jobs[: len(other)]
        ]
    assert tr.compressed(2.0).group_caps == tr.capped(1).group_caps == {"lr-search": 2}


def test_json_groups_and_caps(tmp_path: Path) -> None:
    rows = [
        {"submit_time": 0, "duration": 10, "gpus": 1, "group": "hp", "group_max": 3},
        {"submit_time": 1, "duration": 10, "gpus": 1, "group": "hp", "group_max": "3"},
        {"submit_time": 2, "duration": 10, "gpus": 1, "group": 4711},  # an array id given as a number
        {"submit_time": 3, "duration": 10, "gpus": 1, "group": None, "group_max": None},
    ]
    tr = load_trace(write(tmp_path, "t.json", json.dumps({"jobs": rows}, indent=1)))
    assert [j.group for j in tr.jobs] == ["hp", "hp", "4711", None]
    assert tr.group_caps == {"hp": 3}
    assert tr.groups == {"hp": ("j0", "j1"), "4711": ("j2",)}


def test_no_groups_anywhere() -> None:
    assert load_philly(vc="2869ce", jobs=20).group_caps == {}
    assert load_philly(vc="2869ce", jobs=20).groups == {}


HEAD = "job_id,submit_time,duration,gpus,group,group_max\n"


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("a,0,1,1,,2\n", "{p}:2: group_max 2 without a group; name the group or drop it"),
        ("a,0,1,1,g,0\n", "{p}:2: group_max 0 must be >= 1 (jobs of the group that may run at once)"),
        ("a,0,1,1,g,-3\n", "{p}:2: group_max -3 must be >= 1 (jobs of the group that may run at once)"),
        ("a,0,1,1,g,two\n", "{p}:2: group_max 'two' is not a number; fix the row"),
        ("a,0,1,1,g,1.5\n", "{p}:2: group_max '1.5' is not a whole number; fix the row"),
        (
            "a,0,1,1,g,2\nb,0,1,1,h,5\nc,1,1,1,g,3\n",
            "{p}:4: group_max 3 for group 'g', but {p}:2 gave it group_max 2; rows of one group must agree",
        ),
        (
            "a,0,1,1,g,2\nb,1,1,1,g,\n",
            "{p}:3: no group_max for group 'g', but {p}:2 gave it group_max 2; rows of one group must agree",
        ),
    ],
)
def test_bad_csv_group_rows_name_file_and_line(tmp_path: Path, rows: str, message: str) -> None:
    p = write(tmp_path, "t.csv", HEAD + rows)
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    assert str(exc.value) == message.format(p=p)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"group_max": 2}, "{p}:9: group_max 2 without a group; name the group or drop it"),
        ({"group": "g", "group_max": 0}, "{p}:9: group_max 0 must be >= 1 (jobs of the group that may run at once)"),
        ({"group": "g", "group_max": "x"}, "{p}:9: group_max 'x' is not a number; fix the row"),
        ({"group": "g", "group_max": 2.5}, "{p}:9: group_max '2.5' is not a whole number; fix the row"),
        ({"group": ["g"]}, "{p}:9: group ['g'] is not a name; give a string or leave it out"),
        ({"group": True}, "{p}:9: group True is not a name; give a string or leave it out"),
        (
            {"group": "g", "group_max": 4},
            "{p}:9: group_max 4 for group 'g', but {p}:2 gave it group_max 2; rows of one group must agree",
        ),
    ],
)
def test_bad_json_group_rows_name_file_and_line(tmp_path: Path, extra: dict[str, object], message: str) -> None:
    rows = [
        {"submit_time": 0, "duration": 1, "gpus": 1, "group": "g", "group_max": 2},
        {"submit_time": 1, "duration": 1, "gpus": 1, **extra},
    ]
    p = write(tmp_path, "t.json", json.dumps(rows, indent=1))
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    assert str(exc.value) == message.format(p=p)


def test_a_trace_built_in_code_is_checked_too() -> None:
    with pytest.raises(TraceError, match="job b of group 'g' has group_max 3, an earlier job of it group_max 2"):
        Trace("t", (TraceJob("a", 0, 1, 1, group="g", group_max=2), TraceJob("b", 0, 1, 1, group="g", group_max=3)))
    with pytest.raises(TraceError, match="job a has group_max but no group"):
        Trace("t", (TraceJob("a", 0, 1, 1, group_max=2),))


# ---- simulation ---------------------------------------------------------------------------------

CAP = 2
# 8 one-GPU tasks of one array capped at 2, and 4 ungrouped jobs, on 8 GPUs: without the cap, all of the
# array would run at once; with it, its tasks take turns (or queue) while GPUs stay free.
GROUPED = tuple(f"hp{i}" for i in range(8))
TRACE = Trace(
    "groups",
    tuple(
        TraceJob(jid, 10.0 * i, 400.0, 1, model="cifar10", group="hp", group_max=CAP) for i, jid in enumerate(GROUPED)
    )
    + tuple(
        TraceJob(f"solo{i}", 15.0 + 60.0 * i, 300.0 + 100.0 * i, g, model=m)
        for i, (g, m) in enumerate(((1, "bert"), (2, "imagenet"), (1, "ncf"), (1, "yolov3")))
    ),
)
CONFIG = SimConfig(nodes=2, gpus_per_node=4, seed=1, overheads=Overheads(suspend=5.0, resume=10.0))


class Watched:
    """`inner` with the views it is given kept in `views` (every other attribute is the inner policy's)."""

    def __init__(self, inner: Policy, views: list[ClusterView]) -> None:
        self.inner = inner
        self.views = views

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def decide(self, view: ClusterView, now: float) -> Plan:
        self.views.append(view)
        return self.inner.decide(view, now)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_keeps_a_capped_group_within_its_cap(name: str) -> None:
    """At no round do more than CAP jobs of the array run (counted by job id, whatever the views carry),
    ungrouped jobs run beside them, and every job finishes."""
    peaks: list[tuple[float, int, int]] = []  # (time, jobs of the array running, all jobs running)
    views: list[ClusterView] = []

    def on_round(t: float, running: tuple[Job, ...]) -> None:
        peaks.append((t, sum(j.job_id in GROUPED for j in running), len(running)))

    res = Simulator(TRACE, Watched(make_policy(name), views), CONFIG).run(on_round=on_round)
    assert peaks and views
    over = [(t, k) for t, k, _ in peaks if k > CAP]
    assert not over, f"{name}: more than {CAP} jobs of the array ran at {over[:5]}"
    assert max(k for _, k, _ in peaks) == CAP  # the array does use its places
    assert any(n > CAP for _, k, n in peaks if k == CAP)  # with other jobs running beside it
    assert all(v.group_caps == {"hp": CAP} for v in views)
    assert all(j.spec.group == "hp" for v in views for j in v.jobs if j.job_id in GROUPED)
    unfinished = [j.job_id for j in res.jobs if j.finish is None]
    assert not unfinished, f"{name}: {unfinished} never finished"


def test_ungrouped_run_is_unchanged_by_the_observer() -> None:
    """`on_round` only watches: the same result with and without it, and the caps cost nothing when none."""
    trace = Trace("plain", tuple(replace(j, group=None, group_max=None) for j in TRACE.jobs))
    assert trace.group_caps == {}
    seen: list[int] = []
    a = Simulator(trace, make_policy("gandiva"), CONFIG).run(on_round=lambda t, r: seen.append(len(r)))
    b = Simulator(trace, make_policy("gandiva"), CONFIG).run()
    assert a.jobs == b.jobs and seen and max(seen) > CAP


class Greedy:
    """Starts every waiting job on free GPUs, caps or not (a policy bug the engine must catch)."""

    name = "greedy"
    quantum: float | None = None
    elastic = False

    def decide(self, view: ClusterView, now: float) -> Plan:
        free = list(view.free_gpus())
        targets: dict[str, Placement | None] = {}
        for job in view.waiting:
            if free:
                targets[job.job_id] = Placement((free.pop(0),))
        return Plan.from_targets(view, targets)


class Unruled(Simulator):
    """The policy's plan as it decided it, without the live round's rules."""

    def _round(self, view: ClusterView, running: object) -> Plan:
        return self.policy.decide(view, view.now)


def test_the_round_holds_a_group_to_its_cap_and_the_engine_rejects_a_plan_over_it() -> None:
    """The controller's group caps (the live round's) keep a policy that ignores them within them; a plan
    over a cap that reached the engine anyway is rejected."""
    trace = Trace(
        "t", tuple(TraceJob(f"t{i}", 0.0, 100.0, 1, model="cifar10", group="7", group_max=2) for i in range(3))
    )
    config = SimConfig(nodes=1, gpus_per_node=4)
    seen: list[int] = []
    res = Simulator(trace, Greedy(), config).run(on_round=lambda t, r: seen.append(len(r)))
    assert max(seen) == 2 and all(j.finish is not None for j in res.jobs)
    with pytest.raises(PlanRejected, match="greedy: plan runs 3 jobs of group 7 at once, over its cap of 2"):
        Unruled(trace, Greedy(), config).run()


def test_cli_summary_mentions_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, "t.csv", GOOD_CSV)
    assert main(["simulate", "--trace", str(p), "--gpus", "4", "--policy", "gandiva", "--no-progress"]) == 0
    assert "trace t: 5 jobs, 2 job group(s) (1 capped) over" in capsys.readouterr().err
