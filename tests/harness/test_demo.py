"""``affidavit demo`` end to end, and the replay's verdicts when something really differs.

The demo runs once, as the real CLI in a subprocess (its own torch threads and servers):
it must exit 0, print both replay lines with every comparison identical, and leave a store
and bundle that verify with the user key it wrote, holding the turn's entries in order with
the tool call tied to the committed reply that asked for it. Divergence is planted two
honest ways, since the record itself cannot be changed validly: a recorded reply with one
byte flipped, judged against the reply the engine really gives; and a replay against an
engine whose weights differ (same model name), which the verdicts must call out.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.demo_replay import judge_step, read_turn, replay_turn, summary
from record.audit import verify_store
from record.bundle import verify_bundle
from record.digest import Domain, canonical_json, digest, tool_call_id
from record.schema import ModelRequest, ModelResponse, ToolCall, ToolResult, TurnEnded
from record.seal import KeyPair
from tests.egress_proxy.loopback import read_bodies

REPO = Path(__file__).resolve().parents[2]
LINES = [
    "Replay of turn 0, step 0: prompt identical · injected clock identical · reply identical"
    " · 0 tool results replayed from the record · 0 live calls",
    "Replay of turn 0, step 1: prompt identical · injected clock identical · reply identical"
    " · 1 tool result replayed from the record · 0 live calls",
]
ORDER = [
    "stream.opened",
    "pins.set",
    "turn.started",
    "model.request",
    "model.response",
    "tool.call",
    "tool.result",
    "model.request",
    "model.response",
    "turn.ended",
]


@dataclass(frozen=True)
class DemoRun:
    workdir: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def user(self) -> KeyPair:
        return KeyPair.read(self.workdir / "user.key")

    @property
    def stream(self) -> str:
        (line,) = [x for x in self.stdout.splitlines() if x.strip().startswith("store ")]
        return line.split("(stream ")[1].rstrip(")")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    pytest.importorskip("torch", reason="the demo needs the `engine` extra")
    pytest.importorskip("openai", reason="the demo drives the turn with the openai client")
    workdir = tmp_path_factory.mktemp("demo") / "work"
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "demo", "--workdir", str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return DemoRun(workdir, done.returncode, done.stdout, done.stderr)


def test_demo_exits_0_and_every_replay_comparison_is_identical(demo: DemoRun) -> None:
    assert demo.returncode == 0, demo.stdout + demo.stderr
    lines = demo.stdout.splitlines()
    assert [x for x in lines if x.startswith("Replay of turn 0, step")] == LINES
    assert "Replay of turn 0: ok, 2 of 2 steps replay (every reply byte for byte)" in lines
    assert "differs" not in demo.stdout
    assert lines[-1].startswith("demo ok in ")


def test_store_and_bundle_verify_afterwards_with_the_user_key(demo: DemoRun) -> None:
    kept = (demo.workdir / "kept.checkpoint").read_bytes()
    report = verify_store(demo.workdir / "record.db", key=demo.user, kept=[kept])
    assert report.ok, report.problems
    assert report.entries == len(ORDER)
    bundle = demo.workdir / "bundle"
    assert bundle.is_dir()
    bundled = verify_bundle(bundle, key=demo.user, kept=[kept])
    assert bundled.ok, bundled.problems
    assert bundled.streams == [demo.stream]


def test_record_holds_the_turn_in_order_with_the_tool_call_tied_to_its_reply(
    demo: DemoRun,
) -> None:
    bodies = read_bodies(demo.workdir / "record.db", demo.stream, demo.user)
    assert [entry.kind for entry, _ in bodies.values()] == ORDER
    opened = [body for _, body in bodies.values()]
    request0, response0, call, result, request1, _, ended = opened[3:]
    assert isinstance(request0, ModelRequest) and isinstance(request1, ModelRequest)
    assert isinstance(response0, ModelResponse) and response0.outcome == "COMMITTED"
    assert isinstance(call, ToolCall) and isinstance(result, ToolResult)
    assert isinstance(ended, TurnEnded) and ended.outcome == "ANSWERED"
    assert call.reply_seq == 4 and response0.request_seq == 3 and result.call_seq == 5
    # The id is the engine's derived one, from the prompt it saw and the pinned seed.
    assert call.call_id == tool_call_id(request0.prompt_digest, 42, 0)
    assert call.arguments == canonical_json(json.loads(call.arguments))
    assert call.arguments_digest == digest(Domain.TOOL_ARGUMENTS, call.arguments)
    assert call.idempotent and call.tool == "web_fetch"
    sent = json.loads(request0.request_bytes)
    assert sent["tool_choice"] == "required" and sent["strict_cache"] is True
    pinned = ("seed", "temperature", "top_p", "max_tokens", "strict_cache")
    assert {k: sent[k] for k in pinned} == request0.pins
    assert request0.clock is not None and sent["clock"] == request0.clock  # the proxy's clock
    quoted = json.loads(request1.request_bytes)["messages"][-1]
    assert quoted["tool_call_id"] == call.call_id
    assert quoted["content"].encode() == result.result_bytes


def test_a_flipped_recorded_reply_byte_is_reported_as_reply_differs(demo: DemoRun) -> None:
    steps = read_turn(demo.workdir / "record.db", demo.stream, demo.user)
    assert len(steps) == 2
    genuine = steps[1].response.response_bytes
    assert genuine is not None
    at = genuine.index(b'"delta":{"content":"') + len(b'"delta":{"content":"')
    flipped = genuine[:at] + bytes([genuine[at] ^ 0x01]) + genuine[at + 1 :]
    tampered = dataclasses.replace(
        steps[1], response=steps[1].response.model_copy(update={"response_bytes": flipped})
    )
    verdicts = [judge_step(steps[0], 200, steps[0].response.response_bytes or b"")]
    verdicts.append(judge_step(tampered, 200, genuine))  # the engine's real reply
    assert verdicts[0].ok and verdicts[0].reply == "identical"
    bad = verdicts[1]
    assert not bad.ok
    assert bad.line() == (
        "Replay of turn 0, step 1: prompt identical · injected clock identical · reply differs"
        " · 1 tool result replayed from the record · 0 live calls"
    )
    assert summary(verdicts) == ("Replay of turn 0: FAILED, 1 of 2 steps differ (step 1: reply)")


def test_execution_facts_alone_are_masked_and_the_verdict_says_so(demo: DemoRun) -> None:
    steps = read_turn(demo.workdir / "record.db", demo.stream, demo.user)
    genuine = steps[0].response.response_bytes or b""
    assert genuine.count(b'"batch_peers_max":0') == 1
    batched = genuine.replace(b'"batch_peers_max":0', b'"batch_peers_max":7')
    verdict = judge_step(steps[0], 200, batched)
    assert verdict.ok and verdict.reply == "masked"
    assert "reply identical with batch_peers_max/cached_tokens masked" in verdict.line()
    assert summary([verdict]) == (
        "Replay of turn 0: ok, 1 of 1 steps replay (1 with batch_peers_max/cached_tokens masked)"
    )


@pytest.fixture(scope="module")
def other_weights_engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo's engine on the tiny model with one weight matrix scaled: same name, new model."""
    pytest.importorskip("torch", reason="needs the `engine` extra")
    from safetensors.numpy import load_file

    from harness.demo import serve_engine
    from inference.make_model import make_model, write_safetensors

    made = make_model(tmp_path_factory.mktemp("other") / "model")
    weights = made.path / "model.safetensors"
    tensors = load_file(weights)
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name] * 1.5
    weights.write_bytes(write_safetensors(tensors))
    with serve_engine(made.path) as (_, url):
        yield url


def test_replay_against_other_weights_differs_in_every_reply(
    demo: DemoRun, other_weights_engine_url: str
) -> None:
    verdicts = replay_turn(
        demo.workdir / "record.db", demo.stream, demo.user, other_weights_engine_url
    )
    assert [v.reply for v in verdicts] == ["differs", "differs"]
    assert all(v.prompt and v.clock and not v.ok for v in verdicts)
    assert "reply differs" in verdicts[0].line()
    assert summary(verdicts).startswith("Replay of turn 0: FAILED, 2 of 2 steps differ")


def test_a_used_workdir_is_refused_with_2(tmp_path: Path) -> None:
    from harness.demo import run_demo

    (tmp_path / "record.db").write_bytes(b"")
    assert run_demo(tmp_path) == 2


def test_without_the_engine_extra_it_exits_3_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import importlib.util

    from harness.demo import run_demo

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert run_demo(tmp_path) == 3
    assert "pip install 'affidavit[engine]'" in capsys.readouterr().err


def test_docs_show_the_verdict_lines_the_demo_prints(demo: DemoRun) -> None:
    text = (REPO / "docs" / "demo.md").read_text("utf-8")
    shown = text.split("## The verdicts\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    printed = [x for x in demo.stdout.splitlines() if x.startswith("Replay of turn 0")]
    assert shown == printed
