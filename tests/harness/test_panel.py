"""The reproducibility panel (``harness.panel``) over a real appliance and a recorded pinned
turn: the access token, escaping of what the record holds, the export as one ``.tar.gz``,
bundle mode (read-only), and a browser (Playwright driving Debian's Chromium, headless, on
loopback) that replays a turn, verifies it, downloads its bundle, and sees a planted
divergence highlighted. Screenshots go to a folder this module prints."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the panel tests run the embedded engine (`engine` extra)")
pytest.importorskip("jinja2", reason="the panel renders with Jinja2")

from fastapi.testclient import TestClient

from affidavit.cli import main
from harness.agent import TurnPolicy
from harness.panel.app import create_app
from harness.panel.server import running_panel
from harness.panel.source import ApplianceSource, BundleSource
from harness.session import open_session, read_bodies, run_turn
from harness.state import Home
from harness.up import TINY_MODEL, running_appliance
from record.bundle import export_stream, verify_bundle
from record.schema import ModelRequest
from record.seal import KeyPair
from tests.harness.rig import CLOCK, PINS, HarnessRig, harness_rig, named

SCRIPT = "<script>alert(1)</script>"
POLICY = TurnPolicy(
    4, (named("ledger__append_note"), named("time__get_current_time"), named("web_search"), "none")
)
TOKEN = "panel-test-token"
REPO = Path(__file__).resolve().parents[2]
SAME_ORIGIN = {"origin": "http://testserver", "sec-fetch-site": "same-origin"}


@dataclass
class Recorded:
    rig: HarnessRig
    pinned: str  # a pinned session (strict cache) with one turn of four steps and three tools
    plain: str  # an unpinned session with one turn
    key_file: Path  # the user's key: a recipient of both

    @property
    def home(self) -> Home:
        return self.rig.home

    @property
    def key(self) -> KeyPair:
        return KeyPair.read(self.key_file)

    @property
    def store(self) -> str:
        return self.rig.up.appliance.store


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with harness_rig(tmp_path_factory.mktemp("panel")) as rig:
        rig.web.template = SCRIPT + " page version {n} of {path}"  # a tool result with a tag
        pinned = open_session(rig.home, PINS, policy=POLICY)
        result = run_turn(rig.home, pinned.session_id, "Note this, tell the time, search the web.")
        assert result.outcome == "ANSWERED", result.detail
        plain = open_session(rig.home, None, policy=TurnPolicy(1, ("none",)))
        run_turn(rig.home, plain.session_id, "Say <b>hello</b>.")
        yield Recorded(rig, pinned.session_id, plain.session_id, rig.home.user_key_file)


def client_for(source: Any) -> TestClient:
    client = TestClient(create_app(source, token=TOKEN))
    assert client.get(f"/?token={TOKEN}").status_code == 200  # the cookie is set
    client.headers.update(SAME_ORIGIN)  # what a browser sends with the panel's own forms
    return client


# -- the token ---------------------------------------------------------------------------------


def test_every_route_needs_the_token_which_opens_an_httponly_session_cookie(
    recorded: Recorded,
) -> None:
    client = TestClient(create_app(ApplianceSource(recorded.home), token=TOKEN))
    stream = recorded.pinned
    for path in ("/", f"/s/{stream}", f"/s/{stream}/t/0", "/static/panel.css",
                 f"/s/{stream}/export.tar.gz", "/jobs/x", "/nope"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 401, path
        assert stream not in response.text
    for path in (f"/s/{stream}/t/0/replay", f"/s/{stream}/t/0/verify"):
        assert client.post(path).status_code == 401
    assert client.get("/?token=not-it").status_code == 401
    assert client.get("/", headers={"authorization": "Bearer not-it"}).status_code == 401
    first = client.get(f"/s/{stream}?token={TOKEN}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == f"/s/{stream}"
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and TOKEN.lower() not in cookie
    page = client.get(f"/s/{stream}")  # the cookie from now on
    assert page.status_code == 200 and stream in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    bearer = TestClient(create_app(ApplianceSource(recorded.home), token=TOKEN))
    assert bearer.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


# -- pages -------------------------------------------------------------------------------------


def test_the_pages_show_sessions_turns_steps_tools_and_verified_inclusion_proofs(
    recorded: Recorded,
) -> None:
    client = client_for(ApplianceSource(recorded.home))
    listing = client.get("/").text
    assert recorded.pinned in listing and recorded.plain in listing
    assert "pinned · strict" in listing and "unpinned" in listing
    assert "consistent" in listing and "size " in listing  # health: the latest checkpoint
    session = client.get(f"/s/{recorded.pinned}").text
    assert "Note this, tell the time, search the web." in session and "ANSWERED" in session
    page = client.get(f"/s/{recorded.pinned}/t/0").text
    bodies = read_bodies(recorded.store, recorded.pinned, recorded.key)
    requests = [b for _, b in bodies if isinstance(b, ModelRequest)]
    assert len(requests) == 4
    for request in requests:
        assert request.prompt_digest in page and request.content_key in page
    assert page.count('<article id="step-') == 4
    assert f'datetime="{CLOCK}"' in page  # the injected clock, a <time> for local display
    for name in ("append_note", "get_current_time", "web_search", "ledger", "time"):
        assert f"<b>{name}</b>" in page or f"<dd>{name}</dd>" in page, name
    assert "weights_digest" in page and "affidavit_tool_call_ids" in page  # both halves
    positions = page.count('<details class="position')
    assert positions == 1 + 4 * 2 + 3 * 2 + 1  # started, 4 requests and replies, 3 tools, ended
    assert page.count("✓ inclusion proof verified") == positions
    assert 'id="replay-button">Replay' in page  # enabled: pinned in strict cache mode
    assert client.get(f"/s/{recorded.pinned}/t/9").status_code == 404
    assert client.get("/s/no-such-stream").status_code == 404
    assert client.get("/s/.hidden").status_code == 404  # not a stream name


def test_a_script_tag_in_a_tool_result_is_shown_as_text(recorded: Recorded) -> None:
    client = client_for(ApplianceSource(recorded.home))
    page = client.get(f"/s/{recorded.pinned}/t/0").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; page version 0 of /search" in page
    assert SCRIPT not in page and "alert(1)</script>" not in page
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/panel.js" defer>']
    plain = client.get(f"/s/{recorded.plain}").text
    assert "Say &lt;b&gt;hello&lt;/b&gt;." in plain and "<b>hello</b>" not in plain


def test_replay_is_off_for_an_unpinned_turn_and_says_why(recorded: Recorded) -> None:
    client = client_for(ApplianceSource(recorded.home))
    page = client.get(f"/s/{recorded.plain}/t/0").text
    assert re.search(r'id="replay-button"\s+disabled', page)
    assert "Replay is off: turn 0 was not pinned" in page
    refused = client.post(f"/s/{recorded.plain}/t/0/replay")
    assert refused.status_code == 409 and "was not pinned" in refused.text


# -- export ------------------------------------------------------------------------------------


def _extract(data: bytes, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(into, filter="data")
    (top,) = {name.split("/", 1)[0] for name in names}
    return into / top


def test_export_downloads_the_bundle_directory_as_one_tar_gz_that_verifies(
    recorded: Recorded, tmp_path: Path
) -> None:
    client = client_for(ApplianceSource(recorded.home))
    response = client.get(f"/s/{recorded.pinned}/export.tar.gz")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    assert f'filename="{recorded.pinned}-bundle.tar.gz"' in response.headers["content-disposition"]
    bundle = _extract(response.content, tmp_path)
    assert bundle.name == f"{recorded.pinned}-bundle"
    names = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert {"bundle.json", "entries.jsonl", "log_key.pub", "recipients.txt"} <= names
    assert any(n.startswith("checkpoints/") for n in names)
    report = verify_bundle(bundle, key=recorded.key)
    assert report.ok, report.problems
    assert report.entries == len(read_bodies(recorded.store, recorded.pinned, recorded.key))


# -- bundle mode -------------------------------------------------------------------------------


def _digest_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(path.relative_to(folder).as_posix().encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def test_bundle_mode_serves_the_same_pages_read_only_with_the_users_key(
    recorded: Recorded, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    export_stream(recorded.store, recorded.pinned, bundle)
    before = _digest_tree(bundle)
    client = client_for(BundleSource(bundle, recorded.key))
    listing = client.get("/").text
    assert recorded.pinned in listing and recorded.plain not in listing
    assert "read-only bundle" in listing
    page = client.get(f"/s/{recorded.pinned}/t/0").text
    live = client_for(ApplianceSource(recorded.home)).get(f"/s/{recorded.pinned}/t/0").text
    for digest in set(re.findall(r"sha256:[0-9a-f]{64}", live)):
        assert digest in page  # every digest of the live page, read from the bundle
    assert page.count("✓ inclusion proof verified") == live.count("✓ inclusion proof verified")
    assert re.search(r'id="replay-button"\s+disabled', page)
    assert "Replay is off: this panel reads an exported bundle, read-only" in page
    assert client.post(f"/s/{recorded.pinned}/t/0/replay").status_code == 409
    started = client.post(f"/s/{recorded.pinned}/t/0/verify", follow_redirects=False)
    assert started.status_code == 303
    job = re.search(r"verify=([0-9a-f]+)", started.headers["location"])
    assert job is not None
    done = client.get(f"/jobs/{job.group(1)}?wait=1").json()
    assert done["state"] == "done" and done["ok"] is True, done
    assert done["result"]["reconstruct"]["ok"] is True
    shown = client.get(started.headers["location"]).text
    assert "reconstructed exactly" in shown and "verified: reconstruction exact" in shown
    exported = client.get(f"/s/{recorded.pinned}/export.tar.gz")
    assert verify_bundle(_extract(exported.content, tmp_path / "again"), key=recorded.key).ok
    assert _digest_tree(bundle) == before  # nothing in the bundle was written


def test_a_key_that_is_not_a_recipient_opens_nothing(recorded: Recorded, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    export_stream(recorded.store, recorded.pinned, bundle)
    client = client_for(BundleSource(bundle, KeyPair.generate()))
    assert "sealed" in client.get("/").text
    page = client.get(f"/s/{recorded.pinned}/t/0")
    assert page.status_code == 403 and "Note this" not in page.text
    assert "Note this" not in client.get(f"/s/{recorded.pinned}").text


def test_the_panel_command_refuses_what_it_cannot_serve(recorded: Recorded, tmp_path: Path) -> None:
    assert main(["panel", "--bundle", str(tmp_path)]) == 2  # --bundle needs --key
    key = str(recorded.key_file)
    assert main(["panel", "--bundle", str(tmp_path / "none"), "--key", key]) == 3
    assert main(["panel", "--bundle", str(tmp_path), "--key", key]) == 3  # not a bundle
    assert main(["panel", "--home", str(tmp_path / "empty")]) == 3  # no store
    assert main(["panel", "--bundle", str(tmp_path), "--key", str(tmp_path / "k")]) == 3


def test_the_panel_command_prints_its_url_serves_a_bundle_and_stops_on_sigint(
    recorded: Recorded, tmp_path: Path
) -> None:
    import httpx

    bundle = tmp_path / "bundle"
    export_stream(recorded.store, recorded.pinned, bundle)
    args = [sys.executable, "-m", "affidavit", "panel", "--bundle", str(bundle),
            "--key", str(recorded.key_file), "--json"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        assert doc["mode"] == "bundle" and doc["base"].startswith("http://127.0.0.1:")
        assert doc["url"].startswith(doc["base"] + "/?token=")
        with httpx.Client(trust_env=False, timeout=30) as http:
            assert http.get(doc["base"] + "/").status_code == 401
            page = http.get(doc["url"], follow_redirects=True)
            assert page.status_code == 200 and recorded.pinned in page.text
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read() if proc.stderr else ""


# -- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("panel-screenshots")
    return folder


def _name_folder(folder: Path, capsys: pytest.CaptureFixture[str], request: Any) -> None:
    request.node.user_properties.append(("screenshots", str(folder)))
    with capsys.disabled():
        print(f"\npanel screenshots: {folder}")


def _open_turn(page: Any, url: str, stream: str, shot: Path | None = None) -> None:
    page.goto(url)  # with the token: the panel sets its cookie and drops it from the URL
    assert "token" not in page.url
    if shot is not None:
        page.screenshot(path=str(shot), full_page=True)
    page.click(f"a.stream[href='/s/{stream}']")
    page.click("a[href$='/t/0']")
    page.wait_for_selector("#replay-button")


def test_in_a_browser_replay_reads_identical_then_verify_then_the_download_verifies(
    recorded: Recorded,
    browser: Any,
    screenshots: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: Any,
) -> None:
    _name_folder(screenshots, capsys, request)
    dialogs: list[str] = []
    with running_panel(ApplianceSource(recorded.home)) as panel:
        assert panel.base.startswith("http://127.0.0.1:")
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            accept_downloads=True,
            timezone_id="Europe/Paris",  # the viewer's local time: UTC+2 in July
            locale="en-GB",
        )
        page = context.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(panel.url)
        pinned_row = page.locator(f"tr:has(a.stream[href='/s/{recorded.pinned}'])")
        assert "is-pinned" in (pinned_row.get_attribute("class") or "")
        assert pinned_row.locator(".badge.pinned").inner_text() == "pinned · strict"
        plain_row = page.locator(f"tr:has(a.stream[href='/s/{recorded.plain}'])")
        assert plain_row.locator(".badge.unpinned").inner_text() == "unpinned"
        _open_turn(page, panel.url, recorded.pinned, screenshots / "sessions.png")
        clock = page.locator(f"time[datetime='{CLOCK}']").first
        assert clock.inner_text() == CLOCK  # ISO-8601 UTC
        title = clock.get_attribute("title") or ""
        assert title.startswith("local time: 22/07/2026, 11:30:00"), title  # local on hover
        page.screenshot(path=str(screenshots / "turn.png"), full_page=True)
        page.click("#replay-button")
        page.wait_for_selector("#replay-summary", timeout=60_000)
        lines = page.locator("#replay-banner li").all_inner_texts()
        assert len(lines) == 4
        for step, line in enumerate(lines):
            assert line.startswith(
                f"Replay of turn 0, step {step}: prompt identical · injected clock identical · "
                "request identical · reply identical · "
            ), line
            assert line.endswith(" replayed from the record · 0 live calls"), line
        summary = page.inner_text("#replay-summary")
        assert "identical: 4 of 4 steps identical" in summary and "0 live calls" in summary
        assert page.locator("article.step.same").count() == 4
        assert page.locator("article.step.differs").count() == 0
        page.locator("#replay").screenshot(path=str(screenshots / "replay-banner.png"))
        page.screenshot(path=str(screenshots / "turn-replayed.png"), full_page=True)
        page.click("#verify-button")
        page.wait_for_selector("#verify-result", timeout=60_000)
        assert "verified: reconstruction exact" in page.inner_text("#verify-result")
        assert "reconstructed exactly" in page.inner_text("#verify-lines")
        assert page.locator("#replay-summary").count() == 1  # the replay's banner stays
        page.locator("#verify").screenshot(path=str(screenshots / "verify.png"))
        with page.expect_download() as info:
            page.click("#export")
        archive = tmp_path / "bundle.tar.gz"
        info.value.save_as(archive)
        assert info.value.suggested_filename == f"{recorded.pinned}-bundle.tar.gz"
        context.close()
    bundle = _extract(archive.read_bytes(), tmp_path / "out")
    key = str(recorded.key_file)
    assert main(["log", "verify", str(bundle), "--key", key]) == 0
    assert dialogs == []  # the recorded script tag never ran


@dataclass
class Diverged:
    home: Home
    session: str


@pytest.fixture(scope="module")
def diverged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Diverged]:
    """A pinned turn recorded on the shipped tiny model; then the same appliance (home,
    store, keys, clock) restarted on a copy of that model with one weight matrix scaled:
    a replay on it is a real re-execution on different weights."""
    from safetensors.numpy import load_file, save_file

    root = tmp_path_factory.mktemp("diverged")
    home = Home(root / "home")
    with running_appliance(home, engine=TINY_MODEL, clock=CLOCK):
        state = open_session(home, PINS, policy=TurnPolicy(1, ("none",)))
        result = run_turn(home, state.session_id, "Tell me about the weather.")
        assert result.outcome in ("ANSWERED", "STEP_LIMIT"), result.detail
    changed = root / "changed-model"
    shutil.copytree(home.root / "model", changed)
    weights = load_file(changed / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.weight"] *= 8.0
    save_file(weights, changed / "model.safetensors")
    with running_appliance(home, engine=changed, model="affidavit-tiny", clock=CLOCK):
        yield Diverged(home, state.session_id)


def test_in_a_browser_a_planted_divergence_is_highlighted_with_its_first_differing_bytes(
    diverged: Diverged,
    browser: Any,
    screenshots: Path,
    capsys: pytest.CaptureFixture[str],
    request: Any,
) -> None:
    _name_folder(screenshots, capsys, request)
    with running_panel(ApplianceSource(diverged.home)) as panel:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _open_turn(page, panel.url, diverged.session)
        page.click("#replay-button")
        page.wait_for_selector("#replay-summary", timeout=60_000)
        (line,) = page.locator("#replay-banner li").all_inner_texts()
        assert line.startswith("Replay of turn 0, step 0: prompt identical · injected clock ")
        assert "reply differs" in line and "first difference at byte" in line
        assert "DIFFERS" in page.inner_text("#replay-summary")
        differing = page.locator("article.step.differs")
        assert differing.count() == 1 and differing.get_attribute("id") == "step-0"
        sides = page.locator("#difference-0 > .cols pre")  # recorded, replayed
        assert sides.count() == 2
        recorded_mark, replayed_mark = page.locator("#difference-0 mark.first").all_inner_texts()
        assert recorded_mark != replayed_mark  # the first differing byte, marked in each
        byte = int(re.findall(r"at byte (\d+)", page.inner_text("#difference-0 h3"))[0])
        assert f"first difference at byte {byte}:" in line
        same = page.evaluate(
            "getComputedStyle(document.querySelector('.step.differs')).borderLeftColor"
        )
        banner = page.evaluate(
            "getComputedStyle(document.querySelector('#replay-banner li.differs')).backgroundColor"
        )
        assert same == "rgb(198, 40, 40)" and banner == "rgb(253, 236, 234)"  # the red ones
        page.screenshot(path=str(screenshots / "divergence-turn.png"), full_page=True)
        page.locator("#replay").screenshot(path=str(screenshots / "divergence-banner.png"))
        differing.screenshot(path=str(screenshots / "divergence-step.png"))
        page.close()


# -- the proof code, on its own: where an entry sits and whether its inclusion proof holds -------


def _proof_stream(tmp_path: Path) -> tuple[list[bytes], list[bytes], str]:
    """A real stream of 3 entries, a checkpoint signed after each: lines, notes, log key."""
    import sqlite3

    from record.digest import Domain, digest
    from record.log import Log
    from record.schema import TurnStarted
    from tests.record.raw_store import stored_lines

    store = tmp_path / "proof.db"
    with Log.open(store) as log:
        log.open_stream("proofs", [KeyPair.generate().recipient])
        for turn in (0, 1):
            data = b"turn %d" % turn
            log.append(
                "proofs",
                TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data)),
            )
        log_key = log.log_key()
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        notes = [bytes(n) for (n,) in conn.execute("SELECT note FROM checkpoints ORDER BY id")]
    finally:
        conn.close()
    return stored_lines(store, "proofs"), notes, log_key


def test_check_inclusion_verifies_a_proof_against_the_signed_root() -> None:
    from harness.panel.source import Position, check_inclusion
    from record import merkle
    from record.checkpoint import Checkpoint

    lines = [b"entry %d" % i for i in range(5)]
    leaves = [merkle.hash_leaf(line) for line in lines]
    cp = Checkpoint("o", 5, merkle.root(leaves))
    proof = merkle.inclusion_proof(2, leaves)
    pos = check_inclusion(Position("s", 2, 2, "?"), lines[2], proof, cp, "signed by k")
    assert pos.verified
    assert pos.detail == (
        "included in the checkpoint of 5 entries signed by k: 3 hashes lead from the leaf to its root"
    )
    assert (pos.leaf_hash, pos.checkpoint_size, pos.root) == (
        leaves[2].hex(),
        5,
        cp.root_hash.hex(),
    )
    assert pos.proof == [h.hex() for h in proof]
    wrong = check_inclusion(Position("s", 2, 2, "?"), b"changed", proof, cp, "signed by k")
    assert wrong.verified is False
    assert wrong.leaf_hash == merkle.hash_leaf(b"changed").hex()
    assert wrong.detail.startswith(
        "the proof does not verify against the signed root: calculated root "
    )
    assert wrong.detail.endswith(f"does not match expected root {cp.root_hash.hex()}")
    was_verified = Position("s", 2, 2, "?", verified=True)
    assert not check_inclusion(was_verified, b"changed", proof, cp, "signed by k").verified


def test_position_proves_inclusion_in_the_latest_checkpoint_it_reaches(tmp_path: Path) -> None:
    from harness.panel.source import StreamRecord
    from record import merkle
    from record.audit import Row

    lines, notes, log_key = _proof_stream(tmp_path)
    rows = [Row(line, seq, merkle.hash_leaf(line), "proof.db") for seq, line in enumerate(lines)]
    record = StreamRecord("proofs", rows, notes, log_key)
    pos = record.position(1)
    assert (pos.stream, pos.seq, pos.index, pos.leaf_hash) == (
        "proofs",
        1,
        1,
        merkle.hash_leaf(lines[1]).hex(),
    )
    assert pos.verified and pos.checkpoint_size == 3
    assert pos.root == merkle.root([merkle.hash_leaf(x) for x in lines]).hex()
    assert pos.detail.startswith("included in the checkpoint of 3 entries signed by ")
    # a checkpoint beyond the stored entries is not reached: the one of 2 is
    short = StreamRecord("proofs", rows[:2], notes, log_key).position(1)
    assert short.verified and short.checkpoint_size == 2
    # an entry after the latest checkpoint
    early = StreamRecord("proofs", rows, notes[:1], log_key).position(1)  # the first one after
    assert not early.verified and early.checkpoint_size == 1
    assert early.leaf_hash == merkle.hash_leaf(lines[1]).hex()
    assert early.detail == "not yet covered: the latest checkpoint covers 1 entries (seq 0 to 0)"
    # no checkpoint at all
    none = StreamRecord("proofs", rows, [], log_key).position(0)
    assert not none.verified and none.checkpoint_size is None
    assert none.leaf_hash == merkle.hash_leaf(lines[0]).hex()
    assert none.detail == "no checkpoint signed by the log key covers this stream yet"
    # a changed entry fails against the latest checkpoint, never an older one it still matches
    changed = list(rows)
    at = len(b'{"body":"')  # the first base64 digit of the sealed body
    flipped = lines[2][:at] + (b"B" if lines[2][at : at + 1] != b"B" else b"C") + lines[2][at + 1 :]
    changed[2] = Row(flipped, 2, None, "proof.db")
    failed = StreamRecord("proofs", changed, notes, log_key).position(2)
    assert not failed.verified and failed.checkpoint_size == 3
