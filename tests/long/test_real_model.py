"""The real default model at length (``make test-long``): ``affidavit probe`` against
``affidavit engine serve`` on SmolLM2-135M-Instruct is bit-identical at batch sizes 1, 2, 8
and 16, each probe alone and inside batches of concurrent random requests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the engine needs the `engine` extra")
pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(smollm2_gguf: Path) -> Iterator[str]:
    """``affidavit engine serve`` on the GGUF file, as a user starts it."""
    server = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "engine", "serve", "--model", str(smollm2_gguf),
         "--model-name", "smollm2-135m", "--port", "0", "--log-level", "warning"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    url = None
    deadline = time.monotonic() + 180
    lines = []
    while url is None and time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        url = found.group(1) if found else None
    assert url, "".join(lines)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(60)


@pytest.mark.timeout(1800)  # four batch sizes of a real model on 2 cores
def test_probe_is_bit_identical_on_smollm2_at_batch_sizes_1_2_8_16(served: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "probe", "--url", served, "--probes", "4",
         "--batch-sizes", "1,2,8,16", "--max-tokens", "16", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    print(json.dumps(report, indent=1))
    assert report["model"] == "smollm2-135m"
    rows = {int(r["batch_size"]): r for r in report["rows"]}
    assert sorted(rows) == [1, 2, 8, 16]
    for size, row in rows.items():
        assert row["identical"] == row["probes"] == 4, (size, row)
        if size > 1:  # the probe really shared decode steps with the fillers
            assert row["batch_formed"], (size, row)
