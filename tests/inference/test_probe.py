"""``affidavit probe`` and ``scripts/gpu_check.sh``: the determinism probe, from outside.

Against the embedded engine (invariance on, uvicorn in a thread) every probe comes back
bit-identical in batches of 1, 2 and 8 and the batches are seen to form. Against a test
double that nudges a logprob by one ulp whenever another request is in flight, the probe
reports the difference and exits 1; against one that reports no batch peers, the
``batch_formed`` column is empty. An endpoint that does not answer gives exit 3, bad
options exit 2. The GPU check script is valid bash and its CPU path runs here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("torch", "fastapi", "uvicorn"):
    pytest.importorskip(_module, reason="the probe's tests serve the engine: `engine` extra")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, Response, StreamingResponse  # noqa: E402

import inference.cli  # noqa: E402
from affidavit.cli import main  # noqa: E402
from inference.probe import ProbeConfig, base_url, parse_batch_sizes, probe_request  # noqa: E402
from inference.server import Engine, create_app  # noqa: E402
from tests.inference.serving import serve_in_thread  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
SMALL = ["--probes", "3", "--batch-sizes", "1,2,8", "--max-tokens", "6"]


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    engine = Engine(tiny_model_dir, model_name="tiny").start()
    assert engine.report is not None and engine.report.passed, "no invariant path on this CPU"
    yield from serve_in_thread(create_app(engine))
    engine.close()


def fake_endpoint(*, report_peers: bool) -> FastAPI:
    """A test double of an engine that is NOT batch-invariant: while another request is in
    flight, the logprob it reports moves by one ulp (the text stays the same)."""
    app = FastAPI()
    in_flight = {"now": 0}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "shifty", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        in_flight["now"] += 1
        await asyncio.sleep(0.05)  # long enough for a concurrent batch to overlap
        peers = in_flight["now"] - 1
        await asyncio.sleep(0.05)
        in_flight["now"] -= 1
        logprob = -0.5 if peers == 0 else math.nextafter(-0.5, 0.0)
        entry = {"token": "hi", "logprob": logprob, "bytes": [104, 105], "top_logprobs": []}
        block = {"batch_peers_max": peers} if report_peers else {}
        if not body.get("stream"):
            usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
            return JSONResponse(
                {"choices": [{**choice, "finish_reason": "length"}], "usage": usage}
            )
        token = {"delta": {"content": "hi"}, "logprobs": {"content": [entry]}}
        events = [
            {"choices": [{"index": 0, **token, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {"choices": [], **({"reproducibility": block} if block else {})},
        ]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return StreamingResponse(iter([text.encode()]), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def shifty_url() -> Iterator[str]:
    yield from serve_in_thread(fake_endpoint(report_peers=True))


@pytest.fixture(scope="module")
def silent_url() -> Iterator[str]:
    yield from serve_in_thread(fake_endpoint(report_peers=False))


def test_probe_finds_the_embedded_engine_bit_identical_in_every_batch(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--url", engine_url, *SMALL, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"url", "model", "rows"}
    assert report["url"] == engine_url and report["model"] == "tiny"
    rows = {row["batch_size"]: row for row in report["rows"]}
    assert sorted(rows) == [1, 2, 8]
    for row in rows.values():
        assert row["probes"] == 3 and row["identical"] == 3, row
        assert row["tokens_per_s"] > 0 and row["tpot_ms"] > 0, row
        assert set(row) >= {"batch_size", "probes", "identical", "tokens_per_s", "tpot_ms"}
    assert rows[1]["batch_formed"] is None and rows[1]["peers_max"] == 0
    assert rows[8]["batch_formed"] >= 1 and 1 <= rows[8]["peers_max"] <= 7, rows[8]


def test_probe_default_sizes_twelve_probes_each_all_bit_identical(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The acceptance run: 12 probes at each of 1, 2, 8 and 32 (short replies keep it quick)."""
    assert main(["probe", "--url", engine_url, "--max-tokens", "4", "--json"]) == 0
    rows = {row["batch_size"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert sorted(rows) == [1, 2, 8, 32]
    for size, row in rows.items():
        assert row["probes"] == 12 and row["identical"] == 12, row
        if size > 1:  # the batch really formed: the engine reports its decode-step peers
            assert row["batch_formed"] >= 1 and row["peers_max"] >= 1, row


def test_probe_prints_a_table(engine_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["probe", "--url", engine_url + "/v1/", "--probes", "2", "--batch-sizes", "1,4"]
    assert main([*args, "--max-tokens", "4", "--model", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = [line for line in out if line.split()[:3] == ["batch", "probes", "identical"]]
    assert len(header) == 1
    body = [line.split() for line in out if line.strip()[:1].isdigit()]
    assert [(r[0], r[1], r[2], r[3]) for r in body] == [
        ("1", "2", "2", "(100%)"),
        ("4", "2", "2", "(100%)"),
    ]
    assert out[-1] == "all probes bit-identical"


def test_probe_reports_a_reply_that_changes_in_a_batch(
    shifty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["probe", "--url", shifty_url, "--probes", "2", "--batch-sizes", "1,3", "--json"]) == 1
    )
    captured = capsys.readouterr()
    rows = {row["batch_size"]: row for row in json.loads(captured.out)["rows"]}
    assert rows[1]["identical"] == 2 and rows[3]["identical"] == 0
    assert rows[3]["batch_formed"] == 2 and rows[3]["peers_max"] == 2
    assert "probe 0 in a batch of 3 differs: token 0" in captured.err


def test_batch_formed_is_empty_where_the_endpoint_reports_no_peers(
    silent_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--url", silent_url, "--probes", "1", "--batch-sizes", "1,2"]) == 1
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("2 "))
    assert row[4:6] == ["-", "-"], row  # batch_formed, peers_max


def test_probe_exits_3_when_nothing_answers(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        assert main(["probe", "--url", f"http://127.0.0.1:{port}", *SMALL]) == 3
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "ftp://example.org"],
        ["--url", "http://127.0.0.1:9", "--batch-sizes", "0,2"],
        ["--url", "http://127.0.0.1:9", "--batch-sizes", "2,2"],
        ["--url", "http://127.0.0.1:9", "--probes", "0"],
        ["--url", "http://127.0.0.1:9", "--max-tokens", "x"],
        [],
    ],
)
def test_probe_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", *args]) == 2  # returned, never a SystemExit
    assert capsys.readouterr().err.strip() != ""


def test_probe_is_a_top_level_command_with_the_documented_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(inference.cli, "run_probe", lambda args: seen.append(args) or 0)
    assert main(["probe", "--url", "http://x"]) == 0
    (args,) = seen
    assert args.url == "http://x" and args.model is None
    assert (args.probes, args.batch_sizes, args.max_tokens, args.json) == (12, None, 32, False)
    assert main(["probe", "--url", "http://x", "--batch-sizes", "1,2", "--json"]) == 0
    assert (seen[1].batch_sizes, seen[1].json) == ((1, 2), True)
    assert ProbeConfig(url="http://x").batch_sizes == (1, 2, 8, 32)
    assert parse_batch_sizes("1,2,8,32") == (1, 2, 8, 32)
    assert base_url("http://h:1/v1/") == "http://h:1"


def test_a_probe_is_the_same_pinned_request_every_time() -> None:
    config = ProbeConfig(url="http://x", max_tokens=5, temperature=0.7, seed=10)
    first, again = probe_request("m", 3, config), probe_request("m", 3, config)
    assert json.dumps(first) == json.dumps(again)
    assert first["seed"] == 13 and first["temperature"] == 0.7 and first["max_tokens"] == 5
    assert first["logprobs"] is True and first["model"] == "m"
    assert probe_request("m", 4, config)["messages"] != first["messages"]


def test_gpu_check_script_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text and os.access(SCRIPT, os.X_OK)


def test_gpu_check_cpu_path_runs_the_probe_in_process(tiny_model_dir: Path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "MODEL_DIR": str(tiny_model_dir),
        "PROBES": "2",
        "BATCH_SIZES": "1,2,8",
        "MAX_TOKENS": "4",
    }
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["linear_path"] for r in reports] == ["padded-8", "fixed-chunk-8", "stock"]
    for report in reports[:2]:  # both invariant paths, on this CPU build
        assert all(row["identical"] == row["probes"] == 2 for row in report["rows"])
    assert "kept every probe bit-identical on cpu" in result.stdout


def test_gpu_check_fails_without_the_device_it_was_asked_for() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("by design: this machine has CUDA, so DEVICE=cuda is not missing here")
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cuda"}
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode != 0
    assert "torch sees no CUDA device" in result.stderr
