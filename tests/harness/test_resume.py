"""Resume against the real appliance (engine, egress proxy, control plane, the ledger MCP
server whose ``append_note`` is not idempotent, a loopback web whose page changes on every
fetch), with the harness as the real CLI in a subprocess.

The kill test: fifty turns, each ``affidavit turn`` SIGKILLed at a point chosen from the
phases it prints (plus 0–30 ms) or from the entries the record shows, then ``affidavit
resume``. Where each kill *landed* is read from the record: the entries appended before the
kill, by their own timestamps (the proxy still finishes what the dead client left, so the
record grows after the kill). The landings are printed as a histogram, and every landing
place that matters must have been hit. After each resume: the turn completed, no
committed model step was sent again, and every ``append_note`` call reached the ledger once.

Then the calls whose outcome is unknown (``hang_once`` kills its server mid-call, so the proxy
records ``UNKNOWN``): a live turn stops ``needs_decision``; ``resume --decide skip`` records
the decision and finishes without calling again, ``--decide retry`` re-sends it once (to the
server the proxy respawned), ``--decide abort`` stops the turn; and where the tool is
idempotent the harness re-sends it by itself, live and on resume.

Last, a step whose first reply FAILED (planted at the engine) and whose second, sent by a
first resume, committed: a second resume serves it from the record, it does not send it again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the harness tests run the embedded engine (`engine` extra)")
pytest.importorskip("openai", reason="the harness drives turns with the openai client")

from affidavit.cli import main
from harness.agent import TurnPolicy
from harness.session import open_session, pending_calls, read_bodies
from harness.state import Home
from harness.up import TINY_MODEL, running_appliance
from record.schema import (
    FetchRequest,
    ModelRequest,
    ModelResponse,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
    TurnEnded,
    TurnStarted,
    body_kind,
    parse_head,
)
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.harness.rig import CLOCK, LEDGER_SERVER, PINS, HarnessRig, harness_rig, named

REPO = Path(__file__).resolve().parents[2]
KILL_POLICY = TurnPolicy(
    5,
    (named("ledger__append_note"), named("web_search"), named("ledger__append_note"), "none"),
)
HANG_POLICY = TurnPolicy(3, (named("ledger__hang_once"), "none"))
ITERATIONS = 50
SEED = 20260807
#: Where a kill is aimed. ``phase …``: 0–30 ms after the turn prints that phase line.
#: ``record …``: the moment that entry shows up in the store (the n-th of its kind): a tool
#: call's result follows its call within ~2 ms, and the next model request follows a result
#: within ~5 ms, windows too short to hit reliably from a phase line.
PHASES = [
    "turn_started turn=0",
    *[
        line
        for step in range(3)
        for line in (
            f"model_call step={step}",
            f"model_committed step={step}",
            f"tool_call step={step} call=0",
            f"tool_done step={step} call=0",
        )
    ],
    "model_call step=3",
]
WATCHED = [
    "tool.call #1",
    "tool.result #1",
    "fetch.request #1",
    "fetch.response #1",
    "tool.call #2",
    "tool.result #2",
]
TARGETS = [f"phase {p}" for p in PHASES] + [f"record {w}" for w in WATCHED]
#: Where kills must have landed (the turn's last entry appended before the kill).
REQUIRED = {
    "turn.started",
    "model.request (reply pending)",
    "model.response",
    "tool.call (result pending)",
    "tool.result",
    "fetch.request (answer pending)",
    "fetch.response",
}
#: Targets likely to land in each place, for the last iterations if one was not hit yet.
AIMS = {
    "turn.started": ["phase turn_started turn=0"],
    "model.request (reply pending)": [f"phase model_call step={s}" for s in (1, 2, 3)],
    "model.response": [f"phase model_committed step={s}" for s in range(3)],
    "tool.call (result pending)": ["record tool.call #1", "record tool.call #2"],
    "tool.result": ["record tool.result #1", "record tool.result #2"],
    "fetch.request (answer pending)": ["record fetch.request #1"],
    "fetch.response": ["record fetch.response #1"],
}
SPARE = 8  # the last iterations aim at landing places not hit yet


def _env(trace: bool = False) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("AFFIDAVIT_TRACE_PHASES", None)
    if trace:  # the phase lines go to stderr
        env["AFFIDAVIT_TRACE_PHASES"] = "1"
    return env


def argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "affidavit", *args]


def affidavit(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(*args),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def show(home: Home, session: str) -> dict[str, Any]:
    """``affidavit session show SESSION --json``, run in this process (it only reads)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["session", "show", session, "--home", str(home.root), "--json"])
    assert code == 0, out.getvalue()
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def bodies_of(home: Home, session: str) -> list[tuple[int, Strict]]:
    return read_bodies(home.appliance().store, session, KeyPair.read(home.user_key_file))


def appended_at(home: Home, session: str) -> dict[int, datetime]:
    """When each entry of the stream was appended (its envelope's ``occurred_at``)."""
    store = SQLiteStore(home.appliance().store, readonly=True)
    try:
        heads = [parse_head(stored.line) for stored in store.entries(session)]
    finally:
        store.close()
    return {h.seq: datetime.fromisoformat(h.occurred_at) for h in heads}


def landing(bodies: Sequence[tuple[int, Strict]]) -> str:
    """Where a kill landed: the last entry appended before it (a request: still unanswered)."""
    last = bodies[-1][1]
    if isinstance(last, ModelRequest):
        return "model.request (reply pending)"
    if isinstance(last, ToolCall):
        return "tool.call (result pending)"
    if isinstance(last, FetchRequest):
        return "fetch.request (answer pending)"
    where = body_kind(last)
    if pending_calls(bodies):  # an earlier request unanswered: not expected, but say so
        where += " (an earlier request pending)"
    return where


def model_step_problems(bodies: Sequence[tuple[int, Strict]], *, once: bool = True) -> list[str]:
    """A step whose reply was committed must never be asked again (and with ``once``, where
    no reply failed, no step is asked twice at all: the proxy finishes a call whose client
    died, so resume finds it committed)."""
    replies = {b.request_seq: b for _, b in bodies if isinstance(b, ModelResponse)}
    asked: dict[tuple[int | None, int | None], list[tuple[int, str]]] = {}
    for seq, body in bodies:
        if isinstance(body, ModelRequest):
            reply = replies.get(seq)
            outcome = reply.outcome if reply is not None else "none"
            asked.setdefault((body.turn, body.step), []).append((seq, outcome))
    problems = []
    for (turn, step), requests in sorted(asked.items(), key=str):
        if turn is None or step is None:
            problems.append(f"model.request at seq {requests[0][0]} has no turn/step")
            continue
        committed = [seq for seq, outcome in requests if outcome == "COMMITTED"]
        if len(committed) > 1:
            problems.append(f"turn {turn} step {step} was committed {len(committed)} times")
        if committed and any(seq > committed[0] for seq, _ in requests):
            problems.append(f"turn {turn} step {step} was asked again after its commit")
        if once and len(requests) > 1:
            problems.append(f"turn {turn} step {step} was asked {len(requests)} times")
    return problems


def tool_problems(bodies: Sequence[tuple[int, Strict]], tool: str, lines_added: int) -> list[str]:
    """The non-idempotent tool: sent once per call id, its side effect once per call id."""
    calls = [(seq, b) for seq, b in bodies if isinstance(b, ToolCall) and b.tool == tool]
    results = {b.call_seq: b for _, b in bodies if isinstance(b, ToolResult)}
    per_id = Counter(b.call_id for _, b in calls)
    committed = Counter(
        b.call_id for seq, b in calls if seq in results and results[seq].outcome == "COMMITTED"
    )
    problems = [f"{tool} call {i} was sent {n} times" for i, n in per_id.items() if n > 1]
    problems += [f"{tool} call {i} committed {n} times" for i, n in committed.items() if n > 1]
    if lines_added > len(per_id):
        problems.append(f"the ledger got {lines_added} lines for {len(per_id)} call ids")
    if lines_added != len(committed):
        problems.append(f"the ledger got {lines_added} lines for {len(committed)} committed calls")
    return problems


# -- the kill test --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarnessRig]:
    with harness_rig(tmp_path_factory.mktemp("resume")) as rig:
        yield rig


def ledger_lines(rig: HarnessRig) -> int:
    return len(rig.ledger.read_text().splitlines()) if rig.ledger.exists() else 0


@dataclass
class Iteration:
    index: int
    target: str
    delay_ms: float
    session: str = ""
    landed: str = ""
    seen: str = ""  # the last phase line the turn printed
    resume: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        served = self.resume.get("resume") or {}
        counts = (
            f"{served.get('model_steps_from_record')}/{served.get('model_steps_live')} steps, "
            f"{served.get('tool_results_from_record')}/{served.get('tool_calls_live')} tools"
            if served
            else "nothing resumed"
        )
        delay = f" +{self.delay_ms:.0f}ms" if self.target.startswith("phase") else ""
        return (
            f"#{self.index:02d} aim {self.target}{delay} -> {self.landed} "
            f"(last phase {self.seen!r}; record/live {counts})"
            + (f" PROBLEMS: {'; '.join(self.problems)}" if self.problems else "")
        )


@dataclass
class Killed:
    at: datetime | None  # None: the turn ended before the kill
    seen: str  # the last phase line it printed
    stderr: str


def run_and_kill(
    home: Home, session: str, target: str, delay: float, message: str = "Note, search, note."
) -> Killed:
    """Run a turn as the CLI and SIGKILL it at ``target``."""
    aim, _, what = target.partition(" ")
    with subprocess.Popen(
        argv("turn", session, message, "--home", str(home.root)),
        cwd=REPO,
        env=_env(trace=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        at: datetime | None = None
        seen = ""

        def kill() -> None:
            nonlocal at
            if proc.poll() is None:
                at = datetime.now(UTC)
                proc.send_signal(signal.SIGKILL)

        if aim == "phase":
            for raw in iter(proc.stderr.readline, ""):
                seen = raw.strip()[len("phase ") :] if raw.startswith("phase ") else seen
                if seen == what:
                    time.sleep(delay)
                    kill()
                    break
        else:  # watch the store for the n-th entry of a kind
            kind, _, nth = what.partition(" #")
            store = SQLiteStore(home.appliance().store, readonly=True)
            try:
                start, count = 0, 0
                while proc.poll() is None and count < int(nth):
                    for stored in store.entries(session, start):
                        start = stored.seq + 1
                        count += parse_head(stored.line).kind == kind
                    if count < int(nth):
                        time.sleep(0.0002)
                kill()
            finally:
                store.close()
        proc.wait(timeout=120)
        proc.stdout.read()
        err = proc.stderr.read()
        for line in err.splitlines():
            seen = line[len("phase ") :] if line.startswith("phase ") else seen
    return Killed(at if proc.returncode == -signal.SIGKILL else None, seen, err)


@pytest.mark.long  # fifty CLI turns and resumes, five minutes on 2 cores: `make test-long`
@pytest.mark.timeout(900)
def test_a_turn_killed_at_any_point_resumes_without_repeating_anything(rig: HarnessRig) -> None:
    rng = random.Random(SEED)
    home = rig.home
    rounds = [rng.sample(TARGETS, len(TARGETS)) for _ in range(ITERATIONS // len(TARGETS) + 1)]
    plan = [t for r in rounds for t in r]
    runs: list[Iteration] = []
    landed: Counter[str] = Counter()
    started = time.monotonic()
    for index in range(ITERATIONS):
        target = plan[index]
        missing = sorted(REQUIRED - set(landed))
        if index >= ITERATIONS - SPARE and missing:  # aim at what was not hit yet
            target = rng.choice(AIMS[missing[index % len(missing)]])
        run = Iteration(index, target, rng.uniform(0, 30))
        runs.append(run)
        before = ledger_lines(rig)
        state = open_session(home, PINS, policy=KILL_POLICY)
        sid = run.session = state.session_id
        killed = run_and_kill(home, sid, target, run.delay_ms / 1000)
        run.seen = killed.seen
        # The record as resume finds it (the proxy may still be finishing a call).
        snapshot = bodies_of(home, sid)
        if killed.at is None and not isinstance(snapshot[-1][1], TurnEnded):
            run.problems.append(f"the turn neither died nor ended: {killed.stderr[-600:]}")
        resumed = affidavit("resume", sid, "--home", str(home.root), "--json")
        if resumed.returncode != 0:
            run.problems.append(
                f"resume exited {resumed.returncode}: {resumed.stdout[-600:]} "
                f"{resumed.stderr[-600:]}"
            )
        else:
            run.resume = json.loads(resumed.stdout)
        doc = show(home, sid)
        outcome = doc["turns"][-1]["outcome"] if doc["turns"] else "no turn"
        if outcome not in ("ANSWERED", "STEP_LIMIT") or doc["status"] != "idle":
            run.problems.append(f"after resume: turn {outcome}, session {doc['status']}")
        after = bodies_of(home, sid)
        if after[: len(snapshot)] != snapshot:
            run.problems.append("the record before resume was not kept as it was")
        if killed.at is None:
            run.landed = "completed"
        else:  # the entries appended before the kill, by their own timestamps
            times = appended_at(home, sid)
            run.landed = landing([(s, b) for s, b in after if times[s] < killed.at])
        landed[run.landed] += 1
        run.problems += model_step_problems(after)
        run.problems += tool_problems(after, "append_note", ledger_lines(rig) - before)
        if sum(isinstance(b, TurnStarted) for _, b in after) != 1:
            run.problems.append("not exactly one turn.started")
    elapsed = time.monotonic() - started
    histogram = "\n".join(f"  {n:3d}  {where}" for where, n in landed.most_common())
    report = (
        f"{ITERATIONS} kills in {elapsed:.0f} s; where they landed:\n{histogram}\n"
        + "\n".join(r.line() for r in runs)
    )
    print(report)
    failed = [r.line() for r in runs if r.problems]
    assert not failed, "\n".join(failed) + "\n\n" + report
    assert set(landed) >= REQUIRED, f"not hit: {sorted(REQUIRED - set(landed))}\n\n{report}"


# -- unknown outcomes -----------------------------------------------------------------------


def hang_calls(bodies: Sequence[tuple[int, Strict]]) -> list[tuple[int, ToolCall, str, str]]:
    """Every ``hang_once`` call: seq, call, its result's outcome and text."""
    results = {b.call_seq: b for _, b in bodies if isinstance(b, ToolResult)}
    out: list[tuple[int, ToolCall, str, str]] = []
    for seq, body in bodies:
        if isinstance(body, ToolCall) and body.tool == "hang_once":
            result = results.get(seq)
            text = (result.result_bytes or b"").decode() if result is not None else ""
            out.append((seq, body, result.outcome if result is not None else "none", text))
    return out


def forced_turn(home: Home, message: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    """A live turn whose first step is told to call ``hang_once``. The tool takes an open
    object, so the tiny model's constrained arguments sometimes run past ``max_tokens``
    and the reply has no call (the turn then just answers): a fresh session is tried then,
    with the message changed (the prompt is otherwise the same until the clock ticks)."""
    tries = []
    for attempt in range(8):
        sid = open_session(home, PINS, policy=HANG_POLICY).session_id
        text = f"{message} (try {attempt})"
        done = affidavit("turn", sid, text, "--home", str(home.root), "--json")
        summary = json.loads(done.stdout) if done.stdout.startswith("{") else {}
        if summary.get("steps") and summary["steps"][0]["tool_calls"]:
            return sid, done
        tries.append((done.returncode, done.stdout[-300:], done.stderr[-300:]))
    pytest.fail(f"no reply called hang_once in 8 sessions: {tries}")


def hung_turn(rig: Any) -> tuple[str, int, ToolCall]:
    """A turn whose ``hang_once`` call kills the ledger server: it waits for a decision."""
    marker = rig.ledger.with_suffix(".hung")
    marker.unlink(missing_ok=True)
    sid, done = forced_turn(rig.home, "Do the thing once.")
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "NEEDS_DECISION", done.stdout
    assert marker.exists()
    doc = show(rig.home, sid)
    assert doc["status"] == "needs_decision", doc
    assert doc["turns"][-1]["outcome"] == "open"
    calls = hang_calls(bodies_of(rig.home, sid))
    assert [(c.idempotent, outcome) for _, c, outcome, _ in calls] == [(False, "UNKNOWN")]
    seq, call, _, _ = calls[0]
    assert doc["pending"]["call_id"] == call.call_id
    return sid, seq, call


def decided(bodies: Sequence[tuple[int, Strict]]) -> list[tuple[int, str]]:
    return [(b.call_seq, b.decision) for _, b in bodies if isinstance(b, TurnDecided)]


def test_an_unknown_outcome_waits_and_skip_finishes_without_calling_again(
    rig: HarnessRig,
) -> None:
    sid, seq, _ = hung_turn(rig)
    # Without a decision resume does not guess: it still waits.
    again = affidavit("resume", sid, "--home", str(rig.home.root), "--json")
    assert again.returncode == 1, again.stdout + again.stderr
    assert json.loads(again.stdout)["outcome"] == "NEEDS_DECISION"
    assert show(rig.home, sid)["status"] == "needs_decision"
    done = affidavit("resume", sid, "--decide", "skip", "--home", str(rig.home.root), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["outcome"] in ("ANSWERED", "STEP_LIMIT"), summary
    assert summary["steps"][0]["tool_outcomes"] == ["FAILED"]  # skipped: not known to be done
    bodies = bodies_of(rig.home, sid)
    assert decided(bodies) == [(seq, "skip")]
    assert len(hang_calls(bodies)) == 1  # not called again
    assert model_step_problems(bodies) == []
    doc = show(rig.home, sid)
    assert doc["status"] == "idle" and doc["turns"][-1]["outcome"] == summary["outcome"]


def test_retry_resends_the_call_once_to_the_respawned_server(rig: HarnessRig) -> None:
    sid, seq, call = hung_turn(rig)
    done = affidavit("resume", sid, "--decide", "retry", "--home", str(rig.home.root), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["outcome"] in ("ANSWERED", "STEP_LIMIT"), summary
    assert summary["steps"][0]["tool_outcomes"] == ["COMMITTED"]
    bodies = bodies_of(rig.home, sid)
    assert decided(bodies) == [(seq, "retry")]
    calls = hang_calls(bodies)
    assert [(c.call_id, outcome) for _, c, outcome, _ in calls] == [
        (call.call_id, "UNKNOWN"),
        (call.call_id, "COMMITTED"),
    ]
    assert json.loads(calls[1][3])["content"][0]["text"] == "done"
    assert model_step_problems(bodies) == []
    assert show(rig.home, sid)["status"] == "idle"


def test_abort_stops_the_turn_without_calling_again(rig: HarnessRig) -> None:
    sid, seq, _ = hung_turn(rig)
    done = affidavit("resume", sid, "--decide", "abort", "--home", str(rig.home.root), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "STOPPED"
    bodies = bodies_of(rig.home, sid)
    assert decided(bodies) == [(seq, "abort")]
    assert len(hang_calls(bodies)) == 1
    doc = show(rig.home, sid)
    assert doc["status"] == "idle" and doc["turns"][-1]["outcome"] == "STOPPED"


@dataclass
class LedgerRig:
    home: Home
    ledger: Path


@pytest.fixture(scope="module")
def idempotent_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerRig]:
    """The appliance with ``hang_once`` configured idempotent (no web)."""
    tmp = tmp_path_factory.mktemp("idempotent")
    ledger = tmp / "ledger.txt"
    servers = {
        "ledger": {
            "transport": "stdio",
            "command": sys.executable,
            "args": [str(LEDGER_SERVER)],
            "env": {"LEDGER": str(ledger)},
            "idempotent_tools": ["count_notes", "hang_once"],
        }
    }
    home = Home(tmp / "home")
    with running_appliance(home, engine=TINY_MODEL, mcp_servers=servers, clock=CLOCK):
        yield LedgerRig(home, ledger)


def test_an_idempotent_call_with_unknown_outcome_is_resent_live(
    idempotent_rig: LedgerRig,
) -> None:
    rig = idempotent_rig
    rig.ledger.with_suffix(".hung").unlink(missing_ok=True)
    sid, done = forced_turn(rig.home, "Do it.")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["steps"][0]["tool_outcomes"] == ["COMMITTED"]
    calls = hang_calls(bodies_of(rig.home, sid))
    assert [(c.idempotent, outcome) for _, c, outcome, _ in calls] == [
        (True, "UNKNOWN"),
        (True, "COMMITTED"),
    ]
    assert calls[0][1].call_id == calls[1][1].call_id  # the same idempotency key


def test_resume_resends_an_idempotent_call_whose_outcome_is_unknown(
    idempotent_rig: LedgerRig,
) -> None:
    """The client dies the moment the server does (the marker is its last act): the proxy
    records ``UNKNOWN``, and resume re-sends the call by itself, no decision needed."""
    rig = idempotent_rig
    marker = rig.ledger.with_suffix(".hung")
    tries = []
    for attempt in range(8):  # a reply must call it, and the kill beat the harness's re-send
        marker.unlink(missing_ok=True)
        state = open_session(rig.home, PINS, policy=HANG_POLICY)
        sid = state.session_id
        with subprocess.Popen(
            argv("turn", sid, f"Do it. (try {attempt})", "--home", str(rig.home.root)),
            cwd=REPO,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as proc:
            deadline = time.monotonic() + 60
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.0002)
            proc.kill()
        calls = hang_calls(bodies_of(rig.home, sid))
        tries.append([(c.call_id, outcome) for _, c, outcome, _ in calls])
        if len(calls) == 1:
            print(f"hang_once calls recorded per try: {tries}")
            break
    else:
        pytest.fail(f"no try left one unanswered hang_once call: {tries}")
    done = affidavit("resume", sid, "--home", str(rig.home.root), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["outcome"] in ("ANSWERED", "STEP_LIMIT"), summary
    assert summary["resume"]["model_steps_from_record"] == 1
    bodies = bodies_of(rig.home, sid)
    calls = hang_calls(bodies)
    assert [(c.call_id, outcome) for _, c, outcome, _ in calls] == [
        (calls[0][1].call_id, "UNKNOWN"),
        (calls[0][1].call_id, "COMMITTED"),
    ]
    assert decided(bodies) == []
    assert model_step_problems(bodies) == []


# -- a step that failed once, then committed on resume --------------------------------------


def test_a_second_resume_serves_a_step_that_failed_once_and_then_committed(
    rig: HarnessRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 0 fails once at the engine (recorded ``FAILED``) and the client dies before it
    can end the turn; resume sends step 0 again (it was never committed), which commits and
    asks for ``hang_once``, whose outcome is unknown: the turn waits. ``resume --decide skip``
    must serve step 0 from its committed reply, not send it a third time (nor call a tool
    again under a new id)."""
    from inference.protocol import ApiError

    engine = rig.engine
    prepare = engine.prepare
    failing = {"left": 0}

    def flaky(body: bytes, headers: Any) -> Any:
        if failing["left"] > 0:
            failing["left"] -= 1
            raise ApiError("planted: the engine is busy", status=503, code="busy")
        return prepare(body, headers)

    monkeypatch.setattr(engine, "prepare", flaky)
    marker = rig.ledger.with_suffix(".hung")
    tries = []
    for attempt in range(8):
        marker.unlink(missing_ok=True)
        failing["left"] = 1
        sid = open_session(rig.home, PINS, policy=HANG_POLICY).session_id
        # The kill must land between the failed reply and turn.ended (a few ms) …
        killed = run_and_kill(rig.home, sid, "record model.response #1", 0, f"Try {attempt}.")
        kinds = [body_kind(b) for _, b in bodies_of(rig.home, sid)]
        if killed.at is None or "turn.ended" in kinds:
            tries.append(f"the kill came late: {kinds[2:]}")
            continue
        # … and step 0 sent again must ask for hang_once (the tiny model may run out of tokens).
        first = affidavit("resume", sid, "--home", str(rig.home.root), "--json")
        summary = json.loads(first.stdout) if first.stdout.startswith("{") else {}
        if summary.get("outcome") == "NEEDS_DECISION":
            break
        tries.append(f"resume: {summary.get('outcome')} {summary.get('detail')}")
    else:
        pytest.fail(f"no try set the scene: {tries}")
    assert summary["resume"]["model_steps_live"] == 1, summary
    assert [r.outcome for _, r in bodies_of(rig.home, sid) if isinstance(r, ModelResponse)] == [
        "FAILED",
        "COMMITTED",
    ]
    done = affidavit("resume", sid, "--decide", "skip", "--home", str(rig.home.root), "--json")
    bodies = bodies_of(rig.home, sid)
    replies = {r.request_seq: r.outcome for _, r in bodies if isinstance(r, ModelResponse)}
    asked = [(b.step, replies.get(s)) for s, b in bodies if isinstance(b, ModelRequest)]
    assert model_step_problems(bodies, once=False) == [], (asked, done.stdout, done.stderr)
    assert asked == [(0, "FAILED"), (0, "COMMITTED"), (1, "COMMITTED")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["resume"]["model_steps_from_record"] == 1
    assert len(hang_calls(bodies)) == 1
