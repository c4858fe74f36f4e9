"""Sessions survive a SIGKILL of the appliance: ``affidavit up`` killed at random phases of a
turn, started again, and ``affidavit resume`` finishing the turn.

The parts are real and separate: ``affidavit up`` runs as its own process (the egress proxy
and its control plane) in front of a loopback provider that speaks OpenAI Chat Completions
(streamed, random upstream tool-call ids, so a pinned session's derived ids must be taken
back after the restart) and a loopback remote MCP server whose ``append_note`` is not
idempotent and counts every call it receives. The harness runs the turn in this process
through the official ``openai`` SDK; ``affidavit resume`` is the real CLI.

Each iteration opens a pinned session, starts a turn (``append_note`` twice, then an
answer) and SIGKILLs the appliance at one aim drawn at random: at a harness phase line
(before a request leaves, after a reply is committed, around a tool call), when the
provider has the request (the ``model.request`` is durable) or is mid-stream, inside the
tool server before its side effect (the call is then dropped, as by a server that died) or
after it, or the moment an entry shows up in the store. The kill
*landed* where the record stops: the proxy is dead, so the record read right after the kill
is exactly what was durable. Then ``affidavit up`` again, and:

- it binds the same port: ``appliance.json``'s ``proxy_url`` is unchanged;
- ``affidavit resume`` finishes the turn with the session's old ``base_url`` and token; where
  a non-idempotent call's outcome is unknown it stops for a person, and the test decides as
  one would, from the tool's counter (``skip`` if the note was made, else ``retry``);
- no committed model step was asked again (each step committed once, no request after its
  commit, each committed request's content key once) and the tool counted each note at most
  once;
- the official SDK, with the same ``base_url`` and token, still gets a committed reply.

The landings are printed as a histogram; every landing place must have been hit (the last
iterations aim at any place not hit yet). It runs 50 iterations in ``make test-long`` only
(each restart costs a few seconds of two shared cores; ``make test`` keeps the proxy-level
restore of ``tests/egress_proxy/test_session_restore.py``).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the harness speaks to the proxy through openai")
pytest.importorskip("mcp", reason="the tool server is the mcp SDK's (the `dev` extra)")

from harness.agent import TurnPolicy  # noqa: E402
from harness.session import open_session, pending_calls, read_bodies, run_turn  # noqa: E402
from harness.state import Home  # noqa: E402
from harness.up import _serve  # noqa: E402
from record.schema import (  # noqa: E402
    ModelRequest,
    ModelResponse,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    body_kind,
    parse_head,
)
from record.seal import KeyPair  # noqa: E402
from record.sqlite_store import SQLiteStore  # noqa: E402
from tests.egress_proxy.loopback import request_body  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEED = 20261201
MODEL = "loopback-model"
TOOL = "counter__append_note"
PINS = {"seed": 7, "temperature": 0.5}
POLICY = TurnPolicy(4, ({"type": "function", "function": {"name": TOOL}},) * 2 + ("none",))
#: Where a kill is aimed: ``phase …`` a harness phase line (the kill runs inside it),
#: ``provider request|stream k`` the provider holding step k's request / mid-way through its
#: reply, ``tool before|after k`` the tool server holding call k before its side effect (it
#: then drops the call, as a server that died would) or after it, ``record KIND #n`` the
#: moment the n-th entry of that kind is in the store.
TARGETS = [
    "phase turn_started turn=0",
    *[f"phase model_call step={k}" for k in range(3)],
    *[f"provider request {k}" for k in range(3)],
    *[f"provider stream {k}" for k in range(3)],
    *[f"record model.response #{n}" for n in (1, 2, 3)],
    *[f"phase model_committed step={k}" for k in range(3)],
    *[f"phase tool_call step={k} call=0" for k in range(2)],
    *[f"record tool.call #{n}" for n in (1, 2)],
    *[f"tool {when} {k}" for when in ("before", "after") for k in range(2)],
    *[f"phase tool_done step={k} call=0" for k in range(2)],
]
#: Where kills must land (the last entry durable before the kill).
REQUIRED = {
    "turn.started",
    "model.request (reply pending)",
    "model.response",
    "tool.call (result pending)",
    "tool.result",
}
AIMS = {
    "turn.started": ["phase turn_started turn=0", "phase model_call step=0"],
    "model.request (reply pending)": ["provider request 1", "provider stream 0"],
    "model.response": ["phase model_committed step=0", "phase model_committed step=1"],
    "tool.call (result pending)": ["tool before 0", "tool after 1"],
    "tool.result": ["phase tool_done step=0 call=0", "phase tool_done step=1 call=0"],
}
SPARE = 5  # the last iterations aim at landing places not hit yet


# -- the loopback provider and tool server ------------------------------------------------------


@dataclass
class Provider:
    """OpenAI Chat Completions, streamed: a forced tool choice gets that tool called with a
    note named after the turn's input and step; ``none`` gets an answer. Tool-call ids are
    random, as many providers make them; an id it never issued coming back is a problem."""

    hook: Callable[[str, int], None] | None = None  # ("request" | "stream", step)
    issued: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    requests: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await request_body(receive)
        self.requests += 1
        request = json.loads(body)
        messages = request.get("messages", [])
        step = sum(1 for m in messages if m.get("role") == "assistant")
        for m in messages:
            for call in m.get("tool_calls") or []:
                if call.get("id") not in self.issued:
                    self.problems.append(f"tool-call id {call.get('id')!r} was never issued here")
        self._fire("request", step)
        user = next((m for m in messages if m.get("role") == "user"), {})
        text = str(user.get("content", ""))
        choice = request.get("tool_choice")
        events = self._events(text, step, choice if isinstance(choice, dict) else None)
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for index, event in enumerate(events):
            if index == 2:
                self._fire("stream", step)
            chunk = b"data: " + event + b"\n\n"
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    def _fire(self, where: str, step: int) -> None:
        if self.hook is not None:
            self.hook(where, step)

    def _events(self, text: str, step: int, forced: dict[str, Any] | None) -> list[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return json.dumps(
                {
                    "id": "chatcmpl-loopback",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": MODEL,
                    "choices": [choice],
                }
            ).encode()

        if forced is None:
            words = ["All ", "notes ", "are ", "made."]
            return (
                [chunk({"role": "assistant", "content": ""})]
                + [chunk({"content": w}) for w in words]
                + [chunk({}, "stop")]
            )
        call_id = "call_" + secrets.token_hex(6)
        self.issued.add(call_id)
        note = json.dumps({"text": f"{text.split()[-1]}-s{step}"})
        name = forced["function"]["name"]
        opening = {"index": 0, "id": call_id, "type": "function"}
        return [
            chunk({"role": "assistant", "content": None}),
            chunk({"tool_calls": [{**opening, "function": {"name": name, "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": note[:9]}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": note[9:]}}]}),
            chunk({}, "tool_calls"),
        ]


@dataclass
class Counting:
    """A remote MCP server with one tool that is not idempotent: ``append_note {text}``
    counts each call it acts on, by its text, then answers."""

    notes: Counter[str] = field(default_factory=Counter)
    #: ("before" | "after" the side effect, the note); "before" returning True drops the call
    hook: Callable[[str, str], bool] | None = None

    def app(self) -> Any:
        import mcp_types as types
        from mcp.server.lowlevel.server import Server

        schema = {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        }

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            tool = types.Tool(name="append_note", description="Make a note.", input_schema=schema)
            return types.ListToolsResult(tools=[tool])

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            text = str((params.arguments or {}).get("text", ""))
            if self.hook is not None and self.hook("before", text):  # its caller is gone
                gone = types.TextContent(type="text", text="dropped")
                return types.CallToolResult(content=[gone], is_error=True)
            self.notes[text] += 1
            if self.hook is not None:
                self.hook("after", text)
            answer = f"noted {text}"
            return types.CallToolResult(content=[types.TextContent(type="text", text=answer)])

        server = Server("counter", on_list_tools=list_tools, on_call_tool=call_tool)
        return server.streamable_http_app(json_response=True, host="127.0.0.1")


# -- the appliance, as a process ----------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("AFFIDAVIT_TRACE_PHASES", None)
    return env


def affidavit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Appliance:
    """``affidavit up`` in front of the loopback provider and tool server; ``kill`` is a
    SIGKILL, ``start`` waits for its "is up" line."""

    def __init__(self, home: Home, provider_url: str, mcp_config: Path) -> None:
        self.home = home
        self.argv = [
            sys.executable,
            "-m",
            "affidavit",
            "up",
            "--home",
            str(home.root),
            "--provider-url",
            provider_url,
            "--model-name",
            MODEL,
            "--mcp-config",
            str(mcp_config),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home.root.parent / "up-0.log"  # this run's console
        self.starts = 0
        self._lock = threading.Lock()

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        out = self.log = self.home.root.parent / f"up-{self.starts}.log"
        with out.open("wb") as sink:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, env=_env(), stdout=sink, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while b"affidavit is up" not in out.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"affidavit up did not start:\n{out.read_text()}")
            time.sleep(0.02)

    def kill(self) -> bool:
        """SIGKILL it (once); True when this call killed it."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return False
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return True

    def running(self) -> bool:
        """Whether it is alive, once any kill in flight has finished. Under the lock: while
        another thread's ``kill`` waits for the process, ``Popen.poll`` answers None (it
        will not call ``waitpid`` beside a ``wait``), which read as "alive" a process that
        was already killed (a flake seen about once in 400 iterations)."""
        with self._lock:
            return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(30)


@dataclass
class Rig:
    home: Home
    appliance: Appliance
    provider: Provider
    tools: Counting


@contextmanager
def restart_rig(tmp: Path) -> Iterator[Rig]:
    provider, tools = Provider(), Counting()
    with _serve(provider) as provider_url, _serve(tools.app()) as tools_url:
        config = tmp / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"counter": {"url": tools_url + "/mcp"}}}))
        home = Home(tmp / "home")
        appliance = Appliance(home, provider_url, config)
        appliance.start()
        try:
            yield Rig(home, appliance, provider, tools)
        finally:
            appliance.stop()


# -- reading the record ---------------------------------------------------------------------------


def bodies_of(home: Home, session: str) -> list[tuple[int, Strict]]:
    return read_bodies(home.root / "record.db", session, KeyPair.read(home.user_key_file))


def landing(bodies: Sequence[tuple[int, Strict]]) -> str:
    """Where a kill landed: the stream's last durable entry (a request: still unanswered)."""
    last = bodies[-1][1]
    if isinstance(last, ModelRequest):
        return "model.request (reply pending)"
    if isinstance(last, ToolCall):
        return "tool.call (result pending)"
    where = body_kind(last)
    if pending_calls(bodies):
        where += " (an earlier request pending)"
    return where


def step_problems(bodies: Sequence[tuple[int, Strict]]) -> list[str]:
    """No committed model step was asked again, and no committed request twice."""
    replies = {b.request_seq: b for _, b in bodies if isinstance(b, ModelResponse)}
    asked: dict[tuple[int | None, int | None], list[tuple[int, str, str]]] = {}
    for seq, body in bodies:
        if isinstance(body, ModelRequest):
            reply = replies.get(seq)
            outcome = reply.outcome if reply is not None else "none"
            asked.setdefault((body.turn, body.step), []).append((seq, outcome, body.content_key))
    problems = []
    committed_keys: Counter[str] = Counter()
    for (turn, step), requests in sorted(asked.items(), key=str):
        committed = [seq for seq, outcome, _ in requests if outcome == "COMMITTED"]
        committed_keys.update(key for _, outcome, key in requests if outcome == "COMMITTED")
        if len(committed) > 1:
            problems.append(f"turn {turn} step {step} was committed {len(committed)} times")
        if committed and any(seq > committed[0] for seq, _, _ in requests):
            problems.append(f"turn {turn} step {step} was asked again after its commit")
    problems += [f"request {k} committed {n} times" for k, n in committed_keys.items() if n > 1]
    return problems


def tool_problems(bodies: Sequence[tuple[int, Strict]], notes: Counter[str]) -> list[str]:
    """The non-idempotent tool: each note made at most once, each call committed at most once."""
    calls = {seq: b for seq, b in bodies if isinstance(b, ToolCall)}
    committed = Counter(
        calls[b.call_seq].call_id
        for _, b in bodies
        if isinstance(b, ToolResult) and b.outcome == "COMMITTED" and b.call_seq in calls
    )
    texts = {json.loads(b.arguments)["text"] for b in calls.values()}
    problems = [f"call {i} committed {n} times" for i, n in committed.items() if n > 1]
    problems += [f"note {t!r} was made {notes[t]} times" for t in texts if notes[t] > 1]
    return problems


# -- the kill test --------------------------------------------------------------------------------


@dataclass
class Iteration:
    index: int
    target: str
    delay_ms: float
    session: str = ""
    landed: str = "not killed"
    decided: str = ""
    resumed: dict[str, Any] = field(default_factory=dict)
    live: str = ""  # how the live turn returned: its outcome, or what it raised
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        served = self.resumed.get("resume") or {}
        counts = (
            f"record/live {served.get('model_steps_from_record')}/"
            f"{served.get('model_steps_live')} steps, {served.get('tool_results_from_record')}/"
            f"{served.get('tool_calls_live')} tools"
            if served
            else "nothing resumed"
        )
        decided = f", decided {self.decided}" if self.decided else ""
        return (
            f"#{self.index:02d} aim {self.target} +{self.delay_ms:.0f}ms -> {self.landed} "
            f"({counts}{decided})"
            + (f" PROBLEMS: {'; '.join(self.problems)}" if self.problems else "")
        )


def kill_during_turn(rig: Rig, run: Iteration, text: str) -> None:
    """Run the turn in a thread and SIGKILL the appliance at ``run.target``."""
    aim, _, what = run.target.partition(" ")
    delay = run.delay_ms / 1000

    def kill() -> None:
        time.sleep(delay)
        rig.appliance.kill()

    def on_phase(line: str) -> None:
        if aim == "phase" and line == what:
            kill()

    if aim == "provider":
        where, step = what.split()

        def provider_hook(at: str, k: int) -> None:
            if at == where and k == int(step) and rig.provider.hook is not None:
                rig.provider.hook = None
                kill()

        rig.provider.hook = provider_hook
    elif aim == "tool":
        when, step = what.split()
        note = f"{text.split()[-1]}-s{step}"

        def tool_hook(at: str, made: str) -> bool:
            if at == when and made == note and rig.tools.hook is not None:
                rig.tools.hook = None
                kill()
                return True
            return False

        rig.tools.hook = tool_hook

    def turn() -> None:
        try:
            result = run_turn(rig.home, run.session, text, on_phase=on_phase)
            run.live = f"{result.outcome} {result.detail or ''} {result.pending or ''}".strip()
        except BaseException as exc:  # the appliance died under it: expected
            run.live = f"raised {type(exc).__name__}: {str(exc)[:300]}"

    thread = threading.Thread(target=turn, daemon=True)
    thread.start()
    if aim == "record":
        kind, _, nth = what.partition(" #")
        store = SQLiteStore(rig.home.root / "record.db", readonly=True)
        try:
            start, count = 0, 0
            while thread.is_alive() and count < int(nth):
                for stored in store.entries(run.session, start):
                    start = stored.seq + 1
                    count += parse_head(stored.line).kind == kind
                if count < int(nth):
                    time.sleep(0.0002)
            if count >= int(nth):
                kill()
        finally:
            store.close()
    thread.join(120)
    rig.provider.hook, rig.tools.hook = None, None
    if thread.is_alive():
        run.problems.append("the live turn did not return after the kill")


def one_iteration(rig: Rig, run: Iteration, url: str) -> None:
    home = rig.home
    state = open_session(home, PINS, policy=POLICY)
    run.session = state.session_id
    text = f"Make the notes, run{run.index:02d}"
    kill_during_turn(rig, run, text)
    alive = rig.appliance.running()
    bodies = bodies_of(home, run.session)
    if alive:
        run.landed = "not killed"
        if run.live.startswith("NEEDS_DECISION"):
            # A tool call whose outcome the harness could not learn, with the appliance up
            # (seen once in a hundred kills, on an overloaded machine): the turn rightly
            # waits for a person; the kill, restart and resume below still hold every rule.
            run.landed = f"not killed (live turn: {run.live[:160]})"
        elif not isinstance(bodies[-1][1], TurnEnded):
            tail = rig.appliance.log.read_text(errors="replace")[-1500:]
            run.problems.append(f"the turn neither died nor ended: {run.live}; up: {tail}")
        rig.appliance.kill()  # a restart all the same
        run.landed += "; killed before the restart: " + landing(bodies_of(home, run.session))
    else:
        run.landed = landing(bodies)
    rig.appliance.start()
    now = home.appliance().proxy_url
    if now != url:
        run.problems.append(f"the proxy came back on {now}, not {url}")
    resumed = affidavit("resume", run.session, "--home", str(home.root), "--json")
    doc = json.loads(resumed.stdout) if resumed.stdout.strip().startswith("{") else {}
    if doc.get("outcome") == "NEEDS_DECISION":
        # The person's part: the tool's own counter says whether the note was made.
        waiting = dict(bodies_of(home, run.session))[int(doc["pending"]["call_seq"])]
        assert isinstance(waiting, ToolCall)
        made = rig.tools.notes[json.loads(waiting.arguments)["text"]] > 0
        run.decided = "skip" if made else "retry"
        resumed = affidavit(
            "resume", run.session, "--decide", run.decided, "--home", str(home.root), "--json"
        )
        doc = json.loads(resumed.stdout) if resumed.stdout.strip().startswith("{") else {}
    run.resumed = doc
    finished = isinstance(bodies[-1][1], TurnEnded)  # the turn ended before the kill
    if finished and resumed.returncode == 0 and doc.get("turn", 0) is None:
        pass  # nothing to resume, rightly
    elif resumed.returncode != 0 or doc.get("outcome") != "ANSWERED":
        run.problems.append(
            f"resume exited {resumed.returncode}: {resumed.stdout[-400:]} {resumed.stderr[-400:]}"
        )
    after = bodies_of(home, run.session)
    ended = [b for _, b in after if isinstance(b, TurnEnded)]
    if len(ended) != 1 or ended[0].outcome != "ANSWERED":
        run.problems.append(f"the turn ended {[e.outcome for e in ended]}")
    run.problems += step_problems(after)
    run.problems += tool_problems(after, rig.tools.notes)
    # The same base_url and token, from the official SDK: still a session, still committed.
    client = openai.OpenAI(base_url=state.base_url + "/v1", api_key=state.token, max_retries=0)
    try:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "still there?"}], stream=True
        )
        notes = [c.model_extra.get("affidavit") for c in reply if c.model_extra]
        if not any(isinstance(n, dict) and n.get("outcome") == "COMMITTED" for n in notes):
            run.problems.append("the SDK's call after the restart was not committed")
    except openai.APIError as exc:
        run.problems.append(f"the SDK's call after the restart failed: {exc}")
    finally:
        client.close()


def run_kills(tmp: Path, iterations: int) -> None:
    rng = random.Random(SEED + iterations)
    rounds = [rng.sample(TARGETS, len(TARGETS)) for _ in range(iterations // len(TARGETS) + 1)]
    plan = [t for r in rounds for t in r]
    runs: list[Iteration] = []
    landed: Counter[str] = Counter()
    with restart_rig(tmp) as rig:
        url = rig.home.appliance().proxy_url
        for index in range(iterations):
            target = plan[index]
            missing = sorted(REQUIRED - set(landed))
            if index >= iterations - SPARE and missing:  # aim at what was not hit yet
                target = rng.choice(AIMS[missing[index % len(missing)]])
            run = Iteration(index, target, rng.uniform(0, 20))
            runs.append(run)
            one_iteration(rig, run, url)
            landed[run.landed] += 1
        provider_problems = list(rig.provider.problems)
    print(f"\n{iterations} SIGKILLs of `affidavit up`, each followed by a restart and resume:")
    for run in runs:
        print("  " + run.line())
    print("where the kills landed (the last durable entry of the turn):")
    for place, count in landed.most_common():
        print(f"  {count:3d}  {place}")
    problems = [run.line() for run in runs if run.problems] + provider_problems
    assert not problems, "\n".join(problems)
    assert set(landed) >= REQUIRED, f"never landed at {sorted(REQUIRED - set(landed))}"
    assert sum(not run.landed.startswith("not killed") for run in runs) >= iterations - 2


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_sessions_survive_fifty_sigkills_of_affidavit_up(tmp_path: Path) -> None:
    run_kills(tmp_path, 50)
