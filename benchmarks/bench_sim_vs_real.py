"""Sim-to-real: the demo's 12-job workload in the simulator vs on the real local Slurm cluster.

The real run is `gandiva demo` (its <state>/demo-results.json: submit times, per-job JCTs and the
samples/s the wrapper measured at each GPU count). The simulated run feeds the engine the same jobs
(same submit offsets, as Slurm recorded them, GPU ranges and total samples), the same policy, quantum
and controller tick (decisions only on the tick grid, rotations where the controller's fell), one speed
profile for the demo model built from the rates measured in the real run (the policy sees only the
rates a job has been measured at, as the controller does), and the costs of each mechanism measured in
that same run (--no-calibrate: benchmarks/results/requeue.json instead):

- start / resume / migrate / resize: from the decision's intent (controller store) to the wrapper's
  `fresh_start` / `resumed` event (Slurm start, process and torch start-up, checkpoint load);
- suspend: from the suspend's intent to its outcome (the GPUs are free);
- finish: from the wrapper's `training_done` to its `exit` (Slurm's end time is whole seconds: up to a
  second early, and a second decides at which tick the controller sees the GPUs free);
- launch: from a start / resume decision to Slurm running the job (the controller's slice opens then);
- each job's registration lag (the controller sees a submission at its next tick): the job's arrival in
  the simulator is its submission plus that lag, and its JCT is still counted from the submission.

Two simulations are printed side by side with the real run:

1. each start-up costing what that very start-up cost in the real run (a job's n-th start / resume /
   move, event by event), and the controller busy with each decision as long as it was (a tick that
   comes while a round still waits for Slurm is skipped, live and simulated), each slice opening and
   closing (service counts between) as long after its round's tick as it did, each job training at its
   own measured rates and its exit taking as long as it did (no earlier than the last round that saw
   it running): this checks the simulator's model of the controller (ticks, rotations, service
   accounting, placement, what the policy knows), and gives the verdict: PASS when every job's JCT is
   within the tolerance (15%). With the controller's round log (`round_log`; the demo keeps one) the
   rounds are attributed exactly, and the first round whose simulated decisions differ from the real
   ones is printed with what each side saw of the jobs concerned;
2. the fitted cost model (base per action + per GPU beyond one + per other job starting in the same
   round), as capacity planning would use it, with how far each job's simulated JCT moves when every
   cost is off by up to 25% (a job that moves a lot ends near a rotation: a second decides whether it
   waits a whole round).

    sudo .venv/bin/python benchmarks/bench_sim_vs_real.py                 # runs the demo first (~4 min)
    .venv/bin/python benchmarks/bench_sim_vs_real.py --reuse --state-dir /tmp/gandiva-demo   # an earlier run
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_gandiva.controller.service import round_record
from slurm_gandiva.demo import DEFAULT_STATE_DIR, RESULTS_FILE, ROUND_LOG, WORKLOAD, Demo, DemoResult, JobResult
from slurm_gandiva.model import ClusterView, JobSpec, RateTable
from slurm_gandiva.plan import Decision, Plan
from slurm_gandiva.profiles import ModelProfile
from slurm_gandiva.sim.engine import Overheads, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.trace import Trace, TraceJob

REPO = Path(__file__).resolve().parent.parent
MODEL = "demo"
ROUND_S = 1.5  # decisions recorded this close together belong to one controller round
WAVE_GAP_S = 0.5  # a round's next wave begins this soon after the last one's outcome
SNAPSHOT_S = 0.1  # a round's Slurm snapshot is taken this soon after its time (`at`)


def speed_profile(
    real: DemoResult, gpus_per_node: int = 4, nodes: int = 2, own: JobResult | None = None
) -> ModelProfile:
    """One profile for the demo model: step time by GPU count from the rates measured in the real run
    (their medians over the jobs; with `own`, that job's own rates where it was measured).

    local_bsz = 1 sample, so step_time(k) = k / rate(k). Counts never measured are interpolated
    linearly between measured ones (flat above the largest); a placement over two nodes is given the
    rate of the largest single-node count (no gain), so the engine never prefers spreading.
    """
    by_k: dict[int, list[float]] = {}
    for j in real.jobs:
        for k, r in j.rates:
            by_k.setdefault(k, []).append(r)
    if 1 not in by_k:
        raise SystemExit("the real run measured no 1-GPU rate: cannot build the speed profile")
    known = {k: statistics.median(v) for k, v in sorted(by_k.items())}
    if own is not None:
        known.update(own.rates)
        known = dict(sorted(known.items()))
    rate: dict[int, float] = {}
    for k in range(1, gpus_per_node + 1):
        lower = max(x for x in known if x <= k)
        upper = [x for x in known if x >= k]
        if k in known or not upper:
            rate[k] = known.get(k, known[lower])
        else:
            hi = min(upper)
            rate[k] = known[lower] + (k - lower) / (hi - lower) * (known[hi] - known[lower])
    best = rate[gpus_per_node]
    cross = {(n, k): k / best for n in range(2, nodes + 1) for k in range(2, n * gpus_per_node + 1)}
    name = MODEL if own is None else f"{MODEL}-{own.job_id}"
    return ModelProfile(name, 1, {(k,): k / r for k, r in rate.items()}, cross)


@dataclass(frozen=True)
class Measured:
    """Costs measured in one real run (medians, seconds) and each job's registration lag."""

    overheads: Overheads
    lag: dict[str, float]
    counts: dict[str, int]
    submit: dict[str, float]  # each job's submission time as the controller saw it (Slurm's)
    events: dict[str, list[float]]  # each job's start / resume / move costs, in order
    acts: dict[str, list[float]]  # how long the actor was busy with each of the job's decisions, in order
    exits: dict[str, float]  # each job's last sample -> its process exit
    launches: dict[str, list[float]] = field(default_factory=dict)  # round's tick -> slice opened, in order
    stops: dict[str, list[float]] = field(default_factory=dict)  # round's tick -> suspended (slice closed)


def _median(xs: list[float], default: float) -> float:
    return statistics.median(xs) if xs else default


def _solve(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns); singular columns get 0."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
         for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[piv][c]) < 1e-12:
            continue
        a[c], a[piv] = a[piv], a[c]
        for r in range(n):
            if r != c and a[r][c]:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    return [a[i][n] / a[i][i] if abs(a[i][i]) >= 1e-12 else 0.0 for i in range(n)]


def round_times(
    acted: list[tuple[float, float]], tick: float, rounds: Sequence[float] = ()
) -> list[float]:
    """For each decision (intent, outcome), how long after its round's tick it was done: the controller's
    rounds start at multiples of the tick (unix time) and its next tick waits for the whole round.

    With the controller's round log, `rounds` are the times of the rounds that decided something: a
    decision belongs to the last one before its intent. Without it, a round is the decisions the actor
    carried out without a pause (the next intent within `WAVE_GAP_S` of the last outcome so far: waves),
    and it began at the tick before its first intent (observing and deciding come first)."""
    out = [0.0] * len(acted)
    marks = sorted(rounds)
    start = end = -math.inf
    for i in sorted(range(len(acted)), key=lambda i: acted[i][0]):
        intent, outcome = acted[i]
        k = bisect.bisect_right(marks, intent + 1e-6)
        if k:
            start = math.floor(marks[k - 1] / tick + 1e-9) * tick if tick > 0 else marks[k - 1]
        elif intent > end + WAVE_GAP_S:
            start = math.floor(intent / tick) * tick if tick > 0 else intent
        end = max(end, outcome) if intent <= end + WAVE_GAP_S else outcome
        out[i] = outcome - start
    return out


def fit_costs(samples: list[tuple[str, int, int, float]]) -> tuple[dict[str, float], float, float]:
    """Least squares of cost = base[action] + per_gpu * (GPUs - 1) + crowd * (other jobs starting in the
    same round) over (action, GPUs, others, cost) samples: one intercept per action, shared slopes; a
    slope that comes out negative (or cannot be told from the data) is 0 and the rest refitted.
    Returns (base by action, per_gpu, crowd); intercepts are at least 0."""
    actions = sorted({a for a, _, _, _ in samples})
    slopes = ["per_gpu", "crowd"]

    def x(name: str, gpus: int, others: int) -> float:
        return float(gpus - 1 if name == "per_gpu" else others)

    while True:
        rows = [[1.0 if a == b else 0.0 for b in actions] + [x(s, g, n) for s in slopes] for a, g, n, _ in samples]
        coef = _solve(rows, [c for *_, c in samples])
        neg = [i for i, _ in enumerate(slopes) if coef[len(actions) + i] < 0]
        if not neg:
            break
        del slopes[neg[0]]
    fitted = dict(zip(slopes, coef[len(actions) :], strict=True))
    base = {a: max(0.0, c) for a, c in zip(actions, coef[: len(actions)], strict=True)}
    return base, fitted.get("per_gpu", 0.0), fitted.get("crowd", 0.0)


def read_rounds(state_dir: Path) -> list[dict[str, Any]]:
    """The controller's round log of a demo run (`ROUND_LOG`; empty when it kept none)."""
    log = state_dir / "controller" / ROUND_LOG
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def measure(state_dir: Path, real: DemoResult, fallback: Overheads) -> Measured:
    """The mechanisms' costs in the real run, from the controller's store and the wrapper's event logs.

    A start-up's cost grows with the job's GPUs (a training process each) and with the number of jobs
    starting in the same round (on this machine every node shares two cores): it is fitted as
    base[action] + per_gpu x (GPUs - 1) + crowd x (others starting then). `launch` is the median time
    from a start or resume decision to Slurm running the job (when the controller opens the slice)."""
    from job_wrapper.progress import read_events
    from slurm_gandiva.plan import Action
    from slurm_gandiva.store import Outcome, Store

    db = state_dir / "controller" / "gandiva.db"
    if not db.is_file():
        raise SystemExit(f"{db} is missing: pass the --state-dir of the demo run, or --no-calibrate")
    jobs_dir = state_dir / "cluster" / "jobs"
    starts: list[tuple[str, float, int, float]] = []  # (action, intent, GPUs, cost)
    launches: list[float] = []
    by_job: dict[str, list[float]] = {}  # each job's start-up costs, in order
    acts: dict[str, list[float]] = {}
    acted: list[tuple[str, float, float]] = []  # (job, intent, outcome) of every decision carried out
    replayed: list[tuple[str, int | None, float]] = []  # (job, its decision in `acted`, training began)
    opened: list[tuple[str, int, float]] = []  # (job, its decision in `acted`, its slice opened)
    stopped: list[tuple[str, int]] = []  # (job, its suspend in `acted`)
    suspends: list[float] = []
    exits: dict[str, float] = {}
    lag: dict[str, float] = {}
    submit: dict[str, float] = {}
    last_running: dict[str, float] = {}  # the last round that saw each job running (with a round log)
    rounds = read_rounds(state_dir)
    for rnd in rounds:
        for seen in rnd["jobs"]:
            if seen["state"] == "running":
                last_running[seen["job"]] = max(last_running.get(seen["job"], -math.inf), rnd["at"])
    store = Store(f"sqlite:///{db}")
    try:
        for j in real.jobs:
            rec = store.get_job(j.job_id)
            if rec is not None:
                lag[j.job_id] = max(0.0, rec.created - j.submitted)
                submit[j.job_id] = rec.spec.submit_time
            events = read_events(jobs_dir / j.job_id / "events.jsonl")
            trained = sorted(float(e["time"]) for e in events if e.get("event") in ("fresh_start", "resumed"))
            done = [float(e["time"]) for e in events if e.get("event") == "training_done"]
            gone = [float(e["time"]) for e in events if e.get("event") == "exit" and e.get("outcome") == "done"]
            if done and gone:
                # The controller frees a job's GPUs when Slurm says it ended, a little after the process
                # exit: a round that still saw it running bounds that from below.
                seen = last_running.get(j.job_id, -math.inf) + SNAPSHOT_S
                exits[j.job_id] = max(0.0, max(gone[-1], seen) - done[-1])
            slices = store.slices(job_ids=[j.job_id])
            for d in store.decisions(job_ids=[j.job_id]):
                if d.outcome is not Outcome.SUCCEEDED:
                    continue
                if d.outcome_at is not None:
                    acted.append((j.job_id, d.intent_at, d.outcome_at))
                    if d.action is not Action.SUSPEND:
                        s_open = next((s.start for s in slices if s.start >= d.intent_at - 0.5), None)
                        if s_open is not None:
                            opened.append((j.job_id, len(acted) - 1, s_open))
                if d.action is Action.SUSPEND:
                    if d.outcome_at is not None:
                        suspends.append(d.outcome_at - d.intent_at)
                        stopped.append((j.job_id, len(acted) - 1))
                    continue
                if d.action in (Action.START, Action.RESUME) and d.outcome_at is not None:
                    launches.append(d.outcome_at - d.intent_at)
                began = next((t for t in trained if t >= d.intent_at), None)
                if began is not None and d.placement is not None:
                    starts.append((d.action.value, d.intent_at, d.placement.count, began - d.intent_at))
                    # Replayed from the round's tick, where the simulator decides (a start in a later wave
                    # of its round waits for the earlier ones).
                    replayed.append((j.job_id, len(acted) - 1 if d.outcome_at is not None else None, began))
    finally:
        store.close()
    samples = [(a, g, sum(1 for _, t2, _, _ in starts if abs(t2 - t) < ROUND_S) - 1, c) for a, t, g, c in starts]
    took = round_times([(i, o) for _, i, o in acted], real.tick, [r["at"] for r in rounds if r["decisions"]])
    for (jid, _, _), t in zip(acted, took, strict=True):
        acts.setdefault(jid, []).append(t)

    def tick_of(k: int) -> float:
        """The tick that began the round of decision `acted[k]`."""
        return acted[k][2] - took[k]

    for jid, k, began in replayed:
        by_job.setdefault(jid, []).append(began - (tick_of(k) if k is not None else began))
    launched: dict[str, list[float]] = {}
    for jid, k, at in opened:
        launched.setdefault(jid, []).append(max(0.0, at - tick_of(k)))
    stops: dict[str, list[float]] = {}
    for jid, k in stopped:
        stops.setdefault(jid, []).append(took[k])
    base, per_gpu, crowd = fit_costs(samples)
    start = base.get(Action.START.value, fallback.start)
    resume = base.get(Action.RESUME.value, max(start, fallback.resume))
    suspend = _median(suspends, fallback.suspend)
    over = replace(
        fallback,
        start=start,
        resume=resume,
        suspend=suspend,
        migrate=base.get(Action.MIGRATE.value, suspend + resume),
        resize=base.get(Action.RESIZE.value, suspend + resume),
        finish=_median(list(exits.values()), 0.0),
        crowd=crowd,
        per_gpu=per_gpu,
        launch=_median(launches, 0.0),
        source=f"measured in the real run ({db})",
    )
    counts = {a: sum(1 for x, *_ in samples if x == a) for a in base}
    counts["suspend"] = len(suspends)
    counts["finish"] = len(exits)
    return Measured(over, lag, counts, submit, by_job, acts, exits, launched, stops)


class WorkloadSimulator(Simulator):
    """The engine with each job's GPU range as submitted (the engine widens elastic ranges to 1..max) and
    its arrival when the controller registered it (`arrive`, simulated seconds)."""

    def __init__(
        self,
        *args: Any,
        ranges: dict[str, tuple[int, int]],
        arrive: dict[str, float] | None = None,
        replay: dict[str, list[float]] | None = None,
        acts: dict[str, list[float]] | None = None,
        exits: dict[str, float] | None = None,
        launches: dict[str, list[float]] | None = None,
        stops: dict[str, list[float]] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.ranges = ranges
        self.arrive = arrive or {}
        self.replay = replay
        self.acts = acts
        self.exits = exits or {}
        self.launches = launches
        self.stops = stops
        self._seen: dict[tuple[str, str], int] = {}

    def _measured(self, kind: str, table: dict[str, list[float]] | None, job_id: str) -> float | None:
        """The job's next value of `kind` from `table` (its n-th call, n-th value); None past the end."""
        n = self._seen.get((kind, job_id), 0)
        self._seen[(kind, job_id)] = n + 1
        values = (table or {}).get(job_id, [])
        return values[n] if n < len(values) else None

    def act_seconds(self, d: Decision) -> float:
        """With `acts`, the actor is busy with a job's n-th decision as long as it was in the real run."""
        took = self._measured("act", self.acts, d.job_id)
        return took if took is not None else super().act_seconds(d)

    def suspend_seconds(self, d: Decision) -> float:
        """With `stops`, a job's n-th suspend closes its slice as long after its round's tick as it did in
        the real run (a later wave of a round stops later)."""
        took = self._measured("stop", self.stops, d.job_id)
        return took if took is not None else super().suspend_seconds(d)

    def launch_seconds(self, d: Decision) -> float:
        """With `launches`, a job's n-th slice opens (its service counts) as long after its round's tick
        as it did in the real run."""
        took = self._measured("launch", self.launches, d.job_id)
        return took if took is not None else super().launch_seconds(d)

    def training_begins(self, d: Decision, gpus: int, crowd: float, t: float, ready: float) -> float:
        """With `replay`, a job's n-th start / resume / move trains as long after its round's tick as it
        did in the real run (that includes waiting for the GPUs' previous jobs to checkpoint; the model
        when the real job had fewer)."""
        took = self._measured("startup", self.replay, d.job_id)
        return max(ready, t + took) if took is not None else super().training_begins(d, gpus, crowd, t, ready)

    def make_jobs(self) -> list[Any]:
        recs = super().make_jobs()
        for r in recs:
            lo, hi = self.ranges[r.job.job_id]
            # Any number of nodes, as the live controller's default `max_nodes` tells the policies.
            spec: JobSpec = replace(r.job.spec, min_gpus=lo, max_gpus=hi, max_nodes=None)
            # The controller knows no scaling table for the demo model: only what it measures.
            r.job = replace(r.job, spec=spec, rates=RateTable())
            r.arrive = max(spec.submit_time, self.arrive.get(spec.job_id, spec.submit_time))
            r.exit_cost = self.exits.get(spec.job_id, r.exit_cost)
        return recs


def make_policy_for(real: DemoResult) -> Any:
    """The real run's policy with its parameters (as the controller's config parsed them)."""
    from slurm_gandiva.config import parse_config
    from slurm_gandiva.selector import make_policy

    lines = [f"quantum = {real.quantum:g}", f"policy = {real.policy}"]
    lines += [f"policy.{k} = {v}" for k, v in real.params]
    params = parse_config("\n".join(lines), "demo-results").params
    if "quantum" not in params:
        params["quantum"] = real.quantum
    return make_policy(real.policy, **params)


class _Recording:
    """A policy that records each round as the controller's `round_log` does (simulated seconds)."""

    def __init__(self, policy: Any, rounds: list[dict[str, Any]]) -> None:
        self._policy = policy
        self._rounds = rounds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def decide(self, view: ClusterView, now: float) -> Plan:
        plan: Plan = self._policy.decide(view, now)
        self._rounds.append(round_record(view, plan))
        return plan


def _decided(rnd: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((d["job"], d["action"], d["gpus"]) for d in rnd["decisions"])


def first_divergence(
    real_rounds: list[dict[str, Any]], sim_rounds: list[dict[str, Any]], t0: float, tick: float
) -> str | None:
    """The first round (on the tick grid) whose real and simulated decisions differ: both decision sets and
    what each side saw of the jobs concerned, where they saw them differently; None when none differ."""
    step = tick if tick > 0 else 1.0

    def by_time(rounds: list[dict[str, Any]], origin: float) -> dict[float, dict[str, Any]]:
        return {round((r["at"] - origin) / step) * step: r for r in rounds}

    real, sim = by_time(real_rounds, t0), by_time(sim_rounds, 0.0)
    for at in sorted(set(real) | set(sim)):
        r, s = real.get(at), sim.get(at)
        rd, sd = _decided(r) if r else [], _decided(s) if s else []
        if rd == sd:
            continue
        lines = [f"first round that differs: {at:.0f} s", f"  real: {_what(r, rd)}", f"  sim:  {_what(s, sd)}"]
        if r is not None and s is not None:
            seen = {j["job"]: j for j in s["jobs"]}
            live = {j["job"] for j in r["jobs"]}
            lines += [
                f"  job {j['job']}: the simulator sees it {j['state']}, the real run does not"
                for j in s["jobs"] if j["job"] not in live
            ]
            for j in r["jobs"]:
                o = seen.get(j["job"])
                if o is None:
                    lines.append(f"  job {j['job']}: real sees it {j['state']}, the simulator does not")
                    continue
                diffs = [
                    f"{k} {_show(j[k], t0)} vs {_show(o[k], 0.0)}"
                    for k in ("state", "gpus", "service", "slice_start", "left_s", "held_indices")
                    if _differs(k, j[k], o[k], t0)
                ]
                if diffs:
                    lines.append(f"  job {j['job']} (real vs sim): " + "; ".join(diffs))
        return "\n".join(lines)
    return None


def _what(rnd: dict[str, Any] | None, decided: list[tuple[str, str, str]]) -> str:
    if rnd is None:
        return "no round (the tick was skipped or fell elsewhere)"
    return ", ".join(f"{a} {j}" + (f" on {g}" if g else "") for j, a, g in decided) or "nothing"


def _show(v: Any, origin: float) -> str:
    return f"{v - origin:.1f}" if isinstance(v, float) and v > 1e6 else str(v)


def _differs(key: str, a: Any, b: Any, t0: float) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if key == "slice_start":
            a = a - t0
        return abs(a - b) > 0.5
    return bool(a != b)


def origin_of(real: DemoResult, policy_submit: dict[str, float] | None = None) -> float:
    """The unix time of the simulation's 0 s: a multiple of the quantum at or before the first submission."""
    step = real.quantum if real.quantum > 0 else 1.0
    return math.floor(min([j.submitted for j in real.jobs] + list((policy_submit or {}).values())) / step) * step


def simulate(
    real: DemoResult,
    overheads: Overheads,
    lag: dict[str, float] | None = None,
    policy_submit: dict[str, float] | None = None,
    replay: dict[str, list[float]] | None = None,
    acts: dict[str, list[float]] | None = None,
    exits: dict[str, float] | None = None,
    launches: dict[str, list[float]] | None = None,
    rounds: list[dict[str, Any]] | None = None,
    own_rates: bool = False,
    stops: dict[str, list[float]] | None = None,
) -> tuple[SimResult, dict[str, float | None]]:
    """The real run's jobs in the simulator (2 nodes x 4 GPUs, the same policy, quantum and tick).

    Each job arrives `lag[job]` s after its submission (when the controller registered it); the policy
    sees the submission time the controller saw (`policy_submit`: Slurm's, in whole seconds, so jobs
    submitted in the same second tie as they did live). Returns the result and each job's simulated JCT
    counted from its real submission. With `replay`, each job's start-ups take what they did in the real
    run, event by event (`WorkloadSimulator.training_begins`); with `exits` each job's exit too, with
    `launches` each slice's opening (when its service starts to count), with `stops` each suspend's slice
    close. `rounds` collects each round's record (`round_record`, simulated seconds). With `own_rates`
    each job trains at its own measured rates (jobs that share a node's two cores differ by a few
    percent), else at the medians over all jobs."""
    shared = speed_profile(real)
    profiles = {MODEL: shared}
    lag = lag or {}
    seen = policy_submit or {}
    # The simulated clock starts at a multiple of the quantum: rotations fall where the controller's did
    # (at multiples of the quantum in unix time).
    t0 = origin_of(real, seen)
    jobs = []
    for j in real.jobs:
        profile = speed_profile(real, own=j) if own_rates else shared
        profiles[profile.name] = profile
        rate = profile.throughput((j.min_gpus,))
        at = seen.get(j.job_id, j.submitted) - t0
        jobs.append(
            TraceJob(j.job_id, at, j.total_samples / rate, j.min_gpus, profile.name, "gandiva-demo", j.max_gpus)
        )
    jobs.sort(key=lambda tj: (tj.submit_time, int(tj.job_id)))
    # Fake GPUs: where a job's GPUs sit changes nothing (no locality penalty), as in the real run.
    # The controller's rounds fall on multiples of its tick (unix time), and it registers a job in a round.
    tick = real.tick
    origin = math.ceil(t0 / tick) * tick - t0 if tick > 0 else None

    def registered(at: float) -> float:
        return at if origin is None else origin + math.floor((at - origin) / tick + 1e-9) * tick

    config = SimConfig(
        nodes=2,
        gpus_per_node=4,
        overheads=overheads,
        seed=0,
        tick=tick if tick > 0 else None,
        tick_origin=origin,
        learn_rates=True,
        locality_penalty=0.0,
        requeue_ties=real.requeue_ties,  # as the real run's Slurm did
        same_gpus_per_node=True,  # Slurm's per-node gres, as the controller's view says
    )
    sim = WorkloadSimulator(
        Trace("demo", tuple(jobs)),
        make_policy_for(real) if rounds is None else _Recording(make_policy_for(real), rounds),
        config,
        profiles=profiles,
        ranges={j.job_id: (j.min_gpus, j.max_gpus) for j in real.jobs},
        arrive={j.job_id: registered(j.submitted - t0 + lag.get(j.job_id, 0.0)) for j in real.jobs},
        replay=replay,
        acts=acts,
        exits=exits,
        launches=launches,
        stops=stops,
    )
    res = sim.run()
    submitted = {j.job_id: j.submitted - t0 for j in real.jobs}
    jct = {r.job_id: None if r.finish is None else r.finish - submitted[r.job_id] for r in res.jobs}
    return res, jct


def sensitivity(
    real: DemoResult,
    overheads: Overheads,
    lag: dict[str, float] | None = None,
    policy_submit: dict[str, float] | None = None,
    *,
    draws: int = 20,
    spread: float = 0.25,
    seed: int = 0,
) -> dict[str, float]:
    """Each job's largest relative JCT change in the simulator when every cost (start, suspend, resume,
    migrate, resize, crowd, finish) is off by up to `spread`, drawn independently `draws` times.

    A job that moves a lot ends near a slice boundary (a second of jitter decides whether it is
    suspended with a few seconds left): no simulator can be held to such a job one by one."""
    _, base = simulate(real, overheads, lag, policy_submit)
    rng = random.Random(seed)
    worst = dict.fromkeys(base, 0.0)

    def off(x: float | None) -> float | None:
        return None if x is None else x * rng.uniform(1.0 - spread, 1.0 + spread)

    for _ in range(draws):
        o = replace(
            overheads,
            start=off(overheads.start) or 0.0,
            suspend=off(overheads.suspend) or 0.0,
            resume=off(overheads.resume) or 0.0,
            migrate=off(overheads.migrate),
            resize=off(overheads.resize),
            finish=off(overheads.finish) or 0.0,
            crowd=off(overheads.crowd) or 0.0,
        )
        _, got = simulate(real, o, lag, policy_submit)
        for jid, b in base.items():
            g = got.get(jid)
            if b is not None and g is not None and b > 0:
                worst[jid] = max(worst[jid], abs(g / b - 1.0))
            else:
                worst[jid] = math.inf
    return worst


def compare(
    real: DemoResult,
    sim: SimResult,
    sim_jct: dict[str, float | None],
    tolerance: float,
    spread: dict[str, float] | None = None,
) -> bool:
    """Print the per-job table (with each job's `sensitivity` when given); True when all are within."""
    spread = spread or {}
    o = sim.overheads
    print(
        f"Slurm {real.slurm}; policy {real.policy}, quantum {real.quantum:g} s, tick {real.tick:g} s; "
        f"overheads {o.source}:\n"
        f"  start {o.start:.1f} s, suspend {o.suspend:.1f} s, resume {o.resume:.1f} s, "
        f"migrate {o.migrate or 0:.1f} s, resize {o.resize or 0:.1f} s, finish {o.finish:.1f} s, "
        f"+{o.per_gpu:.1f} s per GPU beyond one, +{o.crowd:.1f} s per other job starting in the same round, "
        f"slices counted from {o.launch:.1f} s after the decision"
    )
    print(
        f"{'job':>6} {'name':<4} {'gpus':<5} {'real JCT s':>10} {'sim JCT s':>10} {'sim/real':>8}  within"
        + ("  sim moves (costs +-25%)" if spread else "")
    )
    ok = True
    real_jcts, sim_jcts = [], []
    for j in sorted(real.jobs, key=lambda j: int(j.job_id)):
        rj = j.jct
        sj = sim_jct.get(j.job_id)
        gpus = f"{j.min_gpus}" if j.min_gpus == j.max_gpus else f"{j.min_gpus}:{j.max_gpus}"
        if rj is None or sj is None or rj <= 0:
            print(f"{j.job_id:>6} {j.name:<4} {gpus:<5} {rj!s:>10} {sj!s:>10} {'-':>8}  NO (unfinished)")
            ok = False
            continue
        ratio = sj / rj
        good = abs(ratio - 1.0) <= tolerance
        ok &= good
        real_jcts.append(rj)
        sim_jcts.append(sj)
        moves = f"  {spread[j.job_id]:6.0%}" if j.job_id in spread else ""
        within = "yes" if good else "NO "
        print(f"{j.job_id:>6} {j.name:<4} {gpus:<5} {rj:10.1f} {sj:10.1f} {ratio:8.2f}  {within}{moves}")
    if real_jcts:
        ra, sa = statistics.mean(real_jcts), statistics.mean(sim_jcts)
        print(f"{'mean':>6} {'':<4} {'':<5} {ra:10.1f} {sa:10.1f} {sa / ra:8.2f}")
    verdict = "PASS" if ok else "FAIL"
    print(
        f"{verdict}: every job's simulated JCT within {tolerance:.0%} of the real one"
        if ok
        else f"{verdict}: some jobs' simulated JCT is more than {tolerance:.0%} off the real one"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", type=Path, help="demo-results.json of a real run (its folder is the demo state dir)")
    ap.add_argument("--reuse", action="store_true", help="compare the run already in --state-dir, do not run")
    ap.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help="demo state dir")
    ap.add_argument("--overheads", type=Path, default=REPO / "benchmarks" / "results" / "requeue.json")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="do not measure the costs in the real run (use --overheads, else the simulator's guesses)",
    )
    ap.add_argument(
        "--no-sensitivity",
        dest="sensitivity",
        action="store_false",
        help="do not print how far each simulated JCT moves when the measured costs are off by 25%%",
    )
    args = ap.parse_args(argv)
    path = args.real or args.state_dir / RESULTS_FILE
    if args.real is None and not args.reuse:
        demo = Demo(args.state_dir, workload=WORKLOAD)
        if demo.run() != 0:
            print("the real run failed: no comparison", file=sys.stderr)
            return 1
    real = DemoResult.from_json(path.read_text())
    overheads = Overheads.from_file(args.overheads) if args.overheads.is_file() else Overheads()
    lag: dict[str, float] = {}
    submit: dict[str, float] = {}
    events: dict[str, list[float]] | None = None
    acts: dict[str, list[float]] | None = None
    exits: dict[str, float] | None = None
    launches: dict[str, list[float]] | None = None
    stops: dict[str, list[float]] | None = None
    if args.calibrate:
        m = measure(path.parent, real, overheads)
        overheads, lag, submit, events, acts, exits = m.overheads, m.lag, m.submit, m.events, m.acts, m.exits
        launches, stops = m.launches, m.stops
        print("measured in the real run (decisions): " + ", ".join(f"{k} {n}" for k, n in sorted(m.counts.items())))
        if lag:
            print(f"registration lag: median {statistics.median(lag.values()):.1f} s over {len(lag)} jobs")
    elif overheads.source == "guess":
        print(f"note: {args.overheads} is missing: suspend/migrate costs are the simulator's guesses")
    r_sus = sum(sum(1 for *_, why in j.slice_log if why == "quantum") for j in real.jobs)
    ok = True
    if events is not None:
        rounds: list[dict[str, Any]] = []
        sim, sim_jct = simulate(
            real, overheads, lag, submit, replay=events, acts=acts, exits=exits, launches=launches, rounds=rounds,
            own_rates=True, stops=stops,
        )
        print(
            f"\n1. Each start-up costing what it cost in the real run, event by event (suspends: real {r_sus}, "
            f"simulated {sum(j.suspends for j in sim.jobs)}):"
        )
        ok = compare(real, sim, sim_jct, args.tolerance)
        real_rounds = read_rounds(path.parent)
        if real_rounds:
            diff = first_divergence(real_rounds, rounds, origin_of(real, submit), real.tick)
            print(diff or "every round decided the same, live and simulated")
        print("\n2. The fitted cost model instead (what capacity planning uses; informational):")
    sim, sim_jct = simulate(real, overheads, lag, submit)
    print(f"suspends: real {r_sus}, simulated {sum(j.suspends for j in sim.jobs)}")
    spread = sensitivity(real, overheads, lag, submit) if args.sensitivity else None
    model_ok = compare(real, sim, sim_jct, args.tolerance, spread)
    return 0 if (ok if events is not None else model_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
