"""``affidavit engine serve --backend vllm``: vLLM on a GPU, behind this project's reply shape.

Two halves, because vLLM knows how to run a model fast and this project knows what a
reply must carry to be replayed:

**The launcher** (:func:`vllm_command`, :func:`launch`) starts ``vllm serve`` on loopback
with what bit-exact replay needs: ``VLLM_BATCH_INVARIANT=1`` (vLLM's batch-invariant
kernels), a fixed ``--seed``, chunked prefill off and a batch token budget of at least the
model length (``--max-num-batched-tokens >= --max-model-len``, so a prompt is never split
differently depending on what else is queued), prefix caching on with
``--enable-prompt-tokens-details`` (so ``usage`` reports cached tokens), and
``--generation-config vllm`` (the model's ``generation_config.json`` may not change the
sampling defaults behind the request's back). Without ``vllm`` on ``PATH`` it exits 3.

**The front** (:func:`create_front`) is an OpenAI-compatible FastAPI app in front of that
vLLM. It forwards ``/v1/chat/completions`` and adds the ``reproducibility`` block (the same
members, in the same order, as the embedded engine's; non-streaming: a top-level member;
streaming: a last ``choices: []`` chunk before ``data: [DONE]``). A request with
``strict_cache: true`` loses that member (vLLM does not know it) and gains a single-use
``cache_salt``, so it neither reads nor leaves shared prefix-cache state; a request without
a ``seed`` gets one drawn, so the block names the seed that was used. Streams always ask
vLLM for usage (the cached-token count); the client sees usage only if it asked.

The block holds what the front knows: the model and its weights digest, the sampling
settings, ``engine`` ``vllm/<version>`` from vLLM's ``/version``, ``batch_invariance``
(the environment vLLM was started with), the cache mode, ``cached_tokens`` from
``usage.prompt_tokens_details`` (``null`` when vLLM does not report it) and the prompt
digest of the request as received. vLLM does not report batch peers, so
``batch_peers_max`` is ``null`` unless the upstream's own reply carries a block with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from inference.block import EngineInfo, reply_identity, reproducibility_block, system_fingerprint
from inference.checkpoint import WeightsSource
from inference.protocol import ApiError, error_body, json_bytes, parse_clock
from inference.sampling import new_seed
from inference.weights import weights_digest
from record.digest import prompt_digest

__all__ = [
    "BATCH_INVARIANT_ENV",
    "EXIT_MISSING",
    "FrontConfig",
    "VllmMissing",
    "create_front",
    "find_vllm",
    "launch",
    "model_max_len",
    "prepare_request",
    "serve_front",
    "vllm_command",
]

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
INVARIANT_PATH = "vllm-batch-invariant"
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_MISSING = 3
_GPU_HINT = "install the `gpu` extra on a machine with an NVIDIA GPU: pip install 'affidavit[gpu]'"


class VllmMissing(Exception):
    """``vllm`` is not on ``PATH``."""


def find_vllm() -> str:
    """The ``vllm`` executable; :class:`VllmMissing` when it is not installed."""
    found = shutil.which("vllm")
    if found is None:
        raise VllmMissing(f"`vllm` is not on PATH: {_GPU_HINT}")
    return found


def model_max_len(model_dir: str | Path) -> int:
    """The context length ``config.json`` declares (``ValueError`` when it declares none)."""
    raw = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    for scope in (raw, raw.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
            if isinstance(scope.get(key), int) and scope[key] > 0:
                return int(scope[key])
    raise ValueError(f"{model_dir}/config.json declares no context length; pass --max-model-len")


def vllm_command(
    model_dir: str | Path,
    *,
    port: int,
    max_model_len: int,
    seed: int,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    max_num_batched_tokens: int | None = None,
    batch_invariance: bool = True,
    executable: str = "vllm",
    extra_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` argv and environment for a replayable server (module docstring).

    ``environ`` (default ``os.environ``) is copied; ``VLLM_BATCH_INVARIANT`` is set to
    ``1``, or removed when ``batch_invariance`` is false. ``extra_args`` go last.
    """
    if max_model_len < 1:
        raise ValueError("max_model_len must be >= 1")
    budget = max_model_len if max_num_batched_tokens is None else max_num_batched_tokens
    if budget < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens {budget} < max_model_len {max_model_len}: a long prompt "
            "would be split across steps depending on the load"
        )
    argv = [executable, "serve", str(model_dir), "--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += [
        "--seed", str(seed),
        "--max-model-len", str(max_model_len),
        "--max-num-batched-tokens", str(budget),
        "--no-enable-chunked-prefill",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--generation-config", "vllm",
        *extra_args,
    ]  # fmt: skip
    env = dict(os.environ if environ is None else environ)
    if batch_invariance:
        env[BATCH_INVARIANT_ENV] = "1"
    else:
        env.pop(BATCH_INVARIANT_ENV, None)
    return argv, env


@dataclass(frozen=True)
class FrontConfig:
    """What the front knows of the vLLM behind it, for the block."""

    upstream: str
    model: str
    weights_digest: str
    batch_invariance: bool
    dtype: str = "auto"
    device: str = "cuda"


def prepare_request(raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The body to forward and whether the request is strict (``ApiError`` if malformed).

    ``strict_cache`` is removed; a strict request gets a fresh ``cache_salt`` (replacing
    any the client sent); a request without a ``seed`` gets one drawn.
    """
    strict = raw.get("strict_cache", False)
    if not isinstance(strict, bool):
        raise ApiError("strict_cache must be a boolean", param="strict_cache")
    forwarded = {k: v for k, v in raw.items() if k != "strict_cache"}
    if strict:
        forwarded["cache_salt"] = "strict-" + os.urandom(16).hex()
    if forwarded.get("seed") is None:
        forwarded["seed"] = new_seed()
    if forwarded.get("stream"):
        options = forwarded.get("stream_options")
        forwarded["stream_options"] = {**(options or {}), "include_usage": True}
    return forwarded, strict


def _engine_info(config: FrontConfig, version: str) -> EngineInfo:
    engine = f"vllm/{version}"
    path = INVARIANT_PATH if config.batch_invariance else "stock"
    return EngineInfo(
        model=config.model,
        weights_digest=config.weights_digest,
        weights_source=WeightsSource(format="safetensors").to_dict(),
        engine=engine,
        torch_version=torch.__version__,
        mkl_version=None,
        mkl_cbwr=None,
        device=config.device,
        dtype=config.dtype,
        batch_invariance=config.batch_invariance,
        invariance_path=path,
        tee_type=os.environ.get("AFFIDAVIT_TEE_TYPE") or "none",
        image_digest=os.environ.get("AFFIDAVIT_IMAGE_DIGEST") or None,
        system_fingerprint=system_fingerprint(config.weights_digest, engine, path),
    )


@dataclass
class _Exchange:
    """One request on its way through the front: what the block needs to know of it."""

    raw: dict[str, Any]
    forwarded: dict[str, Any]
    strict: bool
    request_id: str

    def block(self, info: EngineInfo, reply: Mapping[str, Any] | None) -> dict[str, Any]:
        """The reproducibility block, from the request and what the reply reported."""
        usage = (reply or {}).get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        upstream = (reply or {}).get("reproducibility") or {}
        peers = upstream.get("batch_peers_max")
        raw = self.raw
        top_k = raw.get("top_k")
        max_tokens = raw.get("max_tokens")
        if max_tokens is None:
            max_tokens = raw.get("max_completion_tokens")
        block = reproducibility_block(
            info,
            request_id=self.request_id,
            seed=self.forwarded["seed"],
            temperature=_number(raw.get("temperature"), 1.0),
            top_p=_number(raw.get("top_p"), 1.0),
            top_k=top_k if isinstance(top_k, int) else 0,
            max_tokens=0,
            clock=raw.get("clock"),
            kv_cache_mode="strict" if self.strict else "shared",
            cached_tokens=0,
            batch_peers_max=0,
            prompt_digest=prompt_digest(raw),
        )
        return dict(
            block,
            max_tokens=max_tokens,
            cached_tokens=cached if isinstance(cached, int) else None,
            batch_peers_max=peers if isinstance(peers, int) else None,
        )


def _number(value: Any, default: float) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


def _exchange(body: bytes) -> _Exchange:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    clock = raw.get("clock")
    if clock is not None and not isinstance(clock, str):
        raise ApiError("clock must be an RFC 3339 string", param="clock")
    instant = parse_clock(clock) if clock is not None else None
    forwarded, strict = prepare_request(raw)
    identity = reply_identity(body, pinned=raw.get("seed") is not None, clock=instant)
    return _Exchange(raw, forwarded, strict, identity.request_id)


def _error(exc: ApiError) -> Response:
    return Response(json_bytes(exc.body()), status_code=exc.status, media_type="application/json")


def _bad_gateway(exc: Exception) -> Response:
    body = error_body(f"vLLM did not answer: {exc}", type="server_error", param=None, code=None)
    return Response(json_bytes(body), status_code=502, media_type="application/json")


def create_front(
    config: FrontConfig, *, transport: httpx.AsyncBaseTransport | None = None
) -> FastAPI:
    """The front app for the vLLM at ``config.upstream`` (``transport``: tests only)."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(None, connect=10.0)
        async with httpx.AsyncClient(
            base_url=config.upstream, timeout=timeout, trust_env=False, transport=transport
        ) as client:
            state["client"] = client
            state["info"] = _engine_info(config, await _version(client))
            yield

    app = FastAPI(title="affidavit vLLM front", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.get("/v1/models")
    async def models() -> Response:
        return await _relay_get(state["client"], "/v1/models")

    @app.get("/version")
    async def version() -> Response:
        return await _relay_get(state["client"], "/version")

    @app.get("/health")
    async def health() -> Response:
        return await _relay_get(state["client"], "/health")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            exchange = _exchange(await request.body())
        except ApiError as exc:
            return _error(exc)
        client: httpx.AsyncClient = state["client"]
        info: EngineInfo = state["info"]
        upstream = client.build_request(
            "POST",
            "/v1/chat/completions",
            content=json_bytes(exchange.forwarded),
            headers={"content-type": "application/json"},
        )
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return _bad_gateway(exc)
        if response.status_code != 200 or not exchange.forwarded.get("stream"):
            try:
                payload = await response.aread()
            finally:
                await response.aclose()
            if response.status_code != 200:
                media = response.headers.get("content-type", "application/json")
                return Response(payload, status_code=response.status_code, media_type=media)
            try:
                reply = json.loads(payload)
            except ValueError as exc:
                return _bad_gateway(exc)
            if not isinstance(reply, dict):
                return _bad_gateway(ValueError("the reply is not a JSON object"))
            reply["reproducibility"] = exchange.block(info, reply)
            return Response(json_bytes(reply), media_type="application/json")
        return StreamingResponse(
            _relay_stream(response, exchange, info), media_type="text/event-stream"
        )

    return app


async def _version(client: httpx.AsyncClient) -> str:
    """vLLM's version from ``/version``, or ``unknown`` when it does not say."""
    try:
        response = await client.get("/version")
        found = response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        found = None
    return str(found) if found else "unknown"


async def _relay_get(client: httpx.AsyncClient, path: str) -> Response:
    try:
        response = await client.get(path)
    except httpx.HTTPError as exc:
        return _bad_gateway(exc)
    media = response.headers.get("content-type", "application/json")
    return Response(response.content, status_code=response.status_code, media_type=media)


async def _relay_stream(
    response: httpx.Response, exchange: _Exchange, info: EngineInfo
) -> AsyncIterator[bytes]:
    """Pass the chunks through; hold back choice-less ones; end with the block and DONE."""
    options = exchange.raw.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    last: dict[str, Any] = {}
    held: dict[str, Any] | None = None
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                yield _trailer(held, last, exchange, info, wants_usage)
                yield b"data: [DONE]\n\n"
                return
            try:
                event = json.loads(data)
            except ValueError:
                event = None
            if isinstance(event, dict) and event.get("choices") == [] and "error" not in event:
                held = event  # vLLM's usage chunk, or an upstream trailer with a block
                continue
            if isinstance(event, dict):
                last = event
            yield ("data: " + data + "\n\n").encode("utf-8")
    finally:
        await response.aclose()


def _trailer(
    held: dict[str, Any] | None,
    last: dict[str, Any],
    exchange: _Exchange,
    info: EngineInfo,
    wants_usage: bool,
) -> bytes:
    """The last chunk: no choices, the block, and ``usage`` only when the client asked."""
    base = held or last
    chunk: dict[str, Any] = {
        "id": base.get("id"),
        "object": "chat.completion.chunk",
        "created": base.get("created"),
        "model": base.get("model"),
        "system_fingerprint": base.get("system_fingerprint"),
        "choices": [],
    }
    if wants_usage and held is not None and held.get("usage") is not None:
        chunk["usage"] = held["usage"]
    chunk["reproducibility"] = exchange.block(info, held)
    return b"data: " + json_bytes(chunk) + b"\n\n"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> str | None:
    """``None`` once vLLM answers ``/health``; else why it never will."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            return f"vllm serve exited with status {code} before it was ready"
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            opener.open(url + "/health", timeout=5) as reply,
        ):
            if reply.status == 200:
                return None
        time.sleep(1.0)
    return f"vllm serve was not ready after {timeout_s:.0f} s"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def launch(args: argparse.Namespace) -> int:
    """``engine serve --backend vllm``: start vLLM, front it until interrupted.

    Exit 0 after a clean stop, 1 when vLLM fails to start, 2 bad options, 3 ``vllm`` or
    the model directory missing.
    """
    try:
        executable = find_vllm()
    except VllmMissing as exc:
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        return EXIT_MISSING
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        print(
            f"affidavit: missing: no model directory (config.json) at {model_dir}", file=sys.stderr
        )
        return EXIT_MISSING
    try:
        max_len = args.max_model_len or model_max_len(model_dir)
        upstream_port = args.upstream_port or _free_port("127.0.0.1")
        name = args.model_name or model_dir.resolve().name
        argv, env = vllm_command(
            model_dir,
            port=upstream_port,
            max_model_len=max_len,
            seed=args.seed,
            served_model_name=name,
            batch_invariance=args.batch_invariance,
            executable=executable,
            extra_args=tuple(args.vllm_arg or ()),
        )
    except ValueError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = FrontConfig(
        upstream=f"http://127.0.0.1:{upstream_port}",
        model=name,
        weights_digest=weights_digest(model_dir),
        batch_invariance=env.get(BATCH_INVARIANT_ENV) == "1",
        dtype=_config_dtype(model_dir),
    )
    print("starting: " + " ".join(argv), flush=True)
    process = subprocess.Popen(argv, env=env)
    try:
        problem = _wait_ready(process, config.upstream, args.startup_timeout)
        if problem is not None:
            print(f"affidavit: {problem}", file=sys.stderr)
            return EXIT_PROBLEM
        serve_front(config, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        _stop(process)
    return 0


def serve_front(
    config: FrontConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Bind, print the address (port 0 picks a free one), serve the front until interrupted."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_front(config), log_level=log_level))
    print(
        f"affidavit vLLM front serving {config.model!r} on http://{host}:{bound} "
        f"(vLLM on {config.upstream})",
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _config_dtype(model_dir: Path) -> str:
    raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    dtype = raw.get("torch_dtype") or raw.get("dtype")
    return str(dtype) if dtype else "auto"
