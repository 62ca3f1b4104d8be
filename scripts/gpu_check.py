"""The checks that need a real NVIDIA GPU (CI has none): run by hand on a GPU host, prints a report.

    python3 scripts/gpu_check.py [--out DIR]      (from the checkout; PyTorch with CUDA, pynvml)

1. the GPUs, PyTorch, CUDA and NCCL;
2. topology: `slurm_gandiva.topology.probe` through the real NVML (pynvml), and the gres.conf lines it makes;
3. NCCL in-process: `job_wrapper.init_distributed()` picks NCCL under CUDA, a DDP model with
   `job_wrapper.ordered_allreduce` steps on the GPU and gives the single-process result bit for bit, and the
   ranks' stop agreement (its own gloo group beside NCCL) runs;
4. gandiva-wrapper running examples/train.py on the GPU: an uninterrupted run, and one suspended twice (SIGUSR2
   at a mini-batch boundary, checkpoint, exit 75, resumed from the checkpoint), must end with the same
   parameter hash; the run must say it trained on cuda;
5. (informational) two ranks on one GPU through gloo: CUDA tensors in ordered_allreduce's all-gather;
6. park / unpark in place (issue 31) with >= 1 GB of device state: benchmarks/bench_park.py --device cuda:
   the switch's medians, and the parked process's GPU memory released (reserved <= 10% of what it moved);
7. (informational) the driver's CUDA checkpoint of a parked job (benchmarks/bench_cuda_checkpoint.py): the
   process's GPU memory with its context checkpointed to the host too, and the time it takes.
Exit status 0 when checks 1-4 and 6 pass. No Slurm is needed: the wrapper runs outside a job, as in
tests/unit/wrapper/test_wrapper_process.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAIN = ROOT / "examples" / "train.py"
TRAIN_ARGS = ["--epochs", "3", "--samples", "512", "--batch-size", "16", "--hidden", "256", "--dim", "64",
              "--sleep-per-step", "0.02"]
HASH_RE = re.compile(r"final_params_sha256=([0-9a-f]{64})")
lines: list[str] = []
DRY_RUN = False  # --dry-run: the wrapper checks on the CPU (to try this script where there is no GPU)


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def check(name: str, fn: Callable[[], str], results: dict[str, bool]) -> None:
    t = time.monotonic()
    try:
        detail = fn()
        results[name] = True
        say(f"PASS {name} ({time.monotonic() - t:.1f} s): {detail}")
    except Exception as exc:  # every check reports, none stops the others
        results[name] = False
        say(f"FAIL {name} ({time.monotonic() - t:.1f} s): {type(exc).__name__}: {exc}")
        for tb in traceback.format_exc().splitlines()[-8:]:
            say(f"     {tb}")


def env_report() -> str:
    import torch

    assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, GPUs {names}; nvidia-smi: {smi}"


def topology() -> str:
    from slurm_gandiva.topology.file import topology_from_json
    from slurm_gandiva.topology.gresconf import render_gres_conf
    from slurm_gandiva.topology.probe import probe

    res = probe()
    assert res.node.gpus, "NVML found no GPU"
    doc = res.to_json()
    gres = render_gres_conf(topology_from_json(doc)).strip().replace("\n", " | ")
    return f"{json.dumps(doc['nodes'][0], sort_keys=True)}; gres.conf: {gres}"


def nccl_in_process() -> str:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import job_wrapper
    from job_wrapper.agree import StopAgreement
    from job_wrapper.api import default_backend

    assert default_backend() == "nccl", f"default backend under CUDA is {default_backend()}, not nccl"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        assert dist.get_backend() == "nccl"
        torch.cuda.set_device(0)

        def make() -> nn.Module:
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()

        plain, wrapped = make(), make()
        ddp = job_wrapper.ordered_allreduce(nn.parallel.DistributedDataParallel(wrapped, device_ids=[0]))
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, ddp)]
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            x, y = torch.randn(32, 64, generator=gen).cuda(), torch.randn(32, 1, generator=gen).cuda()
            for m, o in zip((plain, ddp), opts, strict=True):
                o.zero_grad()
                nn.functional.mse_loss(m(x), y).backward()  # type: ignore[no-untyped-call]
                o.step()
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), wrapped.state_dict().values(),
                                                       strict=True))
        assert same, "DDP with ordered_allreduce over NCCL differs from the single-process model"
        agreement = StopAgreement.on(dist.new_group(backend="gloo"))
        answers = [agreement.agree(s) for s in (False, True, False)]
        agreement.close()
        assert answers == [False, False, True], answers
        return "NCCL default group, DDP + ordered_allreduce bit-equal to plain training over 5 steps; " \
               "stop agreement on its gloo group beside NCCL: stops one boundary after the flag"
    finally:
        dist.destroy_process_group()


def _wrapper(state: Path, nprocs: int, extra: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    state.mkdir(parents=True, exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GANDIVA_"))}
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    argv = [sys.executable, "-m", "job_wrapper.cli", "--state-dir", str(state), "--nprocs", str(nprocs),
            "--progress-interval", "0.1", "--", sys.executable, str(TRAIN), *TRAIN_ARGS, *extra]
    log = (state / f"run-{time.monotonic_ns()}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=full, start_new_session=True)


def _output(state: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(state.glob("run-*.log")))


def _finish(proc: subprocess.Popen[str], state: Path, timeout: float = 240) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"wrapper did not finish in {timeout} s: {_output(state)[-2000:]}") from None


def _step(state: Path) -> int:
    try:
        return int(json.loads((state / "progress.json").read_text()).get("step", 0))
    except (OSError, ValueError):
        return 0


def wrapper_on_gpu(work: Path, nprocs: int = 1, env: dict[str, str] | None = None) -> str:
    ref = work / f"ref-{nprocs}"
    code = _finish(_wrapper(ref, nprocs, [], env), ref)
    out = _output(ref)
    m = HASH_RE.search(out)
    assert code == 0 and m, f"uninterrupted run exited {code}: {out[-2000:]}"
    assert "device=cuda" in out or DRY_RUN, f"the run did not train on the GPU: {out[-1000:]}"
    backend = re.search(r"backend=(\w+)", out)
    device = re.search(r"device=(\S+)", out)
    sus = work / f"sus-{nprocs}"
    stops = []
    for target in (20, 55):
        proc = _wrapper(sus, nprocs, [], env)
        deadline = time.monotonic() + 180
        while _step(sus) < target:
            assert proc.poll() is None, f"exited early ({proc.returncode}): {_output(sus)[-2000:]}"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGUSR2)
        code = _finish(proc, sus)
        assert code == 75, f"suspend exited {code}, not 75: {_output(sus)[-2000:]}"
        stops.append(_step(sus))
    code = _finish(_wrapper(sus, nprocs, [], env), sus)
    found = HASH_RE.findall(_output(sus))
    assert code == 0 and found, f"resumed run exited {code}: {_output(sus)[-2000:]}"
    assert found[-1] == m.group(1), f"resumed hash {found[-1][:16]} != uninterrupted {m.group(1)[:16]}"
    where = device.group(1) if device else "?"
    how = backend.group(1) if backend else "?"
    return (f"{nprocs} rank(s) on {where}, backend {how}: suspended at steps {stops} (exit 75, checkpoint) and "
            f"resumed: final hash {m.group(1)[:16]}... equals the uninterrupted run")


def park_on_gpu(work: Path) -> str:
    device, size = ("cpu", "small") if DRY_RUN else ("cuda", "gpu1g")
    out = work / "park.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_park.py"), "--device", device, "--sizes", size,
         "--switches", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"bench_park exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    r = json.loads(out.read_text())[size]
    moved, reserved = float(r["device_bytes"]), float(r.get("device_reserved_parked", 0.0))
    if not DRY_RUN:
        if moved < 1e9:
            raise AssertionError(f"only {moved / 1e9:.2f} GB of device state moved: the check needs >= 1 GB")
        if reserved > 0.1 * moved:
            raise AssertionError(f"{reserved / 1e9:.2f} GB still reserved while parked of {moved / 1e9:.2f} GB moved")
    return (f"{size} on {device}: {moved / 1e9:.2f} GB of device state moved, {reserved / 1e6:.1f} MB still "
            f"reserved while parked; medians of 3: park {r['park_s']:.3f} s, unpark -> running "
            f"{r['unpark_running_s']:.3f} s, switch (park + unpark -> next step) {r['switch_s']:.3f} s; "
            f"parked CPU {r['parked_cpu_s_per_2s']:.3f} s in 2 s")


def cuda_checkpoint(work: Path) -> str:
    out = work / "cuda_checkpoint.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_cuda_checkpoint.py"), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"bench_cuda_checkpoint exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    r = json.loads(out.read_text())
    return (f"{r['size']}, {r['state_bytes'] / 1e9:.2f} GB of state: GPU memory of the process running "
            f"{r['gpu_mib_running']} MiB, parked {r['gpu_mib_parked']} MiB, checkpointed by the driver "
            f"{r['gpu_mib_checkpointed']} MiB, restored {r['gpu_mib_restored']} MiB; lock+checkpoint "
            f"{r['lock_checkpoint_s']:.3f} s, restore+unlock {r['restore_unlock_s']:.3f} s; unpark -> 3 steps "
            f"{r['unpark_to_3_steps_s']:.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the report here too (gpu_check.txt)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU here: run the wrapper checks on the CPU")
    args = ap.parse_args()
    global DRY_RUN
    DRY_RUN = args.dry_run
    results: dict[str, bool] = {}
    work = Path(tempfile.mkdtemp(prefix="gandiva-gpu-check-"))
    check("1 environment", env_report, results)
    check("2 topology (NVML)", topology, results)
    check("3 NCCL in-process (DDP, ordered_allreduce, stop agreement)", nccl_in_process, results)
    check("4 wrapper on the GPU: suspend/resume bit-exact", lambda: wrapper_on_gpu(work), results)
    info: dict[str, bool] = {}
    check("5 (informational) 2 ranks on one GPU through gloo",
          lambda: wrapper_on_gpu(work, 2, {"GANDIVA_DIST_BACKEND": "gloo"}), info)
    check("6 park / unpark in place with >= 1 GB of device state", lambda: park_on_gpu(work), results)
    if not DRY_RUN:
        check("7 (informational) the driver's CUDA checkpoint of a parked job: its context freed too",
              lambda: cuda_checkpoint(work), info)
    required = all(results.values())
    say(f"gpu_check: {'all required checks passed' if required else 'FAILED'} "
        f"({sum(results.values())}/{len(results)} required, {sum(info.values())}/{len(info)} informational)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.txt").write_text("\n".join(lines) + "\n")
    return 0 if required else 1


if __name__ == "__main__":
    sys.exit(main())
