"""#21 line 2: another appliance carries a session on, in a stream of its own that names the
old one, and ``resume`` follows the link.

Two appliances, A and B, each with its own keys, engine, proxy and MCP servers, record into
one real PostgreSQL database (a private cluster, ``tests/pg_server.py``); the ledger MCP
server's file is the one world both act on. On A a session's turn 0 is SIGKILLed as the real
CLI after its first ``append_note`` is done; then A stops for good.
On B, as the real CLI: ``session continue`` opens a stream naming A's and its last checkpoint,
``resume`` finishes turn 0 serving what A recorded (no ``append_note`` twice, no committed
model step asked again), and turn 1 follows with the history of both appliances. Then
``replay --reconstruct`` re-drives turns 0 and 1 across the link with no network, and ``log
verify`` checks the link against A's stream. B's own stream and a stream it does not know
cannot be continued; and B never writes A's stream.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the harness tests run the embedded engine (`engine` extra)")
pytest.importorskip("openai", reason="the harness drives turns with the openai client")

from affidavit.cli import main
from harness.continuation import Linked, refreshed
from harness.session import open_session, read_linked, run_turn
from harness.state import Home
from record.backends import open_store
from record.schema import (
    ModelRequest,
    ModelResponse,
    StreamOpened,
    ToolCall,
    ToolResult,
    TurnEnded,
)
from record.seal import KeyPair
from tests.harness.rig import PINS, harness_rig
from tests.harness.test_resume import (
    HANG_POLICY,
    KILL_POLICY,
    REPO,
    model_step_problems,
    run_and_kill,
    tool_problems,
)
from tests.pg_cluster import SUPERUSER
from tests.pg_server import postgres_server  # noqa: F401  (a fixture, used by name)


def cli(home: Home, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args, "--home", str(home.root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def in_process(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def _committed_notes(bodies: list[tuple[int, Any]]) -> list[str]:
    """The call ids of ``append_note`` calls committed in a session's view."""
    results = {b.call_seq: b for _, b in bodies if isinstance(b, ToolResult)}
    return [
        b.call_id
        for s, b in bodies
        if isinstance(b, ToolCall)
        and b.tool == "append_note"
        and s in results
        and results[s].outcome == "COMMITTED"
    ]


class HarnessDied(Exception):
    """The harness's process ending at a chosen phase (in this process: a raise)."""


def die_at_commit(phase: str) -> None:
    if phase == "model_committed step=0":
        raise HarnessDied(phase)


@dataclass
class Carried:
    old: str
    new: str
    store: str
    key: KeyPair
    home_b: Home
    ledger: Path
    continued: dict[str, Any]
    resumed: dict[str, Any]
    turn2: dict[str, Any]
    own_refused: subprocess.CompletedProcess[str]
    unknown_refused: subprocess.CompletedProcess[str]
    env: dict[str, str]
    search_b: str | None
    more: dict[str, Any]


@pytest.fixture(scope="module")
def carried(
    postgres_server: Any,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Carried]:
    import os

    tmp = tmp_path_factory.mktemp("continue")
    with_password: str = postgres_server.fresh_database()
    name = with_password.rsplit("/", 1)[1]
    url = f"postgresql://{SUPERUSER}@127.0.0.1:{postgres_server.port}/{name}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PGPASSWORD": postgres_server.password}
    env.pop("AFFIDAVIT_TRACE_PHASES", None)
    os.environ["PGPASSWORD"] = postgres_server.password  # this process's readers, too
    ledger = tmp / "ledger.txt"
    home_b = Home(tmp / "b" / "home")
    try:
        with harness_rig(tmp / "b", store=url, ledger=ledger) as b:
            with harness_rig(tmp / "a", store=url, ledger=ledger) as a:
                state = open_session(a.home, PINS, policy=KILL_POLICY)
                old = state.session_id
                killed = run_and_kill(a.home, old, "phase tool_done step=0 call=0", 0.0)
                assert killed.at is not None, f"turn 0 ended before the kill:\n{killed.stderr}"
                key = KeyPair.read(a.home.user_key_file)
                read_linked(url, old, key)  # the proxy finishes what the dead client left
                # the harness dies the moment step 0's reply is committed: no tool call yet
                resent = open_session(a.home, PINS, policy=KILL_POLICY).session_id
                with pytest.raises(HarnessDied):
                    run_turn(a.home, resent, "Note, search, note.", on_phase=die_at_commit)
                # a call whose outcome is unknown: the turn waits for a person's decision
                unknown = open_session(a.home, PINS, policy=HANG_POLICY).session_id
                waiting = run_turn(a.home, unknown, "Do the thing once.")
                assert waiting.outcome == "NEEDS_DECISION", waiting
                shutil.copy(a.home.user_key_file, home_b.user_key_file)  # the user's own key
                # A is up: its proxy holds the stream's lease
                alive_refused = cli(home_b, "session", "continue", old, env=env)
            # A is gone for good; B carries its sessions on
            assert b.home == home_b
            run = cli(home_b, "session", "continue", old, "--json", env=env)
            assert run.returncode == 0, run.stderr
            continued = json.loads(run.stdout)
            new = continued["session"]
            resumed_run = cli(home_b, "resume", new, "--json", env=env)
            assert resumed_run.returncode == 0, resumed_run.stderr + resumed_run.stdout
            turn2_run = cli(home_b, "turn", new, "And one more note.", "--json", env=env)
            assert turn2_run.returncode == 0, turn2_run.stderr
            more: dict[str, Any] = {}
            run = cli(home_b, "session", "continue", resent, "--json", env=env)
            assert run.returncode == 0, run.stderr
            more["resent"] = json.loads(run.stdout)
            run = cli(home_b, "resume", more["resent"]["session"], "--json", env=env)
            assert run.returncode == 0, run.stderr + run.stdout
            more["resent_resume"] = json.loads(run.stdout)
            more["unknown_refused"] = cli(home_b, "session", "continue", unknown, env=env)
            run = cli(home_b, "session", "continue", unknown, "--abandon-turn", "--json", env=env)
            assert run.returncode == 0, run.stderr
            more["abandoned"] = json.loads(run.stdout)
            run = cli(home_b, "turn", more["abandoned"]["session"], "Once more.", "--json", env=env)
            assert run.returncode == 0, run.stderr + run.stdout
            more["abandoned_turn"] = json.loads(run.stdout)
            more["sessions"] = {"resent": resent, "unknown": unknown}
            more["alive_refused"] = alive_refused
            run = cli(home_b, "replay", new, "1", "--json", env=env)
            assert run.returncode == 0, run.stderr + run.stdout
            more["reexecuted"] = json.loads(run.stdout)
            more["reexecute_refused"] = cli(home_b, "replay", new, "0", env=env)
            more["resume_old"] = cli(home_b, "resume", old, env=env)
            more["fork_refused"] = cli(home_b, "session", "continue", old, env=env)
            own_refused = cli(home_b, "session", "continue", new, env=env)
            unknown_refused = cli(home_b, "session", "continue", "no-such-session", env=env)
            made = Carried(
                old,
                new,
                url,
                key,
                home_b,
                ledger,
                continued,
                json.loads(resumed_run.stdout),
                json.loads(turn2_run.stdout),
                own_refused,
                unknown_refused,
                env,
                b.up.appliance.search_url,
                more,
            )
        # B is gone too; A comes back (its own keys) and carries B's stream on: a chain of
        # three streams, two of them A's
        with harness_rig(tmp / "a", store=url, ledger=ledger) as a:
            run = cli(a.home, "session", "continue", new, "--json", env=env)
            assert run.returncode == 0, run.stderr
            more["chain"] = json.loads(run.stdout)
            chained = more["chain"]["session"]
            run = cli(a.home, "session", "show", chained, "--json", env=env)
            assert run.returncode == 0, run.stderr
            more["chain_show"] = json.loads(run.stdout)
            run = cli(a.home, "session", "show", old, env=env)  # A's first, as A's home has it
            assert run.returncode == 0, run.stderr
            more["old_show"] = run.stdout
            run = cli(a.home, "replay", chained, "1", "--reconstruct", "--json", env=env)
            assert run.returncode == 0, run.stderr + run.stdout
            more["chain_reconstruct"] = json.loads(run.stdout)
        yield made
    finally:
        postgres_server.drop_database(with_password)


def test_the_new_stream_names_the_old_one_and_its_last_checkpoint(carried: Carried) -> None:
    store = open_store(carried.store, readonly=True)
    try:
        first = next(iter(store.entries(carried.new, 0, 1)))
        old_opening = next(iter(store.entries(carried.old, 0, 1)))
        last_note = store.checkpoints(carried.old)[-1].note.decode()
        old_size = store.size(carried.old)
    finally:
        store.close()
    opened = StreamOpened.model_validate(json.loads(first.line)["body"])
    old = StreamOpened.model_validate(json.loads(old_opening.line)["body"])
    assert opened.continues is not None
    assert opened.continues.stream == carried.old
    assert opened.continues.checkpoint == last_note
    assert opened.continues.size <= old_size
    assert carried.continued["continues"]["stream"] == carried.old
    assert carried.continued["resume"] is True  # turn 0 had not ended
    # another appliance: its own log key; A's labels carried over, but web_search goes to
    # B's own search endpoint, as for any session B opens
    assert opened.log_key != old.log_key
    search = "affidavit/search_url"
    assert {k: v for k, v in opened.labels.items() if k != search} == {
        k: v for k, v in old.labels.items() if k != search
    }
    assert opened.labels[search] == carried.search_b != old.labels[search]


def test_resume_finishes_the_turn_without_repeating_a_side_effect(carried: Carried) -> None:
    view = read_linked(carried.store, carried.new, carried.key)
    assert view.streams == [carried.old, carried.new]
    bodies = view.bodies
    ended = [b for _, b in bodies if isinstance(b, TurnEnded)]
    assert [e.turn for e in ended] == [0, 1]
    assert carried.resumed["turn"] == 0
    served = carried.resumed["resume"]
    assert served["tool_results_from_record"] >= 1  # A's append_note, served, not sent again
    committed = _committed_notes(bodies)
    assert tool_problems(bodies, "append_note", len(committed)) == []
    assert model_step_problems(bodies, once=False) == []
    # what B sent live went into B's stream; A's stream has nothing of B's
    own = [b for s, b in bodies if s >= view.offset]
    assert any(isinstance(b, ModelRequest) for b in own)
    assert any(isinstance(b, ToolCall) and b.tool == "append_note" for b in own)
    assert carried.turn2["turn"] == 1


def test_the_next_turn_has_the_history_of_both_appliances(carried: Carried) -> None:
    view = read_linked(carried.store, carried.new, carried.key)
    requests = [b for _, b in view.bodies if isinstance(b, ModelRequest) and b.turn == 1]
    assert requests
    sent = json.loads(requests[0].request_bytes)
    users = [m.get("content") for m in sent["messages"] if m.get("role") == "user"]
    assert users == ["Note, search, note.", "And one more note."]  # A's input, then B's
    answer = next(b for _, b in view.bodies if isinstance(b, TurnEnded) and b.turn == 0)
    assert answer.answer_bytes is not None
    said = [m.get("content") for m in sent["messages"] if m.get("role") == "assistant"]
    assert said == [answer.answer_bytes.decode()]  # the answer B's resume recorded


def test_reconstruct_follows_the_link(carried: Carried) -> None:
    for turn in ("0", "1"):
        code, out = in_process(
            "replay",
            carried.new,
            turn,
            "--reconstruct",
            "--home",
            str(carried.home_b.root),
            "--json",
        )
        assert code == 0, out
        doc = json.loads(out)
        assert doc["ok"] is True and doc["answer_identical"] is True, doc
        assert doc["turn"] == int(turn) and doc["steps"], doc


def test_log_verify_checks_the_link(carried: Carried) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "affidavit", "log", "verify", carried.store],
        cwd=REPO,
        env=carried.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    said = [line.strip() for line in run.stdout.splitlines() if "continues" in line]
    continued = {
        carried.more["chain"]["session"]: carried.new,
        carried.new: carried.old,
        carried.more["resent"]["session"]: carried.more["sessions"]["resent"],
        carried.more["abandoned"]["session"]: carried.more["sessions"]["unknown"],
    }
    assert len(said) == len(continued), run.stdout
    for new, old in continued.items():
        (line,) = [s for s in said if s.startswith(f"stream {new} continues {old} at entry ")]
        assert line.endswith("link checked"), line


def test_what_cannot_be_continued_is_refused(carried: Carried) -> None:
    own = carried.own_refused
    assert own.returncode == 1, own.stdout + own.stderr
    assert "is being written right now by its appliance" in own.stderr  # B's own, B is up
    unknown = carried.unknown_refused
    assert unknown.returncode == 3, unknown.stdout + unknown.stderr
    assert "no-such-session" in unknown.stderr


def test_b_never_writes_a_stream(carried: Carried) -> None:
    store = open_store(carried.store, readonly=True)
    try:
        lines = [json.loads(e.line) for e in store.entries(carried.old)]
    finally:
        store.close()
    # every entry of A's stream was there before B continued it (B's link took them all,
    # or stopped short of the step it sent again): none is B's
    assert len(lines) >= carried.continued["continues"]["size"]
    replies = [
        b
        for _, b in read_linked(carried.store, carried.old, carried.key).bodies
        if isinstance(b, ModelResponse)
    ]
    assert replies  # A's own replies, readable with the user's key


def test_a_step_whose_tools_never_started_is_sent_again(carried: Carried) -> None:
    """A's harness died the moment step 0's reply was committed: the link stops before that
    step's request, and B sends it again, so B's proxy admits its tool call."""
    old = carried.more["sessions"]["resent"]
    a_bodies = read_linked(carried.store, old, carried.key).bodies
    last_request = max(s for s, b in a_bodies if isinstance(b, ModelRequest))
    assert isinstance(a_bodies[-1][1], ModelResponse)  # A stopped right at the commit
    assert carried.more["resent"]["continues"]["size"] == last_request
    new = carried.more["resent"]["session"]
    view = read_linked(carried.store, new, carried.key)
    served = carried.more["resent_resume"]["resume"]
    assert served["model_steps_from_record"] == 0
    assert served["model_steps_live"] >= 2
    assert carried.more["resent_resume"]["outcome"] in ("ANSWERED", "STEP_LIMIT")
    # in the view step 0 is asked once, by B, and its append_note ran from B's stream
    assert model_step_problems(view.bodies) == []
    calls = [(s, b) for s, b in view.bodies if isinstance(b, ToolCall) and b.tool == "append_note"]
    assert calls and all(s >= view.offset for s, _ in calls)


def test_a_call_of_unknown_outcome_is_not_carried_on(carried: Carried) -> None:
    refused = carried.more["unknown_refused"]
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "hang_once" in refused.stderr and "is unknown" in refused.stderr
    assert "--abandon-turn" in refused.stderr
    old = carried.more["sessions"]["unknown"]
    abandoned = carried.more["abandoned"]
    assert abandoned["resume"] is False
    a_bodies = read_linked(carried.store, old, carried.key).bodies
    started = next(s for s, b in a_bodies if type(b).__name__ == "TurnStarted")
    assert abandoned["continues"]["size"] == started  # the link stops before turn 0
    # the new stream starts turn 0 again, and B's appliance answers it
    assert carried.more["abandoned_turn"]["turn"] == 0
    assert carried.more["abandoned_turn"]["outcome"] == "ANSWERED"


def test_the_ledger_got_each_committed_note_once(carried: Carried) -> None:
    """The one world both appliances acted on: a line per committed ``append_note`` across
    every session, A's part and B's, and no call id committed twice in one session (two
    pinned sessions fed the same input derive the same ids)."""
    total = 0
    for session in (carried.new, carried.more["resent"]["session"]):
        ids = _committed_notes(read_linked(carried.store, session, carried.key).bodies)
        assert ids and len(set(ids)) == len(ids), (session, ids)
        total += len(ids)
    assert len(carried.ledger.read_text().splitlines()) == total


def test_re_execute_runs_a_turn_of_the_new_stream_and_says_why_not_an_older_one(
    carried: Carried,
) -> None:
    """Turn 1 is all B's: B's pinned engine re-executes it, identical step by step. Turn 0
    began in A's stream, which B's proxy cannot read: refused, pointing to reconstruct."""
    again = carried.more["reexecuted"]
    assert again["turn"] == 1 and again["identical"] is True, again
    assert again["steps"] and all(
        step["request"] == step["reply"] == "identical" for step in again["steps"]
    )
    assert again["live_calls"] == 0  # every tool answered from B's record
    refused = carried.more["reexecute_refused"]
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "began in" in refused.stderr and "--reconstruct" in refused.stderr


def test_a_session_whose_appliance_is_up_is_not_continued(carried: Carried) -> None:
    """While A runs, its proxy holds the stream's lease: continuing would fork the session."""
    refused = carried.more["alive_refused"]
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "is being written right now by its appliance" in refused.stderr
    assert carried.old in refused.stderr


def test_a_chain_of_continuations_reads_as_one_session(carried: Carried) -> None:
    """A continues B's continuation of A's stream: three streams, one session."""
    chain = carried.more["chain"]
    assert chain["continues"]["stream"] == carried.new and chain["resume"] is False
    view = read_linked(carried.store, chain["session"], carried.key)
    assert view.streams == [carried.old, carried.new, chain["session"]]
    # a poll's view (wait_settled) reads only the newest stream again, and finds the same
    stale = Linked(view.bodies[: view.offset + 1], view.offset, view.streams)  # its opening
    assert len(view.bodies) > view.offset + 1
    assert refreshed(stale, carried.store, carried.key) == view
    shown = carried.more["chain_show"]
    assert shown["continues"] == [carried.old, carried.new] and shown["continued_by"] == []
    assert [t["turn"] for t in shown["turns"]] == [0, 1]
    assert [t["outcome"] for t in shown["turns"]] == ["ANSWERED", "ANSWERED"]
    again = carried.more["chain_reconstruct"]
    assert again["ok"] is True and again["answer_identical"] is True


def test_resuming_the_other_appliances_session_points_to_continue(carried: Carried) -> None:
    run = carried.more["resume_old"]
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"affidavit session continue {carried.old}" in run.stderr


def test_a_stream_already_carried_on_is_not_carried_on_twice(carried: Carried) -> None:
    run = carried.more["fork_refused"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"already carried on by {carried.new}" in run.stderr
    assert f"continue {carried.new} instead" in run.stderr


def test_the_old_session_says_where_it_goes_on(carried: Carried) -> None:
    """In A's home its first session's turn never ended there; ``session show`` says it is
    carried on elsewhere rather than asking for a resume A may no longer do."""
    shown = carried.more["old_show"]
    assert f"carried on in {carried.new}, by another appliance" in shown
    assert "affidavit resume" not in shown
