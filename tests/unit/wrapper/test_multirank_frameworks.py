"""The Lightning and Hugging Face callbacks with two ranks (gandiva-wrapper --nprocs 2, gloo on CPU, no Slurm):
only rank 1 sets the suspend flag, yet both ranks stop at the same step boundary (the one after the boundary
where rank 1's flag went into the all-reduce), the framework's checkpoint is written once (complete: the HF
marker after every rank's part), both exit 75, and the resumed run ends with the parameters of an uninterrupted
2-rank run, bit for bit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from job_wrapper.progress import read_events

pytestmark = pytest.mark.timeout(300)

JOB = Path(__file__).with_name("_multirank_job.py")
WRAPPER = Path(sys.executable).with_name("gandiva-wrapper")
STOP_AT = 2  # rank 1 sees the "signal" during step 2 (0-based): its end starts the all-reduce, the next stops
STOPPED = STOP_AT + 2  # steps trained when both stop


def wrapper(state: Path, framework: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(WRAPPER), "--state-dir", str(state), "--nprocs", "2", "--", sys.executable,
                             str(JOB), framework, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=240)
    return out


def sha(out: str) -> str:
    m = re.search(r"final_params_sha256=([0-9a-f]{64}) steps=16", out)
    assert m, out
    return m.group(1)


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_ranks_agree_on_the_stop_step_save_once_and_resume_bit_for_bit(tmp_path: Path, framework: str) -> None:
    pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    ref = wrapper(tmp_path / "ref", framework)
    state = tmp_path / "job"
    run = wrapper(state, framework, "--stop-rank", "1", "--stop-at", str(STOP_AT))
    out = finish(run)
    assert run.returncode == 75, out
    status = json.loads((state / "status.json").read_text())
    assert status["nprocs"] == 2 and status["child_exit_codes"] == [75, 75], status
    if framework == "lightning":
        import torch

        st = torch.load(state / "lightning.ckpt", weights_only=False)
        assert st["gandiva"]["step"] == STOPPED and st["gandiva"]["world_size"] == 2
        assert len(st["gandiva"]["rng"]) == 2
        assert not list(state.glob("lightning.ckpt.tmp*"))  # rank 0's temporary file became the checkpoint
    else:
        saved = state / "hf" / f"checkpoint-{STOPPED}"
        mark = json.loads((saved / "gandiva.json").read_text())
        assert mark["step"] == STOPPED and mark["world_size"] == 2
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(mark["files"])
        assert [p.name for p in (state / "hf").iterdir()] == [saved.name]
    events = [e["event"] for e in read_events(state / "events.jsonl")]
    assert events.count("checkpoint") == 1 and events.count("stop_requested") == 1

    resumed = wrapper(state, framework)
    out = finish(resumed)
    assert resumed.returncode == 0, out
    ref_out = finish(ref)
    assert ref.returncode == 0, ref_out
    assert sha(out) == sha(ref_out)
