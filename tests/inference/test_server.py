"""``affidavit engine serve`` over HTTP: OpenAI shapes, determinism, batching, bad input.

Uvicorn runs in a thread over one :class:`Engine` on the shipped tiny model (one test
starts the real CLI as a subprocess). Proved here: the ``openai`` SDK parses JSON and SSE
replies, with and without tools, logprobs, usage and the ``reproducibility`` block (a last
``choices: []`` event); a pinned reply is the same bytes every time (ids and ``created``
from the request and its clock), an unpinned one reports the seed it drew; ``stop`` cuts
the text; required and named tool calls parse and match their schema (or end ``length``),
with derived ids; ``none`` never samples the tag. Batch invariance: 12 pinned probes give
the same reply (all but ``batch_peers_max``, which proves the batch formed) alone and in
batches of 2 and 8 of concurrent random requests, 3 of them in batches of 32. The prefix
cache: warm shared requests report cached tokens, strict replies are identical warm or
cold with 0 cached, scopes do not mix. Bad input gets a 4xx OpenAI error object and the
server keeps serving; unknown fields are logged; a client leaving mid-stream frees its slot.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

for _module in ("torch", "fastapi", "uvicorn", "httpx", "openai"):
    pytest.importorskip(_module, reason="the server tests need the `engine` and `dev` extras")

import httpx  # noqa: E402
import openai  # noqa: E402

from inference.block import prompt_tokens_digest  # noqa: E402
from inference.server import Engine, create_app  # noqa: E402
from inference.tool_calls import derived_tool_call_ids  # noqa: E402
from record.digest import Domain, digest_hex, prompt_digest  # noqa: E402
from record.limits import MAX_DEPTH as MAX_NESTING  # noqa: E402
from record.limits import nesting_depth  # noqa: E402
from tests.inference.serving import serve_in_thread  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60.0
WORDS = ("the", "a", "cat", "sat", "on", "mat", "sky", "tool", "call", "city", "river", "stone")
CLOCK = "2025-06-01T12:00:00Z"
UNIT = {"type": "string", "enum": ["c", "f"]}
CITY = {"type": "string", "maxLength": 24}  # a random model's free string may never close
PROPERTIES = {"city": CITY, "days": {"type": "integer"}, "unit": UNIT}
ARGS = {"type": "object", "properties": PROPERTIES, "required": ["city", "unit"]}
WEATHER: Any = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {**ARGS, "additionalProperties": False}},
}
CLOCK_TOOL: Any = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    e = Engine(tiny_model_dir, model_name="tiny").start()
    yield e
    e.close()


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    yield from serve_in_thread(create_app(engine), timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S, limits=limits) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _request(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], **fields}


def _post(http: httpx.Client, body: dict[str, Any] | bytes, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post("/v1/chat/completions", content=content, **kw)


def _sse(raw: bytes) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; asserts the framing and the final ``[DONE]``."""
    events = raw.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    assert all(e.startswith("data: ") for e in events[:-1])
    return [json.loads(e[len("data: ") :]) for e in events[:-2]]


def _block(completion: Any) -> dict[str, Any]:
    """The ``reproducibility`` block the SDK keeps among a reply's extra members."""
    return dict(completion.model_extra["reproducibility"])


def test_models_and_non_streaming_reply_through_the_sdk(sdk: openai.OpenAI, engine: Engine) -> None:
    assert [m.id for m in sdk.models.list().data] == ["tiny"]
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    completion = sdk.chat.completions.create(
        model="tiny",
        messages=messages,
        seed=7,
        temperature=0.8,
        top_p=0.95,
        max_tokens=12,
        logprobs=True,
        top_logprobs=2,
        extra_body={"top_k": 50, "clock": CLOCK, "strict_cache": True},
    )
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "tiny"
    assert isinstance(choice.message.content, str) and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert completion.created == 1748779200  # the clock's instant
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.completion_tokens <= 12 and usage.prompt_tokens_details.cached_tokens == 0
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in choice.logprobs.content)

    block = _block(completion)
    assert completion.system_fingerprint == block["system_fingerprint"]
    settings = ("seed", "temperature", "top_p", "top_k", "max_tokens", "clock", "model")
    assert [block[k] for k in settings] == [7, 0.8, 0.95, 50, 12, CLOCK, "tiny"]
    run = ("device", "dtype", "batch_invariance", "invariance_path", "kv_cache_mode")
    assert [block[k] for k in run] == ["cpu", "float32", True, engine.model.linear_path, "strict"]
    assert [block[k] for k in ("cached_tokens", "batch_peers_max", "tee_type", "image_digest")] == [
        0, 0, "none", None
    ]  # fmt: skip
    assert block["weights_digest"] == engine.info.weights_digest
    assert block["prompt_digest"] == prompt_digest({"model": "tiny", "messages": messages})
    assert block["engine"].startswith("affidavit-embedded/")
    assert block["request_id"] == "req_" + completion.id.removeprefix("chatcmpl-")


def test_streaming_through_the_sdk_matches_the_json_reply(sdk: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "stream me a story"}],
        "seed": 11,
        "max_tokens": 16,
        "logprobs": True,
        "extra_body": {"strict_cache": True},
    }
    whole = sdk.chat.completions.create(**kwargs)
    chunks = list(
        sdk.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    streamed_logprobs = [
        t.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
    assert streamed_logprobs == [t.token for t in whole.choices[0].logprobs.content]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == [] and last.usage == whole.usage
    block = _block(last)
    assert block["seed"] == 11 and block["kv_cache_mode"] == "strict"


def test_a_pinned_reply_is_the_same_bytes_every_time(http: httpx.Client) -> None:
    body = json.dumps(_request("same bytes please", seed=3, max_tokens=10, clock=CLOCK))
    raw = (body[:-1] + ',"strict_cache":true}').encode()
    first, second = _post(http, raw), _post(http, raw)
    assert first.status_code == 200 and first.content == second.content
    reply = first.json()
    assert reply["id"] == "chatcmpl-" + digest_hex(Domain.REQUEST, raw)[:32]
    assert reply["created"] == 1748779200 and reply["reproducibility"]["clock"] == CLOCK

    streamed = raw[:-1] + b',"stream":true}'
    one, two = _post(http, streamed), _post(http, streamed)
    assert one.headers["content-type"].startswith("text/event-stream")
    assert one.content == two.content
    events = _sse(one.content)
    assert events[-1]["choices"] == [] and "reproducibility" in events[-1]
    assert {e["id"] for e in events} == {"chatcmpl-" + digest_hex(Domain.REQUEST, streamed)[:32]}
    assert (
        "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        == (reply["choices"][0]["message"]["content"])
    )
    no_clock = _post(http, _request("x", seed=3, max_tokens=2)).json()
    assert no_clock["created"] == 0


def test_an_unpinned_request_reports_the_seed_it_drew(http: httpx.Client) -> None:
    request = _request("surprise me", max_tokens=10, strict_cache=True)
    a, b = _post(http, request).json(), _post(http, request).json()
    assert a["id"] != b["id"]
    seed = a["reproducibility"]["seed"]
    assert isinstance(seed, int) and seed != b["reproducibility"]["seed"]
    replay = _post(http, {**request, "seed": seed}).json()
    assert replay["choices"] == a["choices"]


def test_stop_sequences_cut_the_text(http: httpx.Client) -> None:
    full = ""
    for seed in range(50):  # the first seed whose answer is long enough (deterministic)
        request = _request("a long answer", seed=seed, max_tokens=40, temperature=0.7)
        full = _post(http, request).json()["choices"][0]["message"]["content"]
        if len(full) > 20 and "\ufffd" not in full[:16]:
            break
    stop = full[12:15]
    assert len(full) > 20 and stop
    cut = full[: full.index(stop)]
    reply = _post(http, {**request, "stop": [stop, "never-seen"]}).json()
    assert reply["choices"][0]["message"]["content"] == cut
    assert reply["choices"][0]["finish_reason"] == "stop"
    events = _sse(_post(http, {**request, "stop": stop, "stream": True}).content)
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert streamed == cut and events[-2]["choices"][0]["finish_reason"] == "stop"


def _check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert isinstance(args, dict) and {"city", "unit"} <= set(args) <= {"city", "unit", "days"}
    assert isinstance(args["city"], str) and args["unit"] in ("c", "f")
    assert type(args.get("days", 0)) is int


def test_required_and_named_tool_calls_through_the_sdk(sdk: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "weather in Oslo?"}]
    for seed in (1, 2, 3):
        completion = sdk.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=[WEATHER, CLOCK_TOOL],
            tool_choice="required",
            seed=seed,
            max_tokens=200,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls: Any = choice.message.tool_calls or []
        assert len(calls) == 1 and calls[0].type == "function"
        request = {"model": "tiny", "messages": messages, "tools": [WEATHER, CLOCK_TOOL]}
        request["tool_choice"] = "required"
        assert [c.id for c in calls] == derived_tool_call_ids(prompt_digest(request), seed, 1)
        if calls[0].function.name == "get_weather":
            _check_weather(calls[0].function.arguments)
        else:
            assert json.loads(calls[0].function.arguments) == {}

    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    stream = sdk.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER, CLOCK_TOOL], tool_choice=named,
        seed=9, max_tokens=200, stream=True,
    )  # fmt: skip
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(deltas) == 1 and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    _check_weather(deltas[0].function.arguments or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_cut_tool_call_ends_with_length(http: httpx.Client) -> None:
    request = _request("weather?", tools=[WEATHER], tool_choice="required", seed=4)
    reply = _post(http, {**request, "max_tokens": 6}).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] is None
    assert choice["message"]["content"].startswith("<tool_call>")


def test_tool_choice_none_and_auto(http: httpx.Client, engine: Engine) -> None:
    assert engine.tokenizer.token_to_id("<tool_call>") is not None  # one token, masked out
    for seed in range(4):
        request = _request("hi", tools=[WEATHER], tool_choice="none", seed=seed)
        reply = _post(http, {**request, "max_tokens": 40, "logprobs": True}).json()
        tokens = [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]
        assert "<tool_call>" not in tokens and reply["choices"][0]["message"]["tool_calls"] is None
    auto = _post(http, _request("hi", tools=[WEATHER], seed=1, max_tokens=30)).json()
    assert auto["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_several_opening_system_messages_and_the_developer_role_reach_the_template(
    sdk: openai.OpenAI, engine: Engine
) -> None:
    """An agent framework's instructions, the proxy's clock and a client's own system prompt:
    the tiny model's template takes one system message, first, and knows no ``developer``."""
    messages: Any = [
        {"role": "system", "content": "Current date and time: 2026-11-30T14:20:30Z (UTC)"},
        {"role": "developer", "content": [{"type": "text", "text": "You are an agent."}]},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    reply = sdk.chat.completions.create(model="tiny", messages=messages, seed=1, max_tokens=8)
    assert reply.choices[0].finish_reason in ("stop", "length")
    job, _ = engine.prepare(json.dumps(_request("", messages=messages)).encode(), {})
    prompt = engine.tokenizer.decode(job.prompt_ids)
    opening = "Current date and time: 2026-11-30T14:20:30Z (UTC)\n\nYou are an agent.\n\nBe brief."
    assert prompt.startswith(f"<|im_start|>system\n{opening}<|im_end|>\n<|im_start|>user\n")
    ran = reply.model_extra["reproducibility"]["prompt_tokens_digest"]  # the ids the model ran
    assert ran == prompt_tokens_digest(job.prompt_ids)
    later: Any = [*messages, {"role": "assistant", "content": "ok"}, messages[2]]
    refused = sdk.chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError, match="only allowed first"):
        refused.create(model="tiny", messages=later, seed=1, max_tokens=8)  # the template's say


def test_batch_invariance_over_http(http: httpx.Client, engine: Engine) -> None:
    rng = random.Random(2024)

    def other() -> dict[str, Any]:
        request = _request(
            " ".join(rng.choices(WORDS, k=rng.randint(1, 25))),
            seed=rng.randrange(2**40),
            temperature=rng.choice([0.0, 0.6, 1.0, 1.4]),
            top_p=rng.choice([1.0, 0.8]),
            top_k=rng.choice([0, 10]),
            max_tokens=rng.randint(3, 12),
            strict_cache=rng.random() < 0.5,
            logprobs=rng.random() < 0.5,
        )
        if rng.random() < 0.2:
            request.update(tools=[WEATHER], tool_choice="required")
        return request

    def run(batch: list[dict[str, Any]], pool: ThreadPoolExecutor) -> list[dict[str, Any]]:
        engine.scheduler.pause()
        try:
            futures = [pool.submit(_post, http, r) for r in batch]
            _wait(lambda: engine.scheduler.stats().waiting == len(batch), "the batch to queue")
        finally:
            engine.scheduler.resume()
        replies = [f.result() for f in futures]
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json() for r in replies]

    def without_peers(reply: dict[str, Any]) -> dict[str, Any]:
        block = dict(reply["reproducibility"])
        return {**reply, "reproducibility": block, "peers": block.pop("batch_peers_max")}

    checked = {2: 0, 8: 0, 32: 0}
    with ThreadPoolExecutor(max_workers=32) as pool:
        for index in range(12):
            probe = _request(
                f"probe {index}: {' '.join(rng.choices(WORDS, k=5))}",
                seed=index,
                temperature=0.9,
                max_tokens=8,
                logprobs=True,
                top_logprobs=3,
                strict_cache=True,
            )
            alone = without_peers(_post(http, probe).json())
            assert alone["peers"] == 0
            for size in (2, 8, 32) if index < 3 else (2, 8):
                batch = [other() for _ in range(size - 1)]
                at = rng.randrange(size)
                batch.insert(at, probe)
                mine = without_peers(run(batch, pool)[at])
                assert mine["peers"] == size - 1, (index, size)
                assert {**mine, "peers": 0} == alone, (index, size)
                checked[size] += 1
    assert checked == {2: 12, 8: 12, 32: 3}


def test_prefix_cache_shared_and_strict(http: httpx.Client, engine: Engine) -> None:
    engine.prefix_cache.clear()
    shared = _request("tell me about the river and the stone", seed=21, max_tokens=6)
    cold = _post(http, {**shared, "cache_salt": "team-a"}).json()
    warm = _post(http, {**shared, "cache_salt": "team-a"}).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and warm["reproducibility"]["cached_tokens"] == cached
    assert warm["reproducibility"]["kv_cache_mode"] == "shared"
    assert warm["choices"] == cold["choices"]
    other_salt = _post(http, {**shared, "cache_salt": "team-b"}).json()
    assert other_salt["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    header = {"X-Affidavit-Session": "session-1"}
    _post(http, shared, headers=header)
    assert _post(http, shared, headers=header).json()["reproducibility"]["cached_tokens"] > 0
    fresh = _post(http, shared, headers={"X-Affidavit-Session": "session-2"}).json()
    assert fresh["reproducibility"]["cached_tokens"] == 0

    strict = json.dumps({**shared, "strict_cache": True}).encode()
    engine.prefix_cache.clear()
    lookups = engine.prefix_cache.stats().lookups
    strict_cold = _post(http, strict)
    assert engine.prefix_cache.stats().lookups == lookups
    assert engine.prefix_cache.stats().entries == 0
    _post(http, shared)  # warm the default scope with the same prompt
    strict_warm = _post(http, strict)
    assert strict_warm.content == strict_cold.content
    block = strict_warm.json()["reproducibility"]
    assert block["cached_tokens"] == 0 and block["kv_cache_mode"] == "strict"


BAD_TOOL = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
NOPE = {"type": "function", "function": {"name": "nope"}}
CTX = "context_length_exceeded"
BAD_INPUT: list[tuple[str, bytes | dict[str, Any], int, str | None, str | None]] = [
    ("invalid json", b'{"model": "tiny",', 400, None, "invalid_json"),
    ("not an object", b"[1, 2]", 400, None, "invalid_json"),
    ("NaN", b'{"model": "tiny", "messages": [], "temperature": NaN}', 400, None, "invalid_json"),
    ("unknown model", _request("hi", model="gpt-9"), 404, "model", "model_not_found"),
    ("max_tokens", _request("hi", max_tokens=5000), 400, "max_tokens", CTX),
    ("long prompt", _request("word " * 3000), 400, "messages", CTX),
    ("tool schema", _request("hi", tools=BAD_TOOL), 400, "tools", "invalid_tools"),
    ("tool not a dict", _request("hi", tools=["f"]), 400, "tools", "invalid_tools"),
    ("tool_choice", _request("hi", tools=[WEATHER], tool_choice="x"), 400, "tool_choice", None),
    ("named tool", _request("hi", tools=[WEATHER], tool_choice=NOPE), 400, "tool_choice", None),
    ("required, no tools", _request("hi", tool_choice="required"), 400, "tool_choice", None),
    ("n", _request("hi", n=2), 400, "n", None),
    ("temperature", _request("hi", temperature=3), 400, "temperature", None),
    ("clock", _request("hi", clock="2025-06-01T12:00:00+02:00"), 400, "clock", None),
    ("no messages", _request("hi", messages=[]), 400, "messages", None),
    ("role", _request("hi", messages=[{"role": "wizard", "content": "x"}]), 400, "messages", None),
    ("top_logprobs", _request("hi", top_logprobs=2), 400, "top_logprobs", None),
    ("stop", _request("hi", stop=["a", "b", "c", "d", "e"]), 400, "stop", None),
    ("missing model", {"messages": [{"role": "user", "content": "x"}]}, 400, "model", None),
]


@pytest.mark.parametrize("case", BAD_INPUT, ids=[case[0] for case in BAD_INPUT])
def test_bad_input_gets_an_openai_error(http: httpx.Client, case: tuple[Any, ...]) -> None:
    _, body, status, param, code = case
    response = _post(http, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert code is None or error["code"] == code
    assert _post(http, _request("still serving", seed=1, max_tokens=2)).status_code == 200


def test_other_routes_and_the_sdk_error(http: httpx.Client, sdk: openai.OpenAI) -> None:
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404 and set(missing.json()["error"]) >= {"message", "type"}
    assert http.get("/v1/chat/completions").status_code == 405
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_found"


def test_unknown_fields_are_ignored_and_logged(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="affidavit.engine")
    extra = {"presence_penalty": 0.5, "parallel_tool_calls": False, "metadata": {"k": "v"}}
    request = _request("hi", seed=2, max_tokens=3, stream_options={"include_usage": True, "x": 1})
    reply = _post(http, {**request, **extra})
    assert reply.status_code == 200
    ignored = "['metadata', 'parallel_tool_calls', 'presence_penalty', 'stream_options.x']"
    assert any(ignored in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


@pytest.mark.parametrize("stream", [True, False], ids=["mid-stream", "before-json"])
def test_a_client_that_leaves_frees_its_slot(
    base_url: str, http: httpx.Client, stream: bool
) -> None:
    def scheduler() -> dict[str, int]:
        stats: dict[str, int] = http.get("/v1/engine/stats").json()["scheduler"]
        return stats

    before = scheduler()
    request = _request("go on forever", seed=1, temperature=0, max_tokens=1900, stream=stream)
    body = json.dumps(request).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", int(base_url.rsplit(":", 1)[1]))) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.sendall(head % len(body) + body)
        received = b""
        while stream and b"data: " not in received:  # the headers, then one chunk
            received += sock.recv(4096)
        _wait(lambda: scheduler()["running"] == 1, "the request to run")
    _wait(lambda: scheduler()["running"] == 0, "the slot to free")
    after = scheduler()
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["steps"] - before["steps"] < 1900


def test_the_cli_serves_as_a_subprocess(tiny_model_dir: Path) -> None:
    command = [sys.executable, "-m", "affidavit", "engine", "serve", "--model"]
    command += [str(tiny_model_dir), "--port", "0", "--model-name", "tiny"]
    command += ["--no-batch-invariance", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert lines[0].startswith("batch invariance off"), lines
        assert "serving 'tiny' on http://127.0.0.1:" in lines[1], lines
        port = int(lines[1].rsplit(":", 1)[1])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], seed=1, max_tokens=4
        )
        block = _block(reply)
        assert block["batch_invariance"] is False and block["invariance_path"] == "stock"
    finally:
        process.terminate()
        process.wait(TIMEOUT_S)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize("depth", [129, 5000])
def test_a_request_nested_too_deep_is_a_400_on_every_route(
    http: httpx.Client, route: str, depth: int
) -> None:
    """Past MAX_NESTING (and past what the JSON parser itself recurses into) the engine says
    what is wrong instead of failing inside the template, the schema check or the grammar."""
    assert MAX_NESTING == 128
    if depth < 500:
        schema: Any = {"type": "integer"}
        while nesting_depth(schema) < depth - 4:  # the request's own members add four levels
            schema = {"type": "array", "items": schema}
        tool = {"type": "function", "function": {"name": "t", "parameters": schema}}
        raw = json.dumps(_request("hi", max_tokens=2, tools=[tool])).encode()
        assert nesting_depth(json.loads(raw)) == depth
    else:  # deeper than Python's own JSON parser recurses
        raw = json.dumps(_request("hi", max_tokens=2))[:-1].encode()
        raw += b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    reply = http.post(route, content=raw)
    assert reply.status_code == 400, reply.text
    assert f"more than {MAX_NESTING} deep" in reply.text
    ok = http.post("/v1/chat/completions", content=json.dumps(_request("hi", max_tokens=2)))
    assert ok.status_code == 200  # the engine is fine afterwards


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize(
    "extra",
    [
        {"x": 10**5000},  # past int()'s own limit: never a 500
        {"x": float("1." + "1" * 120)},  # a number's text past record.limits
        {"tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(1025)]},
    ],
    ids=["a 5001-digit integer", "a 122-character number", "1025 tools"],
)
def test_a_request_past_the_shared_limits_is_a_400_on_every_route(
    http: httpx.Client, route: str, extra: dict[str, Any]
) -> None:
    """The engine reads requests within the proxy's limits (``record.limits``), so whatever
    the proxy accepted the engine reads, and past them it says which limit, never a 500."""
    import sys

    body = {**_request("hi", max_tokens=2), **extra}
    if "x" in extra and isinstance(extra["x"], float):
        raw = json.dumps(body).replace(repr(extra["x"]), "1." + "1" * 120).encode()
    else:
        sys.set_int_max_str_digits(0)  # to write the test's own body
        try:
            raw = json.dumps(body).encode()
        finally:
            sys.set_int_max_str_digits(4300)
    reply = http.post(route, content=raw)
    assert reply.status_code == 400, reply.text
    assert "past a limit" in reply.text
