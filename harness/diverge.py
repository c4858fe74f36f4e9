"""``affidavit diverge``: the weekly divergence run over recent turns of the record.

It picks turns from the running appliance's record store: every turn that has a
``turn.started`` and a ``turn.ended``, in a stream that is not itself a replay (a stream whose
``stream.opened`` labels carry ``affidavit/replays``), started at or after ``--since`` or among
the ``--last N`` most recent (default 10). For each one:

1. **Reconstruct** (``harness.reconstruct``): today's harness code, re-driven with the recorded
   replies and tool results, must regenerate every recorded request and the final answer byte
   for byte. Any difference is a failure: exit 1 and a page.
2. **Re-execute** (``harness.reexecute``) through the live proxy against the pinned engine,
   tools served from the record. For a turn pinned with strict cache a reply that differs
   counts as a divergent turn; divergence fails the run (exit 1 and a page) only when the
   count exceeds ``--max-divergence`` (not given: divergence is reported, never fails). A turn
   not pinned with strict cache (say, recorded against a third-party provider whose replies
   are not a pure function of the request) is re-executed too, and its verdict is information
   only: it never changes the exit code. A re-execution of a strict-cache turn that could not
   run at all (an error, not a verdict) is a failure.

A page (``--webhook URL``) is one JSON POST for the whole run, only when something failed. A
page that cannot be delivered is itself a problem (exit 1), reported on stderr. The page
carries stream ids, turn and step numbers, record seqs and a short description, never a
body's content (bodies stay sealed).

With ``--reconstruct-only`` only step 1 runs: it reads the home's store (``appliance.json``
names it while ``up`` runs, else ``record.db`` in the home) and needs no running appliance.

Exit codes: 0 fine, 1 a problem was found, 2 usage error, 3 something it needs is missing
(no appliance, store, key file or control socket).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.state import Home, HomeMissing
from record.audit import Row, check_stream
from record.backends import store_exists
from record.cli import (
    EXIT_MISSING,
    EXIT_OK,
    EXIT_PROBLEM,
    UsageError,
    counted,
    home_log_key,
    home_store,
    report_error,
)
from record.schema import Strict
from record.seal import KeyPair
from record.store import LogStore

__all__ = [
    "DEFAULT_LAST",
    "DivergenceRun",
    "Failure",
    "Selection",
    "TurnCheck",
    "TurnRef",
    "check_turn",
    "diverge",
    "page",
    "parse_since",
    "register",
    "run_divergence",
    "select_turns",
    "send_page",
]

DEFAULT_LAST = 10
WEBHOOK_TIMEOUT_S = 10.0
#: The longest description a page carries per failure (the rest is on the host's output).
MAX_WHAT = 300

Progress = Callable[[str], None]


# -- choosing turns -----------------------------------------------------------------------


@dataclass(frozen=True)
class TurnRef:
    """One finished turn of the record, chosen for a check."""

    stream: str
    turn: int
    started_seq: int
    started_at: datetime


@dataclass
class Selection:
    turns: list[TurnRef] = field(default_factory=list)
    #: (stream, why) for streams that had candidate turns but could not be read with the key
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: (stream, what) for streams sealed to the key whose bodies could not be opened
    unreadable: list[tuple[str, str]] = field(default_factory=list)


def parse_since(text: str) -> datetime:
    """``--since``: a date (``2025-06-01``, midnight UTC) or an RFC 3339 time with its offset
    (``2025-06-01T08:00:00Z``, ``…+02:00``). ``UsageError`` for anything else."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--since {text!r} is neither a date (2025-06-01) nor an RFC 3339 time"
            " (2025-06-01T08:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"--since {text!r} has no UTC offset: add Z or ±hh:mm (RFC 3339)")
    return moment.astimezone(UTC)


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@dataclass
class _Scanned:
    """What a stream's cleartext says: its labels, whether the key opens it, its starts."""

    labels: dict[str, str]
    sealed_to_key: bool
    starts: list[tuple[int, datetime]]  # (seq, occurred_at) of each turn.started
    opened_by: str | None = None  # on a shared store, the log key of another appliance
    unverified: str | None = None  # on a shared store, why this appliance's key does not vouch


def _scan(
    store_path: Path | str, key: KeyPair, own_log_key: str | None = None
) -> dict[str, _Scanned]:
    """Every stream's labels, recipients and ``turn.started`` envelopes, without opening a
    body (``stream.opened`` and ``key.rotated`` are clear; the rest is read from envelopes).
    On a store several appliances share, a stream another log key opened is marked with it:
    ``own_log_key`` is this home's appliance's."""
    from record.backends import open_store
    from record.schema import KeyRotated, StreamOpened, parse_body, parse_entry

    if not store_exists(store_path):
        raise HomeMissing(f"record store {store_path} does not exist")
    mine = key.recipient.text()
    scanned: dict[str, _Scanned] = {}
    store = open_store(store_path, readonly=True)
    try:
        vouch = store.shared and bool(own_log_key)
        for stream in store.streams():
            found = _Scanned({}, False, [])
            rows: list[Row] = []  # kept only where the audit below needs them
            for stored in store.entries(stream):
                if vouch:
                    rows.append(Row(stored.line, stored.seq, stored.leaf_hash))
                entry = parse_entry(stored.line)
                if entry.kind == "turn.started":
                    found.starts.append((entry.seq, _timestamp(entry.occurred_at)))
                elif isinstance(entry.body, dict):
                    body = parse_body(entry.kind, entry.body, stored=True)
                    if isinstance(body, StreamOpened):
                        found.labels = dict(body.labels)
                        if store.shared and own_log_key and body.log_key != own_log_key:
                            found.opened_by = body.log_key
                            break  # another appliance's: its turns are not read at all
                    if isinstance(body, StreamOpened | KeyRotated) and any(
                        w.recipient == mine for w in body.recipients
                    ):
                        found.sealed_to_key = True
            if vouch and found.opened_by is None and own_log_key:
                found.unverified = _unvouched(store, stream, rows, own_log_key)
            scanned[stream] = found
    finally:
        store.close()
    return scanned


def _unvouched(store: LogStore, stream: str, rows: list[Row], own_log_key: str) -> str | None:
    """Why a stream of a shared store that names this appliance's log key is not vouched
    for by it (None: it is): its opening only claims the key, which is public, so the
    stream must pass the audit (``record.audit.check_stream``) against that key, every entry
    covered by a checkpoint it signed."""
    notes = [(f"checkpoint #{i}", c.note) for i, c in enumerate(store.checkpoints(stream))]
    audit = check_stream(stream, rows, notes, own_log_key)
    if audit.entries and not audit.covered:
        return "it claims this appliance's log key, but no checkpoint of it is signed by that key"
    if audit.unsigned:
        return (
            f"this appliance's latest signed checkpoint covers {audit.covered} of its "
            f"{audit.entries} entries"
        )
    if audit.problems:
        first = audit.problems[0]
        return (
            f"its audit against this appliance's log key finds {counted(len(audit.problems), 'problem')}"
            f" (first: {first.code}: {first.detail})"
        )
    return None


def select_turns(
    store_path: Path | str,
    key: KeyPair,
    *,
    since: datetime | None = None,
    last: int | None = None,
    own_log_key: str | None = None,
) -> Selection:
    """The finished, non-replay turns started at or after ``since``, or else the ``last``
    most recent (default :data:`DEFAULT_LAST`), oldest first. Bodies are opened only for
    streams that hold a candidate, newest first, and only until ``last`` turns are found.
    On a shared store, only streams ``own_log_key`` opened: another appliance checks its own,
    and a stream someone put in the database under another key is no turn of ours."""
    from harness.reexecute import LABEL_REPLAYS
    from harness.session import read_bodies, turn_states
    from record.errors import RecordError

    if since is not None and last is not None:
        raise UsageError("--since and --last choose turns two different ways: give one")
    limit = None if since is not None else (last if last is not None else DEFAULT_LAST)
    scanned = _scan(store_path, key, own_log_key)
    candidates = sorted(
        (
            (at, stream, seq)
            for stream, info in scanned.items()
            if LABEL_REPLAYS not in info.labels
            and info.opened_by is None
            and info.unverified is None
            for seq, at in info.starts
            if since is None or at >= since
        ),
        key=lambda c: (c[0], c[1], c[2]),
        reverse=True,
    )
    selection = Selection()
    for stream, info in scanned.items():
        if info.opened_by is not None:  # named, though none of its turns were even read
            selection.skipped.append(
                (stream, f"opened by another appliance's log key {info.opened_by}")
            )
        elif info.unverified is not None:
            selection.skipped.append((stream, info.unverified))
    states: dict[str, dict[int, Any] | None] = {}
    for at, stream, seq in candidates:
        if limit is not None and len(selection.turns) >= limit:
            break
        if stream not in states:
            if not scanned[stream].sealed_to_key:
                selection.skipped.append((stream, "not sealed to this key"))
                states[stream] = None
                continue
            try:
                bodies = read_bodies(store_path, stream, key)
            except RecordError as exc:
                selection.unreadable.append((stream, f"{type(exc).__name__}: {exc}"))
                states[stream] = None
                continue
            states[stream] = {s.started_seq: s for s in turn_states(bodies)}
        by_seq = states[stream]
        state = by_seq.get(seq) if by_seq is not None else None
        if state is not None and state.ended is not None:
            selection.turns.append(TurnRef(stream, state.turn, seq, at))
    selection.turns.sort(key=lambda t: (t.started_at, t.stream, t.turn))
    return selection


# -- checking one turn ------------------------------------------------------------------------


@dataclass
class TurnCheck:
    """What the run found for one turn."""

    ref: TurnRef
    strict_cache: bool = False
    reconstruct_ok: bool = False
    reconstruct: dict[str, Any] | None = None  # ReconstructReport.json(), or None on error
    reconstruct_error: str | None = None
    difference: dict[str, Any] | None = None  # {"step", "seq", "what"} when it failed
    reexecute: dict[str, Any] | None = None  # ReexecuteReport.json(), or None on error
    reexecute_error: str | None = None
    seconds: float = 0.0

    @property
    def information_only(self) -> bool:
        return not self.strict_cache

    @property
    def divergent(self) -> bool:
        """A strict-cache turn whose re-execution ran and was not identical."""
        return self.strict_cache and self.reexecute is not None and not self.reexecute["identical"]

    def steps_identical(self) -> tuple[int, int]:
        """(identical steps, recorded steps) of the re-execution."""
        if self.reexecute is None:
            return 0, 0
        same = sum(
            all(s[k] == "identical" for k in ("prompt", "clock", "request", "reply"))
            for s in self.reexecute["steps"]
        )
        return same, int(self.reexecute["recorded_steps"])

    def first_divergent_step(self) -> int | None:
        if self.reexecute is None:
            return None
        for s in self.reexecute["steps"]:
            if not all(s[k] == "identical" for k in ("prompt", "clock", "request", "reply")):
                return int(s["step"])
        return len(self.reexecute["steps"])

    def line(self) -> str:
        ref = self.ref
        if self.reconstruct_ok:
            rec = "reconstruct ok"
        else:
            d = self.difference or {}
            rec = f"reconstruct FAILED (step {d.get('step')}, seq {d.get('seq')}: {d.get('what')})"
        if self.reexecute_error is not None:
            rex = f"re-execute ERROR ({self.reexecute_error})"
        elif self.reexecute is None:
            rex = "re-execute not run (--reconstruct-only)"
        else:
            same, steps = self.steps_identical()
            identical = self.reexecute is not None and self.reexecute["identical"]
            verdict = "identical" if identical else f"differs ({same} of {steps} steps identical)"
            if self.information_only:
                rex = f"re-execute information only: {verdict} (not pinned with strict cache)"
            else:
                rex = f"re-execute {verdict}"
        return f"{ref.stream} turn {ref.turn}: {rec} · {rex}"

    def json(self) -> dict[str, Any]:
        same, steps = self.steps_identical()
        if self.reexecute_error is not None:
            verdict = "error"
        elif self.reexecute is None:
            verdict = "not run"
        else:
            verdict = "identical" if self.reexecute["identical"] else "differs"
        return {
            "stream": self.ref.stream,
            "turn": self.ref.turn,
            "started_seq": self.ref.started_seq,
            "started_at": _rfc3339(self.ref.started_at),
            "strict_cache": self.strict_cache,
            "reconstruct": {
                "ok": self.reconstruct_ok,
                "difference": self.difference,
                "error": self.reconstruct_error,
                "report": self.reconstruct,
            },
            "reexecute": {
                "verdict": verdict,
                "information_only": self.information_only,
                "divergent": self.divergent,
                "steps_identical": same,
                "steps": steps,
                "error": self.reexecute_error,
                "report": self.reexecute,
            },
            "seconds": round(self.seconds, 3),
        }


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def check_turn(
    home: Home,
    store_path: Path | str,
    ref: TurnRef,
    key: KeyPair,
    *,
    progress: Progress | None = None,
    reexecute: bool = True,
) -> TurnCheck:
    """Reconstruct then re-execute one turn (``reexecute=False``: reconstruct only, which
    needs no appliance). An error inside either is caught and reported in the check (a
    failure); ``HomeMissing`` (the appliance went away) propagates."""
    from harness.reconstruct import reconstruct_turn
    from harness.reexecute import pins_before, reexecute_turn
    from harness.session import read_bodies

    say = progress or (lambda _: None)
    started = time.monotonic()
    check = TurnCheck(ref)
    bodies: list[tuple[int, Strict]] = read_bodies(store_path, ref.stream, key)
    pins = pins_before(bodies, ref.turn) or {}
    check.strict_cache = pins.get("strict_cache") is True
    say("reconstructing")
    try:
        report = reconstruct_turn(store_path, ref.stream, ref.turn, key)
    except HomeMissing:
        raise
    except Exception as exc:
        check.reconstruct_error = _error(exc)
        check.difference = {"step": None, "seq": None, "what": f"error: {_error(exc)}"}
    else:
        check.reconstruct = report.json()
        check.reconstruct_ok = report.ok
        if not report.ok:
            d = report.difference
            check.difference = {
                "step": d.step if d else None,
                "seq": d.seq if d else None,
                "what": d.what if d else "the reconstruction did not finish",
            }
    if not reexecute:
        check.seconds = time.monotonic() - started
        return check
    say("re-executing" + ("" if check.strict_cache else " (information only)"))
    try:
        rerun = reexecute_turn(home, ref.stream, ref.turn, key=key)
    except HomeMissing:
        raise
    except Exception as exc:
        check.reexecute_error = _error(exc)
    else:
        check.reexecute = rerun.json()
    check.seconds = time.monotonic() - started
    return check


# -- the whole run ------------------------------------------------------------------------------


@dataclass
class Failure:
    """One thing a page names."""

    stream: str
    turn: int | None
    step: int | None
    seq: int | None
    what: str

    def json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "turn": self.turn,
            "step": self.step,
            "seq": self.seq,
            "what": self.what[:MAX_WHAT],
        }


@dataclass
class DivergenceRun:
    checks: list[TurnCheck]
    max_divergence: int | None
    selection: Selection
    page_error: str | None = None
    page_sent: bool = False

    @property
    def reconstruct_failures(self) -> int:
        return sum(not c.reconstruct_ok for c in self.checks)

    @property
    def divergent(self) -> int:
        return sum(c.divergent for c in self.checks)

    @property
    def strict_turns(self) -> int:
        return sum(c.strict_cache for c in self.checks)

    @property
    def reexecute_errors(self) -> int:
        return sum(c.strict_cache and c.reexecute_error is not None for c in self.checks)

    @property
    def divergence_exceeded(self) -> bool:
        return self.max_divergence is not None and self.divergent > self.max_divergence

    @property
    def problem(self) -> bool:
        """Something a person must look at (the page's trigger)."""
        return bool(
            self.reconstruct_failures
            or self.reexecute_errors
            or self.divergence_exceeded
            or self.selection.unreadable
        )

    @property
    def ok(self) -> bool:
        return not self.problem and self.page_error is None

    def failures(self) -> list[Failure]:
        found: list[Failure] = []
        for stream, what in self.selection.unreadable:
            found.append(Failure(stream, None, None, None, f"cannot read the stream: {what}"))
        for c in self.checks:
            ref = c.ref
            if not c.reconstruct_ok:
                d = c.difference or {}
                found.append(
                    Failure(
                        ref.stream,
                        ref.turn,
                        d.get("step"),
                        d.get("seq"),
                        f"reconstruct failed: {d.get('what')}",
                    )
                )
            if c.strict_cache and c.reexecute_error is not None:
                found.append(
                    Failure(
                        ref.stream, ref.turn, None, None, f"re-execute error: {c.reexecute_error}"
                    )
                )
            if self.divergence_exceeded and c.divergent:
                step = c.first_divergent_step()
                same, steps = c.steps_identical()
                found.append(
                    Failure(
                        ref.stream,
                        ref.turn,
                        step,
                        _recorded_request_seq(c, step),
                        f"re-execute differs: {same} of {steps} steps identical"
                        f" (replay stream {(c.reexecute or {}).get('replay_stream')})",
                    )
                )
        return found

    def summary(self) -> str:
        cap = "no maximum" if self.max_divergence is None else f"maximum {self.max_divergence}"
        info = len(self.checks) - self.strict_turns
        reexecuted = any(c.reexecute is not None or c.reexecute_error for c in self.checks)
        text = (
            f"{len(self.checks)} turn{'' if len(self.checks) == 1 else 's'} checked: "
            f"{self.reconstruct_failures} reconstruction failure"
            f"{'' if self.reconstruct_failures == 1 else 's'}, "
            + (
                f"{self.divergent} of {self.strict_turns} strict-cache re-execution"
                f"{'' if self.strict_turns == 1 else 's'} divergent ({cap}), "
                f"{info} information only"
                if reexecuted or not self.checks
                else "re-execution not run (--reconstruct-only)"
            )
        )
        if self.reexecute_errors:
            text += f", {counted(self.reexecute_errors, 're-execution error')}"
        if self.selection.skipped:
            skipped = counted(len(self.selection.skipped), "stream")
            text += f"; {skipped} not sealed to this key skipped"
        if self.selection.unreadable:
            text += f"; {counted(len(self.selection.unreadable), 'stream')} could not be read"
        return text + (": ok" if self.ok else ": PROBLEM")

    def json(self) -> dict[str, Any]:
        return {
            "turns": [c.json() for c in self.checks],
            "reconstruct_failures": self.reconstruct_failures,
            "divergent": self.divergent,
            "strict_cache_turns": self.strict_turns,
            "reexecute_errors": self.reexecute_errors,
            "max_divergence": self.max_divergence,
            "skipped": [{"stream": s, "why": w} for s, w in self.selection.skipped],
            "unreadable": [{"stream": s, "what": w} for s, w in self.selection.unreadable],
            "failures": [f.json() for f in self.failures()],
            "page": {"sent": self.page_sent, "error": self.page_error},
            "ok": self.ok,
        }


def _recorded_request_seq(check: TurnCheck, step: int | None) -> int | None:
    steps = (check.reconstruct or {}).get("steps") or []
    if step is None or step >= len(steps):
        return None
    seq = steps[step].get("request_seq")
    return seq if isinstance(seq, int) else None


def run_divergence(
    home: Home,
    key: KeyPair,
    *,
    since: datetime | None = None,
    last: int | None = None,
    max_divergence: int | None = None,
    progress: Progress | None = None,
    reexecute: bool = True,
) -> DivergenceRun:
    """Select turns from the home's store and check each one (``reexecute=False``: the
    reconstruction pass only, which reads the store with no appliance running)."""
    say = progress or (lambda _: None)
    store = home_store(home.root)
    own = home_log_key(home.root)
    selection = select_turns(store, key, since=since, last=last, own_log_key=own)
    for stream, why in selection.skipped:
        say(f"skipping stream {stream}: {why}")
    for stream, what in selection.unreadable:
        say(f"stream {stream} cannot be read: {what}")
    checks: list[TurnCheck] = []
    total = len(selection.turns)
    for index, ref in enumerate(selection.turns, 1):
        prefix = f"[{index}/{total}] {ref.stream} turn {ref.turn}"

        def step_note(what: str, prefix: str = prefix) -> None:
            say(f"{prefix}: {what}")

        check = check_turn(home, store, ref, key, progress=step_note, reexecute=reexecute)
        say(f"{prefix}: done in {check.seconds:.1f} s")
        checks.append(check)
    return DivergenceRun(checks, max_divergence, selection)


# -- paging a person ---------------------------------------------------------------------------


def _rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def page(run: DivergenceRun, host: str | None = None) -> dict[str, Any]:
    """The JSON page for a run that found a problem."""
    host = host or socket.gethostname()
    failures = run.failures()
    reasons = []
    if run.reconstruct_failures:
        n = run.reconstruct_failures
        reasons.append(f"{n} reconstruction failure{'' if n == 1 else 's'}")
    if run.divergence_exceeded:
        reasons.append(f"{run.divergent} divergent turns (maximum {run.max_divergence})")
    if run.reexecute_errors:
        reasons.append(counted(run.reexecute_errors, "re-execution error"))
    if run.selection.unreadable:
        reasons.append(counted(len(run.selection.unreadable), "unreadable stream"))
    title = f"affidavit diverge on {host}: " + ", ".join(reasons or ["a problem"])
    lines = [
        f"{f.stream} turn {f.turn}, step {f.step}, seq {f.seq}: {f.what[:MAX_WHAT]}"
        for f in failures
    ]
    return {
        "title": title,
        "text": "\n".join([*lines, run.summary()]),
        "failures": [f.json() for f in failures],
        "host": host,
        "at": _rfc3339(),
    }


def send_page(url: str, body: dict[str, Any], *, timeout: float = WEBHOOK_TIMEOUT_S) -> None:
    """POST ``body`` to ``url``; ``OSError`` with a plain message if it was not delivered."""
    import httpx

    try:
        answer = httpx.post(url, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise OSError(f"{type(exc).__name__}: {exc or 'no answer'}") from None
    if not 200 <= answer.status_code < 300:
        raise OSError(f"the webhook answered {answer.status_code} {answer.reason_phrase}")


# -- the command ---------------------------------------------------------------------------------


def _check_webhook(url: str | None) -> None:
    if url is None:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--webhook {url!r} is not an http(s) URL")


def _read_key(home: Home, path: Path | None) -> KeyPair:
    from harness.session import user_key

    try:
        return user_key(home, path)
    except ValueError as exc:
        raise UsageError(f"--key {path}: {exc}") from None


def diverge(
    *,
    since: str | None = None,
    last: int | None = None,
    as_json: bool = False,
    webhook: str | None = None,
    max_divergence: int | None = None,
    home: Path | None = None,
    key: Path | None = None,
    reconstruct_only: bool = False,
    out: Any = None,
    err: Any = None,
) -> int:
    """The command's body: runs, prints, pages; returns the exit code (errors raise)."""
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    if since is not None and last is not None:
        raise UsageError("--since and --last choose turns two different ways: give one")
    since_at = parse_since(since) if since is not None else None
    _check_webhook(webhook)
    state = Home.at(home)
    if reconstruct_only:  # the record alone: a missing store must not make a user.key
        if not store_exists(home_store(state.root)):
            raise HomeMissing(f"record store {home_store(state.root)} does not exist")
    else:
        try:
            state.appliance()  # before the key: a missing appliance must not make a user.key
        except HomeMissing as exc:
            raise HomeMissing(
                f"{exc}; or check the record alone with `affidavit diverge --reconstruct-only`"
            ) from None
    opener = _read_key(state, key)

    def progress(line: str) -> None:
        print(f"diverge: {line}", file=stderr, flush=True)

    run = run_divergence(
        state,
        opener,
        since=since_at,
        last=last,
        max_divergence=max_divergence,
        progress=progress,
        reexecute=not reconstruct_only,
    )
    if run.problem and webhook is not None:
        try:
            send_page(webhook, page(run))
            run.page_sent = True
        except OSError as exc:
            run.page_error = str(exc)
            print(f"affidavit: the page could not be sent to {webhook}: {exc}", file=stderr)
    if as_json:
        print(json.dumps(run.json(), indent=2, sort_keys=True), file=stdout)
    else:
        if not run.checks:
            print("no finished turns to check", file=stdout)
        for check in run.checks:
            print(check.line(), file=stdout)
        for stream, what in run.selection.unreadable:
            print(f"{stream}: cannot read the stream ({what})", file=stdout)
        print(run.summary(), file=stdout)
    return EXIT_OK if run.ok else EXIT_PROBLEM


def _command(
    since: Annotated[
        str | None,
        typer.Option(
            help="check turns started at or after this date (2025-06-01) or RFC 3339 time"
        ),
    ] = None,
    last: Annotated[
        int | None,
        typer.Option(min=1, help=f"check the N most recent turns (default {DEFAULT_LAST})"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    webhook: Annotated[
        str | None,
        typer.Option(help="POST a JSON page here when a check fails (timeout 10 s)"),
    ] = None,
    max_divergence: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="fail when more strict-cache turns than this diverge on re-execution"
            " (default: divergence is reported, never fails)",
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(help="the state folder (default: $AFFIDAVIT_HOME, else .affidavit)"),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(help="the key that opens the record (default: the state folder's user.key)"),
    ] = None,
    reconstruct_only: Annotated[
        bool,
        typer.Option(
            "--reconstruct-only",
            help="only the reconstruction pass: reads the home's store, needs no running appliance",
        ),
    ] = False,
) -> None:
    """Reconstruct and re-execute recent turns; page a person when one fails."""
    code = _run(
        lambda: diverge(
            since=since,
            last=last,
            as_json=as_json,
            webhook=webhook,
            max_divergence=max_divergence,
            home=home,
            key=key,
            reconstruct_only=reconstruct_only,
        )
    )
    if code != EXIT_OK:
        raise typer.Exit(code)


def _run(body: Callable[[], int]) -> int:
    try:
        return body()
    except HomeMissing as exc:
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except Exception as exc:
        code = report_error(exc)
        if code is None:
            raise
        return code


def register(app: typer.Typer) -> None:
    """Add ``affidavit diverge`` to ``app``."""
    app.command("diverge")(_command)
