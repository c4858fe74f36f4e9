"""The panel explains itself (#18, line 6), in a real browser (Debian's Chromium through
Playwright) over a real appliance's record: replays under the session they replay, each
session's first input, ISO-8601 UTC times with local time on hover, the reproducibility
block as a labelled table that warns when nothing ran in a TEE, a failed tool call with its
reason, and a tampered store's turn shown red with its problems first and the step marked.

Screenshots go to ``$AFFIDAVIT_PANEL_SHOTS`` (default ``/tmp/panel-shots``)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip("torch", reason="the panel tests run the embedded engine (`engine` extra)")
pytest.importorskip("jinja2", reason="the panel renders with Jinja2")

from harness.agent import TurnPolicy
from harness.panel.fields import FIELDS, no_tee
from harness.panel.server import running_panel
from harness.panel.source import ApplianceSource
from harness.reexecute import reexecute_turn
from harness.session import open_session, read_bodies, run_turn
from harness.state import Home
from record.schema import FetchRequest, ModelRequest, ModelResponse, ToolCall
from record.seal import KeyPair
from tests.harness.rig import CLOCK, PINS, HarnessRig, harness_rig, named

SHOTS = Path(os.environ.get("AFFIDAVIT_PANEL_SHOTS", "/tmp/panel-shots"))
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
VIEWER_ZONE = "Asia/Kolkata"  # UTC+5:30: no viewer's local time reads like UTC
FETCH_INPUT = "Fetch the page please."
PLAIN_INPUT = "Say hello to the auditor."
RED = "rgb(198, 40, 40)"


@dataclass
class Explained:
    rig: HarnessRig
    session: str  # pinned; turn 0's web_fetch call failed before it reached the proxy
    reason: str  # why, as the harness told the model (the next model request records it)
    replay: str  # the replay stream of that turn
    plain: str  # an unpinned session with one turn
    tampered: Home  # a copy of the record with one entry's bytes changed
    tampered_seq: int  # that entry: the model reply of step 0

    @property
    def key(self) -> KeyPair:
        return KeyPair.read(self.rig.home.user_key_file)


def _failed_call_reason(store: str, session: str, key: KeyPair) -> tuple[str, int]:
    """The reason the turn's first tool call failed, read straight from the recorded request
    that sent it back to the model; and the seq of the reply that asked for it."""
    bodies = read_bodies(store, session, key)
    assert not any(isinstance(b, ToolCall | FetchRequest) for _, b in bodies), (
        "the forced web_fetch reached the proxy: this test needs a call that fails before it"
    )
    replies = [seq for seq, b in bodies if isinstance(b, ModelResponse)]
    requests = [b for _, b in bodies if isinstance(b, ModelRequest)]
    assert len(requests) >= 2, "the turn ended before its tool result went back to the model"
    sent = json.loads(requests[1].request_bytes)
    (tool,) = [m for m in sent["messages"] if m.get("role") == "tool"]
    return str(tool["content"]), replies[0]


def _tampered_copy(store: str, into: Path, stream: str, seq: int, key_file: Path) -> Home:
    """A copy of the record whose entry ``seq`` has one byte of its sealed body changed, as
    an attacker editing the file would (the append-only trigger dropped in the copy)."""
    into.mkdir()
    source = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    copy = sqlite3.connect(into / "record.db")
    try:
        source.backup(copy)
        copy.execute("DROP TRIGGER entries_no_update")
        (line,) = copy.execute(
            "SELECT line FROM entries WHERE stream = ? AND seq = ?", (stream, seq)
        ).fetchone()
        line = bytes(line)
        at = line.index(b'"body":"') + len(b'"body":"') + 20
        changed = line[:at] + (b"A" if line[at : at + 1] != b"A" else b"B") + line[at + 1 :]
        copy.execute(
            "UPDATE entries SET line = ? WHERE stream = ? AND seq = ?", (changed, stream, seq)
        )
        copy.commit()
    finally:
        copy.close()
        source.close()
    (into / "user.key").write_bytes(key_file.read_bytes())
    (into / "user.key").chmod(0o600)  # a key file others can read is refused
    return Home(into)  # no appliance.json: the panel reads its record.db, read-only


@pytest.fixture(scope="module")
def explained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explained]:
    root = tmp_path_factory.mktemp("explains")
    with harness_rig(root, mcp=False) as rig:
        pinned = open_session(rig.home, PINS, policy=TurnPolicy(3, (named("web_fetch"), "none")))
        key = KeyPair.read(rig.home.user_key_file)  # open_session made it
        run_turn(rig.home, pinned.session_id, FETCH_INPUT)
        reason, reply_seq = _failed_call_reason(rig.up.appliance.store, pinned.session_id, key)
        replay = reexecute_turn(rig.home, pinned.session_id, 0, key=key).replay_stream
        plain = open_session(rig.home, None, policy=TurnPolicy(1, ("none",)))
        run_turn(rig.home, plain.session_id, PLAIN_INPUT)
        tampered = _tampered_copy(
            rig.up.appliance.store,
            root / "tampered",
            pinned.session_id,
            reply_seq,
            rig.home.user_key_file,
        )
        yield Explained(
            rig, pinned.session_id, reason, replay, plain.session_id, tampered, reply_seq
        )


@pytest.fixture(scope="module")
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


def _page(browser: Any) -> Any:
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, timezone_id=VIEWER_ZONE, locale="en-GB"
    )
    return context.new_page()


def _turn(page: Any, panel: Any, stream: str) -> None:
    page.goto(panel.url)  # the token sets the panel's cookie
    response = page.goto(f"{panel.base}/s/{stream}/t/0")
    assert response is not None and response.status == 200, page.content()[-3000:]


# -- the sessions list -----------------------------------------------------------------------


def test_replays_are_listed_under_their_session_which_shows_its_first_input(
    explained: Explained, browser: Any, shots: Path
) -> None:
    with running_panel(ApplianceSource(explained.rig.home)) as panel:
        page = _page(browser)
        page.goto(panel.url)
        top = page.locator("table.sessions > tbody > tr a.stream").evaluate_all(
            "links => links.map(a => a.getAttribute('href'))"
        )
        assert top == [f"/s/{explained.plain}", f"/s/{explained.session}"]  # latest first
        assert f"/s/{explained.replay}" not in top  # no replay at the top level
        row = page.locator(
            f"table.sessions > tbody > tr:has(a.stream[href='/s/{explained.session}'])"
        )
        replays = row.locator("ul.replays a.replay-stream")
        assert replays.count() == 1
        assert replays.get_attribute("href") == f"/s/{explained.replay}"
        assert "of turn 0" in row.locator("ul.replays li").inner_text()
        assert row.locator("td.first-input").inner_text() == FETCH_INPUT
        plain = page.locator(f"tr:has(a.stream[href='/s/{explained.plain}'])")
        assert plain.locator("td.first-input").inner_text() == PLAIN_INPUT
        page.screenshot(path=str(shots / "explains-sessions.png"), full_page=True)
        page.click(f"a.replay-stream[href='/s/{explained.replay}']")  # the replay opens
        assert f"A replay of turn 0 of {explained.session}" in page.inner_text("p.replay-of")
        page.context.close()


# -- times -----------------------------------------------------------------------------------


def _local(stamp: str) -> tuple[str, ...]:
    """What the viewer's clock reads at ``stamp``: the date and time a title must show
    (the browser writes an hour before ten as ``0:41:07`` or ``00:41:07``, by its locale)."""
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(ZoneInfo(VIEWER_ZONE))
    return (when.strftime("%d/%m/%Y, %H:%M:%S"), f"{when:%d/%m/%Y}, {when.hour}:{when:%M:%S}")


def test_times_read_as_iso_8601_utc_with_the_viewers_local_time_on_hover(
    explained: Explained, browser: Any
) -> None:
    with running_panel(ApplianceSource(explained.rig.home)) as panel:
        page = _page(browser)
        for path in ("/", f"/s/{explained.session}", f"/s/{explained.session}/t/0"):
            page.goto(panel.url if path == "/" else panel.base + path)
            times = page.locator("time[datetime]")
            assert times.count() >= 2, path
            for i in range(times.count()):
                shown, title = times.nth(i).inner_text(), times.nth(i).get_attribute("title")
                assert ISO_UTC.fullmatch(shown), (path, shown)
                assert title is not None and any(
                    title.startswith(f"local time: {local} ") for local in _local(shown)
                ), (path, shown, title)
        clock = page.locator(f"time[datetime='{CLOCK}']").first
        assert clock.inner_text() == CLOCK  # the injected clock, UTC as recorded
        assert clock.get_attribute("title", timeout=5_000) is not None
        assert _local(CLOCK)[0] == "22/07/2026, 15:00:00"  # and the viewer's own on hover
        assert (clock.get_attribute("title") or "").startswith("local time: 22/07/2026, 15:00:00")
        page.context.close()


# -- the reproducibility block ---------------------------------------------------------------


def test_the_reproducibility_block_is_a_labelled_table_that_warns_when_no_tee_ran_it(
    explained: Explained, browser: Any, shots: Path
) -> None:
    with running_panel(ApplianceSource(explained.rig.home)) as panel:
        page = _page(browser)
        _turn(page, panel, explained.session)
        tables = page.locator("section.repro table.repro-table")
        assert tables.count() == page.locator("article.step").count() == 2
        assert page.locator("section.repro ul.chips").count() == 0  # no cloud of pills
        rows = tables.first.locator("tr.field")
        names = rows.locator("th[scope=row]").all_inner_texts()
        meanings = rows.locator("td.meaning").all_inner_texts()
        assert {"seed", "weights_digest", "tee_type", "image_digest"} <= set(names)
        for name, meaning in zip(names, meanings, strict=True):
            assert meaning == FIELDS[name], name  # every member explained, in one line
        warning = page.locator("#tee-warning")
        assert warning.is_visible()
        text = warning.inner_text()
        assert 'tee_type is "none"' in text and "image_digest is null" in text
        flagged = tables.first.locator("tr.flagged").evaluate_all(
            "rows => rows.map(r => r.dataset.field)"
        )
        assert flagged == ["tee_type", "image_digest"]  # first: where it ran
        assert page.locator(".tee-flag").first.is_visible()
        page.screenshot(path=str(shots / "explains-turn.png"), full_page=True)
        tables.first.screenshot(path=str(shots / "explains-repro-table.png"))
        page.context.close()


def test_a_block_that_names_its_tee_and_image_is_not_flagged() -> None:
    assert no_tee({"tee_type": "sev-snp", "image_digest": "sha256:" + "0" * 64}) == []
    assert no_tee({"tee_type": "none", "image_digest": None}) == [
        'tee_type is "none"',
        "image_digest is null",
    ]
    assert no_tee({"model": "m"}) == []  # a block that does not say where it ran


# -- a failed tool call ----------------------------------------------------------------------


def test_a_failed_tool_call_is_shown_with_its_reason(
    explained: Explained, browser: Any, shots: Path
) -> None:
    with running_panel(ApplianceSource(explained.rig.home)) as panel:
        page = _page(browser)
        _turn(page, panel, explained.session)
        failed = page.locator("#step-0 section.tool.failed")
        assert failed.count() == 1
        assert "web_fetch" in failed.locator("h3").inner_text()
        assert "FAILED" in failed.locator("h3").inner_text()
        assert failed.locator(".reason .reason-text").inner_text() == explained.reason
        assert explained.reason  # the harness said why
        failed.screenshot(path=str(shots / "explains-failed-tool.png"))
        page.context.close()


# -- a tampered store ------------------------------------------------------------------------


def test_a_tampered_turn_is_red_with_its_problems_first_and_the_step_marked(
    explained: Explained, browser: Any, shots: Path
) -> None:
    with running_panel(ApplianceSource(explained.rig.home)) as panel:
        page = _page(browser)
        _turn(page, panel, explained.session)
        steps = page.locator("article.step").count()
        assert page.locator("#audit-problems").count() == 0  # the intact record: no alarm
        assert "untrusted" not in (page.get_attribute("#turn-outcome", "class") or "")
        page.context.close()
    with running_panel(ApplianceSource(explained.tampered)) as panel:
        page = _page(browser)
        _turn(page, panel, explained.session)
        outcome = page.locator("#turn-outcome")
        assert "untrusted" in (outcome.get_attribute("class") or "")
        assert "record has problems" in outcome.inner_text()
        assert outcome.evaluate("e => getComputedStyle(e).backgroundColor") == RED
        assert page.locator("h1.turn-title").evaluate("e => getComputedStyle(e).color") == RED
        problems = page.locator("#audit-problems li.problem").all_inner_texts()
        seq = explained.tampered_seq
        assert problems[0].startswith(f"leaf_mismatch seq {seq} · step 0")
        assert any(p.startswith(f"cannot_open seq {seq} · step 0") for p in problems)
        first = page.evaluate(
            "[...document.querySelectorAll('main > *')].map(e => e.id || e.className)"
        )
        assert first.index("audit-problems") < first.index("actions")  # problems first
        assert first.index("audit-problems") < first.index("step-0")
        assert page.locator("article.step").count() == steps  # no step dropped
        marked = page.locator("article.step.tampered")
        assert marked.count() == 1 and marked.get_attribute("id") == "step-0"
        assert f"seq {seq}" in marked.locator("ul.step-problems").inner_text()
        assert marked.evaluate("e => getComputedStyle(e).borderLeftColor") == RED
        page.screenshot(path=str(shots / "explains-tampered.png"), full_page=True)
        page.context.close()
