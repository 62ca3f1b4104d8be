"""`gandiva simulate`: run one policy, or compare several, over a trace on a simulated cluster."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from slurm_gandiva.errors import ConfigError

_EPILOG = """\
traces:
  --trace philly (default) reads the packaged Philly trace: pick a virtual cluster with --vc
  (e.g. 2869ce, 0e4a51, 7f04ca, ee9e8c, 11cb48), the first --jobs N by submission, and compress
  arrivals by --load F (2.0 = twice as dense).
  --trace FILE reads our own format, CSV with a header or JSON (a list of objects or {"jobs": [...]}):
    submit_time  seconds from the trace start (required)
    duration     seconds on `gpus` GPUs at the best placement (required)
    gpus         GPUs asked for (required)
    job_id, model (bert|cifar10|deepspeech2|imagenet|ncf|yolov3), user, max_gpus (>= gpus) (optional)
    account      the user's account, a tenant for --fairness shares (optional; default: one account)
    group        jobs with the same name form one search, a job array (optional)
    group_max    the most jobs of the group that may run at once, >= 1 (an array's %MAX; the same
                 on every row of the group; optional, needs group)
  e.g.  job_id,submit_time,duration,gpus,model
        a,0,3600,1,cifar10
  A malformed row, or a column (key) not listed here, is reported with its file and line number.
  --load F compresses its arrivals too. A job asking for more GPUs than --gpus is refused unless
  --cap-gpus is given (then it runs on all of them, with a warning).

fairness: --fairness shares runs the chosen policy under the fair-share layer (selector/fairshare.py, the
  controller's): each round the GPUs are split between accounts by --shares (1 each unless named), then
  equally between the users of an account, work-conserving; the policy decides within each tenant.
  --steer-grows (gandiva.conf: fairness_steer_grows = yes) hands an elastic policy's spare GPUs to the
  jobs of tenants below their share first (off by default: it cost 10-12% average JCT on Philly).
  A trace with more than one tenant (account, user) also gets a table per policy: each tenant's
  average and worst finish-time fairness rho (a job's JCT over its JCT when its tenant runs alone on
  floor(GPUs x its share) GPUs, same policy), GPU-hours received against its share, Jain's index.

overheads: each start/resume/migrate/resize/pack costs seconds without progress; the defaults come from
  benchmarks/results/requeue.json when it exists (measured on the real cluster), else guesses
  (suspend 5 s, resume 10 s, migrate/resize/pack = suspend + resume). Override with --overheads FILE
  or the --*-cost options.

examples:
  gandiva simulate --vc 7f04ca --jobs 500 --policy afs-l --out /tmp/sim
  gandiva simulate --vc ee9e8c --jobs 500 --load 1.5 --compare fifo,srtf,tiresias,gandiva,afs-l,afs-p,default
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="trace-driven simulation of a policy (or --compare several)",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", default="philly", help="'philly' (packaged) or a CSV/JSON trace file")
    p.add_argument("--vc", help="Philly virtual cluster id (default: all clusters)")
    p.add_argument("--jobs", type=int, help="use the first N jobs")
    p.add_argument(
        "--load", type=float, default=1.0, help="arrival compression factor, > 0, for any trace (default 1.0)"
    )
    p.add_argument(
        "--cap-gpus",
        action="store_true",
        help="run jobs that ask for more GPUs than the cluster has on all of them (default: refuse the trace)",
    )
    p.add_argument("--gpus", type=int, default=64, help="GPUs in the cluster (default 64)")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--gpus-per-switch", type=int, default=2)
    p.add_argument("--sockets", type=int, default=2)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--policy", default="default", help="policy name (default: default)")
    g.add_argument("--compare", help="comma-separated policy names to run on the same jobs")
    p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="policy parameter (repeatable), e.g. --param quantum=120; with --compare it goes to every policy",
    )
    p.add_argument(
        "--fairness", choices=("none", "shares"), default="none", help="tenants' fair shares (default none)"
    )
    p.add_argument("--shares", metavar="ACCT=N,...", help="accounts' shares with --fairness shares (default 1 each)")
    p.add_argument(
        "--half-life", type=float, metavar="S", help="decay half-life of tenants' usage, seconds (default 7 days)"
    )
    p.add_argument(
        "--steer-grows",
        action="store_true",
        help="with --fairness shares: an elastic policy grows the jobs of tenants below their share first",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the model draw and of the policies")
    p.add_argument("--out", type=Path, help="write JSON/CSV results and PNG plots here")
    p.add_argument("--overheads", type=Path, help="JSON of overheads (see below)")
    for name in ("start", "suspend", "resume", "migrate", "resize", "pack", "park", "unpark"):
        p.add_argument(f"--{name}-cost", type=float, metavar="S", help=f"seconds a {name} costs")
    p.add_argument(
        "--park", action="store_true", help="co-held GPUs: a switch between two jobs on the same GPUs parks in place"
    )
    p.add_argument("--interference", type=float, default=0.3, help="slow-down of packed jobs (default 0.3)")
    p.add_argument(
        "--locality-penalty", type=float, default=0.05, help="slow-down per worse locality level (default 0.05)"
    )
    e = p.add_mutually_exclusive_group()
    e.add_argument("--elastic", dest="elastic", action="store_true", default=None, help="give jobs a GPU range")
    e.add_argument("--rigid", dest="elastic", action="store_false", help="run jobs at the trace's GPU count")
    p.add_argument("--max-time", type=float, help="stop after this many simulated seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_main)


class ProgressBar:
    """A one-line progress bar on a stream, redrawn at most every `interval` seconds."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.clock = clock
        self._last = -float("inf")

    def __call__(self, done: int, total: int, sim_time: float) -> None:
        frac = done / total if total else 1.0
        tty = self.stream.isatty()
        if tty:
            now = self.clock()
            if done < total and now - self._last < self.interval:
                return
            self._last = now
        else:
            # A log file gets a line per tenth, not a carriage-return animation.
            step = int(10 * frac)
            if step <= self._last:
                return
            self._last = step
        bar = "#" * int(30 * frac)
        text = f"{self.label:<10} [{bar:<30}] {done}/{total} jobs, t={sim_time / 3600:.1f} h simulated"
        if tty:
            self.stream.write("\r" + text + ("\n" if done >= total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _overheads(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from slurm_gandiva.sim.engine import Overheads

    base = Overheads.from_file(args.overheads) if args.overheads else Overheads.default()
    changes = {
        n: getattr(args, f"{n}_cost")
        for n in ("start", "suspend", "resume", "migrate", "resize", "pack", "park", "unpark")
        if getattr(args, f"{n}_cost") is not None
    }
    for n, v in changes.items():
        if v < 0:
            raise ConfigError(f"--{n}-cost {v} must be >= 0")
    return replace(base, **changes) if changes else base


def _main(args: argparse.Namespace) -> int:
    from slurm_gandiva.sim.engine import SimConfig, Simulator
    from slurm_gandiva.sim.metrics import Summary, format_summary, write_results
    from slurm_gandiva.sim.trace import PHILLY, load_philly, load_trace

    if args.gpus < 1 or args.gpus_per_node < 1 or args.gpus % args.gpus_per_node:
        raise ConfigError(f"--gpus {args.gpus} must be a positive multiple of --gpus-per-node {args.gpus_per_node}")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs must be >= 1")
    if not (math.isfinite(args.load) and args.load > 0):
        raise ConfigError(f"--load {args.load} must be a number > 0 (2.0 = arrivals twice as dense)")
    names = [n.strip() for n in args.compare.split(",") if n.strip()] if args.compare else [args.policy]
    params = parse_params(args.param)
    if args.fairness == "none" and (args.shares or args.half_life is not None or args.steer_grows):
        raise ConfigError("--shares, --half-life and --steer-grows need --fairness shares")
    if args.half_life is not None and not (math.isfinite(args.half_life) and args.half_life > 0):
        raise ConfigError(f"--half-life {args.half_life} must be a positive number of seconds")
    parse_shares(args.shares)
    policies = [make_named_policy(n, seed=args.seed, params=params) for n in names]
    if args.trace == PHILLY:
        trace = load_philly(vc=args.vc, jobs=args.jobs, load=args.load)
    else:
        trace = load_trace(args.trace)
        if args.jobs is not None:
            trace = type(trace)(trace.name, trace.jobs[: args.jobs])
        trace = trace.compressed(args.load)
    if not trace.jobs:
        raise ConfigError(f"trace {args.trace} has no jobs")
    big = trace.oversized(args.gpus)
    if big:
        largest = max(j.gpus for j in big)
        what = f"{len(big)} job(s) ask for more than the cluster's {args.gpus} GPUs (the largest {largest})"
        if not args.cap_gpus:
            raise ConfigError(f"{what}; raise --gpus, or pass --cap-gpus to run them on {args.gpus}")
        print(f"warning: {what}; capped at {args.gpus} (--cap-gpus)", file=sys.stderr)
        trace = trace.capped(args.gpus)
    config = SimConfig(
        nodes=args.gpus // args.gpus_per_node,
        gpus_per_node=args.gpus_per_node,
        gpus_per_switch=args.gpus_per_switch,
        sockets=args.sockets,
        overheads=_overheads(args),
        locality_penalty=args.locality_penalty,
        interference=args.interference,
        seed=args.seed,
        elastic=args.elastic,
        max_time=args.max_time,
        park=args.park,
    )
    groups = trace.groups
    grouped = f", {len(groups)} job group(s) ({len(trace.group_caps)} capped)" if groups else ""
    print(
        f"trace {trace.name}: {len(trace)} jobs{grouped} over {trace.span / 3600:.1f} h, offered load "
        f"{trace.offered_load(args.gpus):.2f} on {args.gpus} GPUs; overheads from {config.overheads.source}",
        file=sys.stderr,
    )
    results = []
    for pol in policies:
        bar = None if args.no_progress else ProgressBar(pol.name)
        if args.fairness == "shares":
            pol = with_shares(pol, parse_shares(args.shares), args.half_life, steer_grows=args.steer_grows)
        results.append(Simulator(trace, pol, config).run(progress=bar))
    summaries = [Summary.of(r) for r in results]
    # What users run today is the honest yardstick: plain Slurm (backfilling FIFO) when it was run.
    baseline = next((b for b in ("slurm", "default") if b in names), names[0])
    print(format_summary(summaries, baseline if len(summaries) > 1 else None))
    if len(summaries) > 1:
        print(f"(ratios: each figure over {baseline}'s)")
    if len({(j.account, j.user) for j in trace.jobs}) > 1:
        from slurm_gandiva.sim.fairness import Fairness, format_fairness, isolated_jcts

        shares = parse_shares(args.shares)
        for name, r in zip(names, results, strict=True):
            alone = isolated_jcts(trace, r, _maker(name, args.seed, params), config, shares)
            with_ = " with shares" if args.fairness == "shares" else ""
            print(f"\n{r.policy}{with_}: tenants (rho: JCT over JCT alone on its share of the GPUs, same policy)")
            print(format_fairness(Fairness.of(r, trace, shares, alone)))
    if args.out:
        from slurm_gandiva.sim.plots import plot_jct_cdf, plot_timeline

        written = []
        for r in results:
            written += write_results(r, args.out)
            written.append(plot_timeline(r, args.out / f"{r.policy}.timeline.png"))
        written.append(plot_jct_cdf(results, args.out / "jct_cdf.png"))
        print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    return 0


def _maker(name: str, seed: int, params: dict[str, object]) -> Callable[[], Any]:
    """A factory of fresh `name` policies (a run's policy carries its own state)."""
    return lambda: make_named_policy(name, seed=seed, params=params)


def _parse_value(text: str) -> object:
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_params(items: list[str] | None) -> dict[str, object]:
    """KEY=VALUE strings -> policy parameters (numbers, true/false and none are converted)."""
    out: dict[str, object] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r}: write KEY=VALUE, e.g. --param quantum=120")
        out[key.strip()] = _parse_value(value.strip())
    return out


def make_named_policy(name: str, *, seed: int = 0, params: dict[str, object] | None = None) -> Any:
    """H4's policy by name (the very objects the controller uses); ConfigError for an unknown name or a
    parameter the controller's config would refuse (`check_params`: its type and range).

    The seed is passed on to policies that take one (tie-breaking)."""
    from slurm_gandiva.selector import check_params, make_policy

    params = check_params(name, params or {})
    try:
        policy = make_policy(name, **params)
        if "seed" not in params and hasattr(policy, "seed"):
            policy = make_policy(name, seed=seed, **params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"policy {name!r} rejects its parameters ({exc}); fix --param") from None
    return policy


def parse_shares(text: str | None) -> dict[str, float]:
    """`ACCT=N,...` -> account -> share (> 0); ConfigError naming the bad item."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        acct, sep, value = item.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not sep or not acct.strip() or not (math.isfinite(share) and share > 0):
            raise ConfigError(f"--shares {item.strip()!r}: write ACCOUNT=N with N > 0, e.g. --shares physics=2,bio=1")
        out[acct.strip()] = share
    return out


def with_shares(
    policy: Any, shares: dict[str, float], half_life: float | None, *, steer_grows: bool = False
) -> Any:
    """`policy` under the fair-share layer (a fresh usage state: one per run)."""
    from slurm_gandiva.selector.fairshare import DEFAULT_HALF_LIFE_S, FairShare

    life = half_life if half_life is not None else DEFAULT_HALF_LIFE_S
    return FairShare(policy, shares, life, steer_grows=steer_grows)
