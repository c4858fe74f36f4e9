"""``make demo``: one pinned agent turn through the egress proxy, recorded, replayed, verified.

Everything runs on this machine, on loopback, on the embedded defaults: the shipped tiny
model behind the embedded engine (an in-process uvicorn thread), the egress proxy in front
of it writing the record, and a loopback page server standing in for the web. The turn is
driven with the official ``openai`` client through the session's ``base_url``, so what is
recorded is what a real agent's calls look like. Then the turn is replayed from the record
(``harness.demo_replay``) and the store and its exported bundle are verified with the user's
key. Exit codes: 0 fine, 1 a verdict differs or a verification fails, 2 the workdir is not
empty, 3 the ``engine`` extra (or the ``openai`` client) is missing.

What is not here yet, and stands in: the harness turn loop (the demo drives the two steps
itself), the control plane (the demo appends the harness events through the proxy's own
``Log``) and the proxy's replay transport (the demo re-sends recorded bytes to the engine).
The clock is the proxy's: it samples one per model call and injects it into the prompt and,
for the engine, into the request's ``clock`` member.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

    from egress_proxy.server import ProxyServer
    from inference.server import Engine
    from record.log import Appended
    from record.schema import Strict
    from record.seal import KeyPair

MODEL = "affidavit-tiny"
PINS: dict[str, Any] = {
    "seed": 42,
    "temperature": 0.7,
    "top_p": 0.95,
    "max_tokens": 64,
    "strict_cache": True,
}
QUESTION = "What does the page at http://127.0.0.1/ say? Fetch it."
PAGE = (
    b"<html><head><title>Affidavit demo page</title></head><body><p>This page was served on "
    b"127.0.0.1 by the demo's page server. Nothing left this machine.</p></body></html>\n"
)
# The tool-call framing is 21 tokens of the tiny model's vocabulary, so a URL capped at 24
# characters fits max_tokens 64 unless the model spells it in escapes. The run is pinned, so
# it fits every time or never (on this build: about 30 tokens); a cut call fails the demo.
WEB_FETCH: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "web_fetch",
        "description": "Fetch a web page and return its body.",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string", "maxLength": 24}},
            "required": ["url"],
            "additionalProperties": False,
        },
    },
}
_ENGINE_MODULES = ("torch", "tokenizers", "safetensors", "jinja2")


class DemoFailed(Exception):
    """A step of the demo could not go on (not a verdict: those are printed and counted)."""


def run_demo(workdir: Path | None = None) -> int:
    """Run the demo in ``workdir`` (created; a fresh temporary folder when None)."""
    if (
        workdir is not None
        and workdir.exists()
        and (not workdir.is_dir() or any(workdir.iterdir()))
    ):
        print(f"{workdir} is not empty: give the demo a new or empty --workdir", file=sys.stderr)
        return 2
    missing = [m for m in _ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"the demo runs the embedded engine, which needs {', '.join(missing)}: "
            "pip install 'affidavit[engine]'",
            file=sys.stderr,
        )
        return 3
    if importlib.util.find_spec("openai") is None:
        print(
            "the demo drives the turn with the official client: pip install openai",
            file=sys.stderr,
        )
        return 3
    workdir = workdir or Path(tempfile.mkdtemp(prefix="affidavit-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return _Demo(workdir).run()
    except DemoFailed as exc:
        print(f"demo FAILED: {exc}")
        return 1
    except Exception as exc:  # a part broke: say so, keep the exit code contract
        traceback.print_exc()
        print(f"demo FAILED: {type(exc).__name__}: {exc}")
        return 1


@dataclass
class _Demo:
    workdir: Path
    started: float = field(default_factory=time.monotonic)

    def run(self) -> int:
        import torch

        from egress_proxy.config import parse_config
        from egress_proxy.server import ProxyServer
        from harness.demo_replay import replay_turn, summary
        from inference.make_model import make_model
        from record.log import Log
        from record.seal import KeyPair

        # Decoding on a 2-core machine is much slower with 2 threads once anything else runs.
        torch.set_num_threads(1)
        w = self.workdir
        print("affidavit demo: one pinned agent turn through the egress proxy, recorded,")
        print(f"replayed and verified. Working in {w}\n")

        made = make_model(w / "model")
        user, appliance = KeyPair.generate(), KeyPair.generate()
        user.write(w / "user.key")
        appliance.write(w / "appliance.key")
        store_path = w / "record.db"

        with serve_engine(made.path) as (engine, engine_url), _serve(_page_app) as page_url:
            print("Set-up")
            print(f"  model   the shipped tiny model, weights {made.weights_digest[:19]}…")
            print(
                f"  engine  {engine_url} (in-process, {engine.model.linear_path} linear path, "
                "1 torch thread)"
            )
            config = parse_config(
                {
                    "listen": {"host": "127.0.0.1", "port": 0},
                    "providers": {
                        "engine": {
                            "api": "openai",
                            "base_url": engine_url,
                            "engine_extensions": True,  # strict_cache and clock members
                        }
                    },
                    "mounts": {"/v1/chat/completions": "engine"},
                }
            )
            with (
                Log.open(store_path, appliance_key=appliance) as log,
                ProxyServer(config, log) as proxy,
            ):
                print(f"  proxy   {proxy.url} → provider engine (api openai), store record.db")
                print(f"  web     {page_url} serves web_fetch's one page (no internet)\n")
                stream, answer_seq = self.turn(proxy, page_url, user)
            # The proxy is stopped and the record closed: replay and audit read it as a file.
            print(
                f"\nReplay (each recorded request re-sent to {engine_url}, tools from the record)"
            )
            verdicts = replay_turn(store_path, stream, user, engine_url)
        for verdict in verdicts:
            print(verdict.line())
        print(summary(verdicts))
        verified = self.verify(store_path, stream, user, answer_seq)
        ok = all(v.ok for v in verdicts) and verified
        print(f"\ndemo {'ok' if ok else 'FAILED'} in {time.monotonic() - self.started:.1f} s")
        return 0 if ok else 1

    def turn(self, proxy: ProxyServer, page_url: str, user: KeyPair) -> tuple[str, int]:
        """Open the pinned session and run turn 0's two steps through the proxy."""
        import openai

        from record.digest import Domain, canonical_json, digest
        from record.schema import ToolCall, ToolResult, TurnEnded, TurnStarted

        session = proxy.registry.open_session([user.recipient], {"demo": "turn"}, pins=PINS)
        pins = " ".join(f"{k}={v}" for k, v in PINS.items() if k != "strict_cache")
        print(f"Session {session.session_id}: pinned {pins}, strict cache")
        print("  seq 0  stream.opened   sealed to your key and the appliance key")
        print("  seq 1  pins.set        the proxy sets these on every call of the session")
        print("  the proxy samples the clock once per model call and injects it\n")
        stream = session.session_id

        # The proxy has no control plane yet, so the demo appends the harness's own events
        # through the proxy's Log: the store's one writer (never a second Log on the same
        # store). The control plane will take this over.
        log = proxy.log

        def harness_event(body: Strict) -> Appended:
            appended = log.append(stream, body)
            opened = proxy.registry.get(stream)
            if opened is not None:
                opened.noted(appended)  # so the next annotation hands out the newest checkpoint
            return appended

        question = QUESTION.encode()
        started = harness_event(
            TurnStarted(turn=0, input_bytes=question, input_digest=digest(Domain.INPUT, question))
        )
        print(f"Turn 0: {QUESTION!r}")
        print(f"  seq {started.seq}  turn.started    appended by the demo through the proxy's Log")

        client = openai.OpenAI(
            base_url=session.openai_base_url, api_key=session.token, max_retries=0, timeout=120
        )
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
        print("  step 0: chat completion via the proxy, tools [web_fetch], tool_choice required")
        first = _complete(client, messages, tool_choice="required")
        if not first.tool_calls or first.finish_reason != "tool_calls":
            raise DemoFailed(f"step 0 ended {first.finish_reason!r} without a tool call")
        _print_step(first)
        reply_seq = first.annotation["seq"]
        results: list[ChatCompletionMessageParam] = []
        for call_id, name, raw_args in first.tool_calls:
            print(f"         → {call_id} {name}({raw_args})")
            print("           (the tiny model's URL is nonsense, but it matches the schema)")
            arguments = json.loads(raw_args)
            args = canonical_json(arguments)
            call = harness_event(
                ToolCall(
                    reply_seq=reply_seq,
                    call_id=call_id,
                    server="demo",
                    tool=name,
                    arguments=args,
                    arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
                    idempotent=True,
                )
            )
            print(f"  seq {call.seq}  tool.call       {name}, reply_seq {reply_seq}")
            page = web_fetch(page_url, str(arguments.get("url", "")))
            result = harness_event(
                ToolResult(
                    call_seq=call.seq,
                    outcome="COMMITTED",
                    result_bytes=page,
                    result_digest=digest(Domain.TOOL_RESULT, page),
                )
            )
            print(f"  seq {result.seq}  tool.result     {len(page)} bytes from the page server")
            results.append({"role": "tool", "tool_call_id": call_id, "content": page.decode()})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in first.tool_calls
                ],
            }
        )
        messages += results
        print("  step 1: chat completion via the proxy, the tool result added, tool_choice none")
        second = _complete(client, messages, tool_choice="none")
        _print_step(second)
        print(f"         → {_preview(second.content)}")
        print("           (the tiny model's text is nonsense: 2 layers of seeded random weights)")

        answer = second.content.encode()
        ended = harness_event(
            TurnEnded(
                turn=0,
                outcome="ANSWERED",
                answer_bytes=answer,
                answer_digest=digest(Domain.RESPONSE, answer),
            )
        )
        if ended.checkpoint is None:
            raise DemoFailed("turn.ended produced no checkpoint")
        (self.workdir / "kept.checkpoint").write_bytes(ended.checkpoint)
        print(
            f"  seq {ended.seq}  turn.ended      ANSWERED; checkpoint signed at tree size "
            f"{ended.tree_size}, kept as kept.checkpoint"
        )
        return stream, ended.seq

    def verify(self, store_path: Path, stream: str, user: KeyPair, end_seq: int) -> bool:
        """Audit the store and the exported bundle with the user's key; print where things are."""
        from record.audit import verify_store
        from record.bundle import export_stream, verify_bundle

        w = self.workdir
        kept = (w / "kept.checkpoint").read_bytes()
        report = verify_store(store_path, key=user, kept=[kept])
        print("\nVerify")
        print(
            f"  store, with your key and the kept checkpoint: {'ok' if report.ok else 'FAILED'} "
            f"({report.entries} entries)"
        )
        bundle = w / "bundle"
        export_stream(store_path, stream, bundle)
        bundled = verify_bundle(bundle, key=user, kept=[kept])
        print(
            f"  exported bundle, with your key: {'ok' if bundled.ok else 'FAILED'} "
            f"({bundled.entries} entries)"
        )
        for problem in report.problems + bundled.problems:
            print(f"    {problem.code} {problem.stream}/{problem.seq}: {problem.detail}")
        print("\nWhere things are")
        print(f"  store   {store_path}  (stream {stream})")
        print(f"  bundle  {bundle}")
        print(f"  keys    {w / 'user.key'} (yours: opens the record)")
        print(f"          {w / 'appliance.key'} (the appliance's)")
        print(f"          {store_path}.signing-key (signs checkpoints)")
        print(f"  kept    {w / 'kept.checkpoint'} (your copy of the checkpoint at seq {end_seq})")
        return report.ok and bundled.ok


@dataclass
class _Completion:
    """What the demo needs from one streamed reply, as the SDK delivered it."""

    content: str
    tool_calls: list[tuple[str, str, str]]  # (id, name, arguments JSON)
    finish_reason: str | None
    annotation: dict[str, Any]


def _complete(
    client: OpenAI,
    messages: list[ChatCompletionMessageParam],
    *,
    tool_choice: Literal["none", "required"],
) -> _Completion:
    """One streamed, pinned chat completion; the pins also travel in the request itself."""
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEB_FETCH],
        tool_choice=tool_choice,
        seed=PINS["seed"],
        temperature=PINS["temperature"],
        top_p=PINS["top_p"],
        max_tokens=PINS["max_tokens"],
        stream=True,
        extra_body={"strict_cache": True},
    )
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    finish: str | None = None
    annotation: dict[str, Any] | None = None
    for chunk in chunks:
        extra = chunk.model_extra or {}
        if isinstance(extra.get("affidavit"), dict):
            annotation = extra["affidavit"]
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            if choice.delta.content:
                content.append(choice.delta.content)
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, ["", "", ""])
                call[0] += delta.id or ""
                if delta.function is not None:
                    call[1] += delta.function.name or ""
                    call[2] += delta.function.arguments or ""
    if annotation is None or annotation.get("outcome") != "COMMITTED":
        raise DemoFailed("the proxy sent no commit annotation")
    return _Completion(
        "".join(content), [(c[0], c[1], c[2]) for _, c in sorted(calls.items())], finish, annotation
    )


def _print_step(done: _Completion) -> None:
    a = done.annotation
    print(f"  seq {a['request_seq']}  model.request   durable before the engine was dialed")
    print(
        f"  seq {a['seq']}  model.response  {a['outcome']} ({done.finish_reason}), "
        f"annotated after the commit: tree size {a['tree_size']}"
    )


def _preview(text: str, width: int = 64) -> str:
    """A one-line, printable glimpse of model text (the tiny model emits control bytes)."""
    shown = "".join(c if c.isprintable() and c != "\ufffd" else "·" for c in " ".join(text.split()))
    cut = shown[:width] + ("…" if len(shown) > width else "")
    return f'"{cut}" ({len(text)} characters)'


def web_fetch(page_url: str, url: str) -> bytes:
    """The demo's ``web_fetch`` tool: every URL is answered by the loopback page server."""
    import httpx

    reply = httpx.get(page_url + "/", params={"url": url}, timeout=10)
    reply.raise_for_status()
    return reply.content


async def _page_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A raw ASGI app standing in for the web: one fixed page for every GET."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    headers = [(b"content-type", b"text/html; charset=utf-8")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": PAGE})


@contextmanager
def serve_engine(model_dir: Path) -> Iterator[tuple[Engine, str]]:
    """The embedded engine on ``model_dir``, served on 127.0.0.1 (a free port) in a thread."""
    from inference.server import Engine, create_app

    engine = Engine(model_dir, model_name=MODEL).start()
    try:
        with _serve(create_app(engine)) as url:
            yield engine, url
    finally:
        engine.close()


@contextmanager
def _serve(app: Any, timeout_s: float = 30.0) -> Iterator[str]:
    """Any ASGI app under uvicorn on 127.0.0.1, a free port, in a thread; stopped on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + timeout_s
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise DemoFailed("a loopback server did not start")
                time.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join(timeout_s)
    finally:
        sock.close()
