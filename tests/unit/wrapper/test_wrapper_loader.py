"""Session.loader() and the resumable sampler under a DataLoader with workers: exactly once per epoch across a
suspend and a resize, bit for bit against an uninterrupted run and against batches()."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from job_wrapper import ResumableSampler, SeededDataset, Session, epoch_order
from job_wrapper import checkpoint as ckpt
from job_wrapper.order import shard
from slurm_gandiva.requeue.contract import ExitCode, JobFiles, read_progress

N, BATCH, EPOCHS = 44, 8, 3  # 6 steps per epoch, the last of 4 samples: 18 in all
X = torch.randn(N, 4, generator=torch.Generator().manual_seed(1))
TENSORS = (X, torch.arange(N))


class Noisy(Dataset[tuple[torch.Tensor, int]]):
    """A map-style dataset with a random transform (drawn from the fetching process's torch RNG)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return X[i] + 0.1 * torch.randn(4), i


class Logged(Dataset[tuple[torch.Tensor, int]]):
    """TENSORS as a map-style dataset that appends every index it fetches to a file (from the workers)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with self.log.open("a") as f:
            f.write(f"{i}\n")
        return X[i], i


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("RANK", "WORLD_SIZE", "GANDIVA_STATE_DIR", "GANDIVA_SIGNAL", "GANDIVA_TEST_CHECKPOINT_PAUSE",
                "GANDIVA_FAST_EXIT"):
        monkeypatch.delenv(var, raising=False)
    old = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, old)


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def train(
    state: Path,
    *,
    how: str = "loader",
    data: Any = TENSORS,
    workers: int = 2,
    suspend_after: int | None = None,
    log: list[tuple[int, int]] | None = None,
    **loader_args: Any,
) -> torch.Tensor:
    """Train to the end, or until `suspend_after` steps of this run (then SystemExit from step()).

    how: "loader" (Session.loader), "batches" (Session.batches) or "own" (a DataLoader of the user's own
    over Session.sampler, with the user's own epoch loop).
    """
    model, opt, sched = make()
    job = Session(model, opt, scheduler=sched, seed=3, state_dir=state, progress_interval=60)
    if how == "own":
        ds = TensorDataset(*data) if isinstance(data, tuple) else data
        # generator=: the DataLoader draws its workers' seed from it at every epoch's start, and from the
        # process's torch RNG without one (a resumed run would draw once more, mid-epoch).
        own = DataLoader(SeededDataset(ds), batch_sampler=job.sampler(ds, BATCH, epochs=EPOCHS),
                         num_workers=workers, generator=torch.Generator())
        batches: Any = (b for _ in range(job.epoch, EPOCHS) for b in own)
    elif how == "batches":
        batches = job.batches(data, batch_size=BATCH, epochs=EPOCHS)
    else:
        batches = job.loader(data, batch_size=BATCH, epochs=EPOCHS, num_workers=workers, **loader_args)
    try:
        for done, (x, ids) in enumerate(batches, start=1):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if log is not None:
                log.extend((job.epoch, int(i)) for i in ids)
            if done == suspend_after:
                job.request_suspend()
            job.step()
    finally:
        # A suspend ends the process; here pytest.raises keeps the frames, and with them the DataLoader
        # iterators of the own loop, which a garbage collection would end at some later, arbitrary point.
        batches.close()
    job.finish()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def suspended_runs(state: Path, cuts: tuple[int, ...], **kw: Any) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    log: list[tuple[int, int]] = []
    for k in cuts:
        with pytest.raises(SystemExit) as exc:
            train(state, suspend_after=k, log=log, **kw)
        assert exc.value.code == ExitCode.SUSPENDED
    return train(state, log=log, **kw), log


def exactly_once(log: list[tuple[int, int]]) -> None:
    counts = Counter(log)
    assert set(counts.values()) == {1} and sorted(counts) == [(e, i) for e in range(EPOCHS) for i in range(N)]


def test_loader_with_workers_is_bit_for_bit_across_suspends_and_equals_batches(tmp_path: Path) -> None:
    ref_log: list[tuple[int, int]] = []
    ref = train(tmp_path / "ref", how="batches", log=ref_log)
    assert torch.equal(train(tmp_path / "uncut"), ref)  # loader() gives what batches() gives
    # Cut mid-epoch, at an epoch's end (6 + 6) and in the next one, with workers prefetching ahead.
    out, log = suspended_runs(tmp_path / "cut", (4, 8, 1), prefetch_factor=4)
    assert torch.equal(out, ref)
    assert log == ref_log  # the same samples in the same order
    exactly_once(log)
    prog = read_progress(JobFiles(tmp_path / "cut").progress)
    assert prog is not None and prog.state == "done" and prog.step == 18 and prog.samples == N * EPOCHS


def test_persistent_workers_and_a_sampler_under_your_own_dataloader_resume_exactly(tmp_path: Path) -> None:
    ref = train(tmp_path / "ref", how="batches")
    out, log = suspended_runs(tmp_path / "persistent", (5, 6, 2), persistent_workers=True)
    assert torch.equal(out, ref)
    exactly_once(log)
    out, log = suspended_runs(tmp_path / "own", (3, 7, 5), how="own")
    assert torch.equal(out, ref)
    exactly_once(log)


def test_random_transforms_in_workers_are_reproducible_across_suspends(tmp_path: Path) -> None:
    """Workers seed their RNGs per batch: the same noise whichever worker fetches a batch, and after a resume."""
    ref = train(tmp_path / "ref", data=Noisy())
    assert torch.equal(train(tmp_path / "one-worker", data=Noisy(), workers=1), ref)
    out, log = suspended_runs(tmp_path / "cut", (2, 9), data=Noisy())
    assert torch.equal(out, ref)
    exactly_once(log)


def test_prefetched_batches_are_not_consumed(tmp_path: Path) -> None:
    """The checkpoint's position counts the batches the loop took, not those the workers fetched ahead."""
    fetched = tmp_path / "fetched"
    with pytest.raises(SystemExit):
        train(tmp_path / "s", data=Logged(fetched), suspend_after=2, prefetch_factor=2)
    st = ckpt.decode(JobFiles(tmp_path / "s").checkpoint.read_bytes())
    assert (st["step"], st["epoch"], st["position"], st["samples"]) == (2, 0, 2 * BATCH, 2 * BATCH)
    assert len(fetched.read_text().split()) > 2 * BATCH  # the workers had run ahead
    fetched.unlink()
    log: list[tuple[int, int]] = []
    train(tmp_path / "s", data=Logged(fetched), log=log)
    order = epoch_order(N, 3, 0)
    assert [i for e, i in log[: N - 2 * BATCH]] == order[2 * BATCH :]  # resumed at the first unconsumed sample


def simulate(worlds: list[int], cuts: list[int], workers: int = 2) -> list[tuple[int, int]]:
    """Ranks simulated with samplers, each under its own DataLoader with workers, in lockstep; after `cut`
    steps the job is "suspended" (rank 0's state is the checkpoint) and resumed on the next world size."""
    log: list[tuple[int, int]] = []
    state: dict[str, int] | None = None
    for world, cut in zip(worlds, cuts, strict=True):
        samplers = [ResumableSampler(N, BATCH, seed=5, rank=r, world_size=world) for r in range(world)]
        for s in samplers:
            if state is not None:
                s.load_state_dict(state)
        loaders = [DataLoader(TENSORS[1], batch_sampler=s, num_workers=workers) for s in samplers]  # type: ignore[arg-type,var-annotated]
        steps = 0
        while samplers[0].epoch < EPOCHS and steps < cut:
            epoch, pos = samplers[0].epoch, samplers[0].position
            for parts in zip(*loaders, strict=True):
                gb = epoch_order(N, 5, epoch)[pos : pos + BATCH]  # the global batch, as batches() takes it
                assert [p.tolist() for p in parts] == [list(shard(gb, r, world)) for r in range(world)]
                log.extend((epoch, int(i)) for p in parts for i in p)
                pos += len(gb)
                for s in samplers:
                    s.advance()
                steps += 1
                if steps == cut:
                    break
        assert len({str(s.state_dict()) for s in samplers}) == 1  # every rank at the same position
        state = samplers[0].state_dict()
    assert state is not None and state["epoch"] == EPOCHS
    return log


@pytest.mark.parametrize("worlds", [[2, 1], [1, 2], [2, 1, 2]])
def test_every_sample_once_per_epoch_across_a_resize_with_workers(worlds: list[int]) -> None:
    cuts = [*[4, 5][: len(worlds) - 1], 99]  # suspended in epoch 0 (after 4 steps), then in epoch 1 (after 9)
    exactly_once(simulate(worlds, cuts))


def test_sampler_state_of_other_data_is_refused_and_set_epoch_restarts() -> None:
    s = ResumableSampler(N, BATCH, seed=1)
    with pytest.raises(ValueError, match="size 40"):
        s.load_state_dict({**s.state_dict(), "size": 40})
    s.advance()
    assert (s.epoch, s.position, len(s)) == (0, BATCH, 5)
    s.set_epoch(0)
    assert s.position == BATCH  # the current epoch: nothing changes
    s.set_epoch(1)
    assert (s.epoch, s.position, len(s)) == (1, 0, 6)
    assert list(ResumableSampler(N, BATCH, drop_last=True, shuffle=False))[-1] == list(range(32, 40))


def test_a_signal_reaching_a_worker_is_ignored_and_progress_reports_batch_times(tmp_path: Path) -> None:
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path, progress_interval=0.01)
    it = job.loader(TENSORS, batch_size=4, epochs=2, num_workers=2)
    before = {p.pid for p in multiprocessing.active_children()}  # other tests' workers not yet collected
    next(it)
    workers = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert len(workers) == 2
    for w in workers:
        assert w.pid is not None
        os.kill(w.pid, signal.SIGUSR2)  # the training process acts on it; a worker would die of it
    steps = 1
    for _ in it:
        time.sleep(0.005)
        steps += 1
    assert steps == 2 * -(-N // 4) and not job._signalled
    prog = read_progress(JobFiles(tmp_path).progress)
    assert prog is not None and prog.state == "done" and prog.batch_time_avg > 0 and prog.samples_per_s > 0


def test_a_last_batch_too_small_for_the_ranks_is_refused_before_any_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 44 samples in batches of 8 on 5 ranks the last global batch (4) leaves rank 4 nothing to collate.
    Tensors are fetched as batches() fetches them: an empty share is an empty tensor there."""
    model, opt, _ = make()
    job = Session(model, opt, state_dir=tmp_path, progress_interval=60)
    monkeypatch.setattr(job, "world_size", 5)
    with pytest.raises(ValueError, match="pass drop_last=True"):
        job.loader(Noisy(), batch_size=BATCH, num_workers=2)
    assert job.loader(Noisy(), batch_size=BATCH, drop_last=True) is not None
    assert job.loader(TENSORS, batch_size=BATCH) is not None
    job.finish()


class Draws(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, 1 << 30, ())


def test_each_batch_draws_from_its_own_seed_whatever_the_worker() -> None:
    def draws(workers: int, start: int) -> list[list[int]]:
        sampler = ResumableSampler(16, 4, seed=2)
        sampler.cursor.position = start
        return [t.tolist() for t in DataLoader(SeededDataset(Draws()), batch_sampler=sampler, num_workers=workers)]

    two = draws(2, 0)
    assert len({x for b in two for x in b}) == 16  # no two batches share a stream
    assert draws(1, 0) == two and draws(2, 8) == two[2:]  # another worker, or a resume at sample 8
