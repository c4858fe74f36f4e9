"""``affidavit demo`` end to end, as the real CLI in a subprocess, on the real default model
(SmolLM2-135M-Instruct): a pinned turn with a tool call through the proxy and an answer in
words, reconstructed and re-executed; its report, its record and the checkpoints it kept
all check out afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from affidavit.cli import main
from record.audit import verify_store
from record.seal import KeyPair

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    workdir: Path
    report: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    pytest.importorskip("torch", reason="the demo needs the `engine` extra")
    base = tmp_path_factory.mktemp("demo")
    workdir, report = base / "work", base / "demo-report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "affidavit",
            "demo",
            "--workdir",
            str(workdir),
            "--report",
            str(report),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return DemoRun(workdir, report, done.returncode, done.stdout, done.stderr)


def test_demo_exits_0_with_every_step_identical_and_writes_its_report(demo: DemoRun) -> None:
    assert demo.returncode == 0, demo.stdout + demo.stderr
    doc = json.loads(demo.report.read_text())
    assert set(doc) >= {"store", "stream", "session", "turn", "reconstruct", "steps"}
    assert doc["reconstruct"] == {"ok": True}
    assert len(doc["steps"]) == 2
    for step in doc["steps"]:
        assert {step[k] for k in ("prompt", "clock", "request", "reply")} == {"identical"}
        assert step["live_calls"] == 0
    assert [s["tools_replayed"] for s in doc["steps"]] == [1, 0]
    lines = demo.stdout.splitlines()
    assert "(smollm2-135m)" in next(x for x in lines if x.strip().startswith("engine"))
    (called,) = [x for x in lines if " called web_search " in x]
    assert json.loads(called.split(" called web_search ", 1)[1])["query"]  # it parses
    (answer,) = [x for x in lines if x.startswith("  answer: ")]
    words = answer.removeprefix("  answer: ")
    # An answer in words about what it fetched, not the tool markup a small model echoes.
    assert words[:1].isalpha() and "<tool" not in words and len(words.split()) >= 5, answer
    verdicts = [x for x in lines if x.startswith("Replay of turn 0, step")]
    assert len(verdicts) == 2 and all("differs" not in x for x in verdicts)
    assert "the web served 0 pages during the replay" in demo.stdout
    assert "affidavit log verify" in demo.stdout and "affidavit panel --home" in demo.stdout
    assert lines[-1].startswith("demo ok in ")


def test_the_demo_record_verifies_against_the_checkpoints_it_kept(demo: DemoRun) -> None:
    doc = json.loads(demo.report.read_text())
    kept = sorted((demo.workdir / "checkpoints" / doc["stream"]).glob("*.note"))
    assert kept, "annotations and turn.ended hand back checkpoints; the harness keeps them"
    key = KeyPair.read(demo.workdir / "user.key")
    report = verify_store(Path(doc["store"]), key=key, kept=[p.read_bytes() for p in kept])
    assert report.ok, report.problems
    args = ["log", "verify", doc["store"], "--key", str(demo.workdir / "user.key")]
    for note in kept:
        args += ["--against", str(note)]
    assert main(args) == 0


def test_a_used_workdir_is_refused_with_2(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    assert main(["demo", "--workdir", str(tmp_path)]) == 2
