"""``engine serve --backend vllm``: the ``vllm serve`` command it builds, and the front.

vLLM is never installed here (the ``gpu`` extra), so the launch is proved by its argv and
environment: the pure :func:`vllm_command`, and a stand-in ``vllm`` executable on ``PATH``
that records what it was started with; without any ``vllm`` the command exits 3.

The front is proved twice over loopback, with the ``openai`` SDK as the client:

- against ``FakeVllm``, a test double of vLLM's server (FastAPI + uvicorn) that records
  every request it receives and answers canned ``chat.completion`` JSON and SSE with
  ``usage.prompt_tokens_details``: strict requests reach it with a fresh ``cache_salt``
  each (never ``strict_cache``), other requests without one; the block carries vLLM's
  version, the cached tokens it reported, the seed, and the request's prompt digest;
- against the real embedded engine as the upstream: the block is fronted on JSON and SSE
  replies, the reply is the engine's own, and ``affidavit probe`` through the front still
  finds every probe bit-identical.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("torch", "fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="the front's tests need the `engine` and `dev` extras")

import httpx  # noqa: E402
import openai  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, Response, StreamingResponse  # noqa: E402

import inference.cli  # noqa: E402
from affidavit.cli import main  # noqa: E402
from inference.server import Engine, create_app  # noqa: E402
from inference.vllm import (  # noqa: E402
    BATCH_INVARIANT_ENV,
    FrontConfig,
    create_front,
    prepare_request,
    vllm_command,
)
from record.digest import Domain, digest_hex, prompt_digest  # noqa: E402
from tests.inference.serving import serve_in_thread  # noqa: E402

VERSION = "0.11.0-test-double"
DIGEST = "sha256:" + "ab" * 32
MESSAGES: Any = [{"role": "user", "content": "hello there"}]


class FakeVllm:
    """A test double of ``vllm serve``: records requests, answers canned replies."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.get("/version")(self.version)
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/chat/completions")(self.chat)

    async def version(self) -> dict[str, str]:
        return {"version": VERSION}

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "served", "object": "model"}]}

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(body)
        if body["model"] != "served":
            error = {"message": "no such model", "type": "NotFoundError", "code": 404}
            return JSONResponse({"error": error}, status_code=404)
        cached = 0 if "cache_salt" in body else 5
        usage = {
            "prompt_tokens": 9,
            "completion_tokens": 2,
            "total_tokens": 11,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        head = {"id": "chatcmpl-fake", "created": 1700000000, "model": "served"}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "hi you"}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
            reply = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            return JSONResponse(reply)
        chunk = {**head, "object": "chat.completion.chunk"}
        events = [
            {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]},
            {**chunk, "choices": [{"index": 0, "delta": {"content": " you"}}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**chunk, "choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return StreamingResponse(iter([text.encode()]), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeVllm, str]]:
    double = FakeVllm()
    for url in serve_in_thread(double.app):
        yield double, url


@pytest.fixture(scope="module")
def front_url(fake: tuple[FakeVllm, str]) -> Iterator[str]:
    config = FrontConfig(
        upstream=fake[1],
        model="served",
        weights_digest=DIGEST,
        batch_invariance=True,
        dtype="bfloat16",
    )
    yield from serve_in_thread(create_front(config))


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def block_of(reply: Any) -> dict[str, Any]:
    return dict(reply.model_extra["reproducibility"])


# --- the command line --------------------------------------------------------------------


def test_vllm_command_builds_a_replayable_server() -> None:
    argv, env = vllm_command(
        "/models/qwen",
        port=8123,
        max_model_len=4096,
        seed=7,
        served_model_name="qwen",
        extra_args=("--gpu-memory-utilization", "0.8"),
        environ={"PATH": "/bin", BATCH_INVARIANT_ENV: "0"},
    )
    assert argv[:3] == ["vllm", "serve", "/models/qwen"]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--seed"] == "7" and pairs["--served-model-name"] == "qwen"
    assert int(pairs["--max-num-batched-tokens"]) >= int(pairs["--max-model-len"]) == 4096
    assert pairs["--generation-config"] == "vllm"
    for flag in ("--no-enable-chunked-prefill", "--enable-prefix-caching"):
        assert flag in argv
    assert "--enable-prompt-tokens-details" in argv
    assert "--enable-chunked-prefill" not in argv
    assert argv[-2:] == ["--gpu-memory-utilization", "0.8"]
    assert env == {"PATH": "/bin", BATCH_INVARIANT_ENV: "1"}


def test_vllm_command_keeps_the_batch_budget_at_least_the_model_length() -> None:
    argv, _ = vllm_command("m", port=1, max_model_len=2048, seed=0, max_num_batched_tokens=8192)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    with pytest.raises(ValueError, match="max_num_batched_tokens 1024 < max_model_len 2048"):
        vllm_command("m", port=1, max_model_len=2048, seed=0, max_num_batched_tokens=1024)


def test_vllm_command_without_invariance_unsets_the_variable() -> None:
    environ = {BATCH_INVARIANT_ENV: "1", "HOME": "/root"}
    _, env = vllm_command(
        "m", port=1, max_model_len=8, seed=0, batch_invariance=False, environ=environ
    )
    assert env == {"HOME": "/root"} and environ[BATCH_INVARIANT_ENV] == "1"


def test_engine_serve_hands_its_options_to_run_serve_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(inference.cli, "run_serve_backend", lambda args: seen.append(args) or 0)
    assert main(["engine", "serve", "--model", "m"]) == 0
    assert vars(seen[0]) == {
        "model": "m",
        "host": "127.0.0.1",
        "port": 8000,
        "model_name": None,
        "batch_invariance": True,
        "max_batch": 64,
        "prefix_cache_tokens": 65536,
        "log_level": "info",
        "backend": "embedded",
        "seed": 0,
        "max_model_len": None,
        "upstream_port": 0,
        "startup_timeout": 1800.0,
        "vllm_arg": None,
        "token_file": None,
    }
    options = ["--backend", "vllm", "--no-batch-invariance", "--seed", "7"]
    vllm_args = ["--vllm-arg=--enforce-eager", "--vllm-arg", "--max-num-seqs=4"]
    assert main(["engine", "serve", "--model", "m", *options, *vllm_args]) == 0
    args = seen[1]
    assert (args.backend, args.batch_invariance, args.seed) == ("vllm", False, 7)
    assert args.vllm_arg == ["--enforce-eager", "--max-num-seqs=4"]
    assert main(["engine", "serve", "--model", "m", "--backend", "tgi"]) == 2
    assert len(seen) == 2


def test_serve_backend_vllm_exits_3_without_vllm_on_path(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    args = ["engine", "serve", "--backend", "vllm", "--model", str(tiny_model_dir)]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "`vllm` is not on PATH" in err and "pip install 'affidavit[gpu]'" in err


def test_serve_backend_vllm_starts_vllm_with_that_command(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A stand-in ``vllm`` records its argv and environment, then fails to start."""
    record = tmp_path / "started.json"
    fake_vllm = tmp_path / "bin" / "vllm"
    fake_vllm.parent.mkdir()
    fake_vllm.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
        "sys.exit(4)\n"
    )
    fake_vllm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_vllm.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(BATCH_INVARIANT_ENV, raising=False)
    args = ["engine", "serve", "--backend", "vllm", "--model", str(tiny_model_dir)]
    with socket.socket() as held:  # bound, never listening: nothing else can answer there
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        options = ["--seed", "11", "--upstream-port", str(port), "--startup-timeout", "60"]
        assert main([*args, *options]) == 1
    assert "exited with status 4 before it was ready" in capsys.readouterr().err
    started = json.loads(record.read_text())
    expected, _ = vllm_command(
        tiny_model_dir,
        port=port,
        max_model_len=2048,  # the tiny model's config.json
        seed=11,
        served_model_name=tiny_model_dir.resolve().name,
    )
    assert started["argv"] == expected[1:]
    assert started["env"][BATCH_INVARIANT_ENV] == "1"


# --- the front, against the test double ----------------------------------------------------


def test_front_salts_strict_requests_only_and_strips_strict_cache(
    fake: tuple[FakeVllm, str], front_url: str
) -> None:
    double, _ = fake
    client = sdk(front_url)
    start = len(double.received)
    for extra in (
        {"strict_cache": True},
        {"strict_cache": True},
        {},
        {"strict_cache": False, "cache_salt": "team-a"},
    ):
        client.chat.completions.create(
            model="served", messages=MESSAGES, seed=3, max_tokens=2, extra_body=extra
        )
    seen = double.received[start:]
    assert all("strict_cache" not in body for body in seen)
    salts = [body.get("cache_salt") for body in seen]
    assert salts[0] and salts[1] and salts[0] != salts[1], salts
    assert salts[2:] == [None, "team-a"]
    assert all(body["seed"] == 3 and body["messages"] == MESSAGES for body in seen)


def test_front_adds_the_block_to_a_json_reply(fake: tuple[FakeVllm, str], front_url: str) -> None:
    double, _ = fake
    client = sdk(front_url)
    fields: Any = {"model": "served", "messages": MESSAGES, "temperature": 0.5, "max_tokens": 2}
    shared = client.chat.completions.create(**fields, extra_body={"clock": "2025-06-01T12:00:00Z"})
    drawn = double.received[-1]["seed"]
    assert isinstance(drawn, int), "a request without a seed gets one drawn"
    block = block_of(shared)
    assert block["seed"] == drawn and block["kv_cache_mode"] == "shared"
    usage = shared.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert block["cached_tokens"] == 5 == usage.prompt_tokens_details.cached_tokens
    assert block["engine"] == f"vllm/{VERSION}" and block["batch_invariance"] is True
    assert block["invariance_path"] == "vllm-batch-invariant" and block["batch_peers_max"] is None
    assert block["weights_digest"] == DIGEST and block["model"] == "served"
    assert block["dtype"] == "bfloat16" and block["device"] == "cuda"
    assert (block["temperature"], block["top_p"], block["max_tokens"]) == (0.5, 1.0, 2)
    assert block["clock"] == "2025-06-01T12:00:00Z"
    assert block["prompt_digest"] == prompt_digest({"model": "served", "messages": MESSAGES})
    strict = client.chat.completions.create(**fields, seed=9, extra_body={"strict_cache": True})
    assert block_of(strict)["kv_cache_mode"] == "strict" and block_of(strict)["cached_tokens"] == 0
    assert list(block) == list(block_of(strict))


def test_a_pinned_request_gets_the_request_id_the_engine_would_derive(front_url: str) -> None:
    raw = json.dumps({"model": "served", "messages": MESSAGES, "seed": 5}).encode()
    with httpx.Client(base_url=front_url, timeout=30) as http:
        first = http.post("/v1/chat/completions", content=raw).json()["reproducibility"]
        again = http.post("/v1/chat/completions", content=raw).json()["reproducibility"]
    assert first["request_id"] == again["request_id"]
    assert first["request_id"] == "req_" + digest_hex(Domain.REQUEST, raw)[:32]


def test_front_ends_a_stream_with_the_block(fake: tuple[FakeVllm, str], front_url: str) -> None:
    double, _ = fake
    client = sdk(front_url)
    plain = list(
        client.chat.completions.create(
            model="served",
            messages=MESSAGES,
            seed=4,
            stream=True,
            extra_body={"strict_cache": True},
        )
    )
    assert double.received[-1]["stream_options"] == {"include_usage": True}
    assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices) == "hi you"
    last = plain[-1]
    assert last.choices == [] and last.usage is None, "usage only when the client asked"
    assert block_of(last)["kv_cache_mode"] == "strict" and block_of(last)["cached_tokens"] == 0
    with_usage = list(
        client.chat.completions.create(
            model="served",
            messages=MESSAGES,
            seed=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None and with_usage[-1].usage.total_tokens == 11
    assert block_of(with_usage[-1])["cached_tokens"] == 5
    assert sum(1 for c in with_usage if c.choices == []) == 1, "one trailer, no extra chunk"
    raw_body = json.dumps({"model": "served", "messages": MESSAGES, "stream": True}).encode()
    with httpx.Client(base_url=front_url, timeout=30) as http:
        events = http.post("/v1/chat/completions", content=raw_body).text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert json.loads(events[-3].removeprefix("data: "))["reproducibility"]["engine"].startswith(
        "vllm/"
    )


def test_front_passes_errors_through_and_refuses_bad_requests(front_url: str) -> None:
    with httpx.Client(base_url=front_url, timeout=30) as http:
        missing = http.post("/v1/chat/completions", json={"model": "nope", "messages": MESSAGES})
        assert missing.status_code == 404 and missing.json()["error"]["message"] == "no such model"
        not_json = http.post("/v1/chat/completions", content=b"{nope")
        assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"
        bad = {"model": "served", "messages": MESSAGES, "strict_cache": "yes"}
        refused = http.post("/v1/chat/completions", json=bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "strict_cache"
        assert http.get("/v1/models").json()["data"][0]["id"] == "served"
        assert http.get("/version").json() == {"version": VERSION}


def test_prepare_request_replaces_a_client_salt_when_strict() -> None:
    forwarded, strict = prepare_request({"model": "m", "cache_salt": "mine", "strict_cache": True})
    assert (
        strict and forwarded["cache_salt"].startswith("strict-") and "strict_cache" not in forwarded
    )
    again, _ = prepare_request({"model": "m", "cache_salt": "mine", "strict_cache": True})
    assert again["cache_salt"] != forwarded["cache_salt"]


# --- the front, against the real embedded engine -------------------------------------------


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    engine = Engine(tiny_model_dir, model_name="tiny").start()
    yield from serve_in_thread(create_app(engine))
    engine.close()


@pytest.fixture(scope="module")
def fronted_engine_url(engine_url: str, tiny_model_dir: Path) -> Iterator[str]:
    from inference.weights import weights_digest

    config = FrontConfig(
        upstream=engine_url,
        model="tiny",
        weights_digest=weights_digest(tiny_model_dir),
        batch_invariance=True,
        device="cpu",
    )
    yield from serve_in_thread(create_front(config))


def test_front_over_the_embedded_engine_keeps_its_reply_and_adds_the_block(
    engine_url: str, fronted_engine_url: str
) -> None:
    kwargs: Any = {
        "model": "tiny",
        "messages": MESSAGES,
        "seed": 21,
        "max_tokens": 8,
        "logprobs": True,
        "extra_body": {"strict_cache": True},
    }
    direct = sdk(engine_url).chat.completions.create(**kwargs)
    fronted = sdk(fronted_engine_url).chat.completions.create(**kwargs)
    assert fronted.choices[0].message.content == direct.choices[0].message.content
    assert fronted.choices[0].logprobs == direct.choices[0].logprobs
    mine, theirs = block_of(fronted), block_of(direct)
    assert list(mine) == list(theirs), "the same members in the same order"
    for key in ("seed", "weights_digest", "prompt_digest", "kv_cache_mode", "model", "top_k"):
        assert mine[key] == theirs[key], key
    assert mine["engine"] == "vllm/unknown" and theirs["engine"].startswith("affidavit-embedded/")
    assert mine["cached_tokens"] == 0 and mine["batch_peers_max"] == 0

    stream = list(sdk(fronted_engine_url).chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == direct.choices[0].message.content
    assert stream[-1].choices == [] and block_of(stream[-1])["kv_cache_mode"] == "strict"


def test_probe_through_the_front_finds_every_probe_identical(
    fronted_engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["probe", "--url", fronted_engine_url, "--probes", "2", "--batch-sizes", "1,4"]
    assert main([*args, "--max-tokens", "5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["batch_size"], r["identical"]) for r in rows] == [(1, 2), (4, 2)]
    assert rows[1]["peers_max"] is not None, "the front relays the engine's batch peers"
