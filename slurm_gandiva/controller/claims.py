"""What a job says of itself, bounded by what the controller measures (issue 29, item 2).

    judge = ClaimJudge()
    verdict = judge.judge(view, progress, quantum, now)   # once per round, after the view is built
    verdict.standing        # job id -> Claim: the finishing jobs the round spares (`selector.round`)
    verdict.ignored         # job id -> why its claim buys nothing this round

A job's progress report is its own word. A report that says training is over (state done, or samples at
the total) spares the job from stops (`run_round`), and one whose rate finishes it within half a quantum
makes the policy keep it running (`gandiva_round.finishing`). Neither lasts: from the first round that saw
the claim, it holds until `spared_until` (at most one quantum, and no longer than its measured finish
plus a margin); past that the claim is ignored and the job is stopped like any other. A claim the measured
progress contradicts (done while its samples are far below its total, or samples that jumped beyond
what its last measured rate allows since the controller last saw them) is ignored for the rest of the
job's life. An ignored claim's report is left out of the view (no progress, no measured rate), so the
policy sees a job of unknown remaining time; each job's ignored claim is recorded once.

Pure but for its memory between rounds: the time is the caller's `now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_gandiva.controller.observe import ProgressLike
from slurm_gandiva.model import ClusterView
from slurm_gandiva.selector.round import Claim, spared_until

CLAIM_IGNORED = "claim-ignored"  # the store event (and `gandiva squeue` REASON) of an ignored claim
# A job whose measured rate finishes it within this share of a quantum claims to be finishing: the policy
# keeps such a job running (its finish grace, a quarter of a quantum by default).
ETA_SHARE = 0.5
# Samples may run ahead of the last measured rate by this factor, plus this many seconds of it, before a
# jump counts as a lie (rates move; reports are a few seconds apart).
JUMP_FACTOR = 3.0
JUMP_SLACK_S = 10.0
# "done" with fewer samples than this share of its total is contradicted (early stopping rarely stops
# before half way; a job that does loses only the sparing of its shutdown).
DONE_SHARE = 0.5


def says_done(prog: ProgressLike) -> bool:
    """The report says training is over: state done, or samples at (or past) the total."""
    if getattr(prog, "state", "running") == "done":
        return True
    return bool(prog.total_samples) and prog.samples >= (prog.total_samples or 0)


def contradiction(prog: ProgressLike, last: tuple[float, float, float] | None, now: float) -> str | None:
    """Why `prog` contradicts what was measured, or None. `last`: (when the controller first saw the job's
    previous sample count, that count, its measured rate then), None before its first report."""
    total = prog.total_samples
    if getattr(prog, "state", "running") == "done" and total and prog.samples < DONE_SHARE * total:
        return f"says it is done at {prog.samples} of {total} samples"
    if last is not None:
        seen_at, samples, rate = last
        dt = max(0.0, now - seen_at)
        if rate > 0 and prog.samples - samples > rate * (JUMP_FACTOR * dt + JUMP_SLACK_S):
            return (f"its samples jumped from {samples:.0f} to {prog.samples:.0f} in {dt:.0f} s, more than its "
                    f"measured {rate:.1f} samples/s allows")
    return None


@dataclass(frozen=True)
class Verdict:
    """One round's judgement of the running jobs' claims."""

    standing: Mapping[str, Claim] = field(default_factory=dict)  # jobs that say they are done, not yet overdue
    ignored: Mapping[str, str] = field(default_factory=dict)  # job id -> why its claim is ignored
    new: Mapping[str, str] = field(default_factory=dict)  # the ignored claims not recorded before


class ClaimJudge:
    """Keeps, per job, when its claim was first seen, its last sample count and whether it was caught lying."""

    def __init__(self) -> None:
        self._claims: dict[str, Claim] = {}  # job id -> its first claim
        self._last: dict[str, tuple[float, float, float]] = {}  # job id -> (first seen at, samples, rate)
        self._liars: dict[str, str] = {}  # job id -> the contradiction it was caught in
        self._noted: set[str] = set()  # jobs whose ignored claim is recorded

    def judge(self, view: ClusterView, progress: Mapping[str, ProgressLike], quantum: float, now: float) -> Verdict:
        """The claims of the view's running jobs (their `progress` reports) at `now`."""
        standing: dict[str, Claim] = {}
        ignored: dict[str, str] = {}
        for job in view.running:
            jid = job.job_id
            prog = progress.get(jid)
            if prog is None:
                continue
            why = contradiction(prog, self._last.get(jid), now)
            if why is not None and jid not in self._liars:
                self._liars[jid] = why
            last = self._last.get(jid)
            if last is None or last[1] != prog.samples:
                self._last[jid] = (now, float(prog.samples), float(prog.samples_per_s))
            done = says_done(prog)
            left = job.remaining_time(job.gpus)
            if not done and left > ETA_SHARE * quantum:
                continue  # claims nothing
            claim = self._claims.setdefault(jid, Claim(now, now if done else now + left))
            if jid in self._liars:
                ignored[jid] = f"its progress report is not believed ({self._liars[jid]})"
            elif now >= spared_until(claim, quantum):
                ignored[jid] = (f"says it is finishing since {now - claim.since:.0f} s ago, longer than it may be "
                                "spared: stopped like any other job")
            elif done:
                standing[jid] = claim
        new = {jid: why for jid, why in ignored.items() if jid not in self._noted}
        self._noted.update(new)
        return Verdict(standing, ignored, new)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is kept of jobs not in `keep` (those no longer managed)."""
        alive = set(keep)
        for memo in (self._claims, self._last, self._liars):
            for jid in memo.keys() - alive:
                del memo[jid]
        self._noted &= alive
