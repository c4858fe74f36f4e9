"""#20 line 2: the threading the engine's speed relies on, asserted (never a time).

torch's OpenMP runtime keeps a team of worker threads for every thread that ever started a
parallel region, until that thread ends; with more workers than cores, idle ones sleep
instead of spinning and every small region of the decode step pays a wake-up (the scheduler
thread ran ~7x slower than the main thread: ``inference.server.on_a_passing_thread``). The
fix relies on one thing: building an ``Engine`` (loading, the self-test) leaves no team
behind on the thread that built it, so the scheduler's is the only one.

Run in a fresh interpreter: a pytest process has run torch on its main thread long before,
and then already holds the team this test looks for. OpenMP's workers are OS threads, so
they are counted in ``/proc/self/task``; the control case (the self-test run on the main
thread, as before the fix) shows that the count sees a team when one is left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, os, sys, threading
import torch
torch.set_num_threads(2)  # a team of two even on a one-core machine
from inference.checkpoint import load_checkpoint
from inference.model import DecoderModel
from inference.self_test import self_test
from inference.server import Engine
from inference.scheduler import Job
from inference.sampling import SamplingParams

def tasks():
    return len(os.listdir("/proc/self/task"))

model_dir, control = sys.argv[1], sys.argv[2] == "control"
before = tasks()
if control:  # as before the fix: the heavy start-up work on this (the main) thread
    checkpoint = load_checkpoint(model_dir)
    self_test(DecoderModel(checkpoint.config, checkpoint.weights))
    import time
    time.sleep(1)  # as long as the fixed case may wait, and the main thread is alive: kept
    print(json.dumps({"before": before, "built": tasks()}))
    sys.exit(0)
engine = Engine(model_dir)
import time
deadline = time.monotonic() + 10  # a gone team's worker exits a moment after its thread
while tasks() > before and time.monotonic() < deadline:
    time.sleep(0.05)
built = tasks()
engine.start()
done = threading.Event()
names = []
def sink(event):
    names.append(threading.current_thread().name)
    if type(event).__name__ == "Finished":
        done.set()
params = SamplingParams(temperature=0.0)
engine.scheduler.submit(Job(prompt_ids=[1, 2, 3, 4], params=params, seed=1, max_tokens=4), sink)
assert done.wait(60)
serving = tasks()
engine.close()
print(json.dumps({"before": before, "built": built, "serving": serving,
                  "sink_threads": sorted(set(names))}))
"""


def _probe(model_dir: Path, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(model_dir), mode],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        # the tokenizer's own (Rust) thread pool is not OpenMP's, and would blur the count
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(600)
def test_building_an_engine_leaves_no_openmp_team_on_the_building_thread(
    tiny_model_dir: Path,
) -> None:
    control = _probe(tiny_model_dir, "control")
    assert control["built"] == control["before"] + 1, control  # the count sees a worker left
    fixed = _probe(tiny_model_dir, "engine")
    assert fixed["built"] == fixed["before"], fixed  # the load thread's team ended with it
    # serving: the scheduler thread and its one worker, nothing else
    assert fixed["serving"] == fixed["before"] + 2, fixed
    assert fixed["sink_threads"] == ["affidavit-scheduler"], fixed
