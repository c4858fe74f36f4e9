"""Replay and verify jobs: each runs in its own thread; the pages read their progress.

A replay is ``harness.reexecute.reexecute_turn`` through the running appliance: each step's
verdict arrives as it is judged (``StepVerdict.line()`` is the banner line), then the
report's summary. A step whose reply differs gets the first differing bytes of the recorded
and the replayed reply, side by side. A verify is ``harness.reconstruct.reconstruct_turn``
over the bodies the panel read, then the stream's audit (checkpoint signatures, the tree at
every checkpoint, with the key every body's digests) and every inclusion proof of the turn.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.panel.source import Opened, Source, StreamRecord
from record.cli import counted
from record.schema import ModelRequest, ModelResponse, Strict

__all__ = ["Job", "Jobs", "run_replay", "run_verify", "side_by_side"]

Kind = Literal["replay", "verify"]
CONTEXT = 16  # bytes shown before the first difference
SPAN = 40  # bytes shown from it


@dataclass
class Job:
    id: str
    kind: Kind
    stream: str
    turn: int
    state: Literal["running", "done", "failed"] = "running"
    lines: list[str] = field(default_factory=list)  # the banner, as it grows
    marks: list[str] = field(default_factory=list)  # each line's look: same, differs or ""
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> verdict
    summary: str = ""
    ok: bool | None = None
    error: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    finished: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def json(self) -> dict[str, Any]:
        with self.lock:
            return {
                "id": self.id,
                "kind": self.kind,
                "stream": self.stream,
                "turn": self.turn,
                "state": self.state,
                "lines": list(self.lines),
                "marks": list(self.marks),
                "steps": {k: dict(v) for k, v in sorted(self.steps.items())},
                "summary": self.summary,
                "ok": self.ok,
                "error": self.error,
                "result": self.result,
            }


class Jobs:
    """The panel's jobs, by id; at most one running job per (kind, stream, turn)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str | None) -> Job | None:
        if not job_id:
            return None
        with self._lock:
            return self._jobs.get(job_id)

    def start(self, kind: Kind, stream: str, turn: int, work: Callable[[Job], None]) -> Job:
        with self._lock:
            for job in self._jobs.values():
                if (job.kind, job.stream, job.turn, job.state) == (kind, stream, turn, "running"):
                    return job
            job = Job(uuid.uuid4().hex, kind, stream, turn)
            self._jobs[job.id] = job

        def run() -> None:
            try:
                work(job)
                state: Literal["done", "failed"] = "done"
            except Exception as exc:
                with job.lock:
                    job.error = f"{type(exc).__name__}: {exc}"
                    job.ok = False
                traceback.print_exc()
                state = "failed"
            with job.lock:
                job.state, job.finished = state, time.time()

        threading.Thread(target=run, name=f"panel-{kind}-{job.id[:8]}", daemon=True).start()
        return job

    def wait(self, job: Job, timeout: float = 120.0) -> Job:
        """Block until the job ends (tests, and the JSON API's ``?wait=1``)."""
        deadline = time.monotonic() + timeout
        while job.state == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        return job


# -- side by side -------------------------------------------------------------------------------


def _first_char(data: bytes, at: int) -> int:
    """How many bytes from ``at`` make one UTF-8 character (1 when they make none)."""
    for n in range(1, 5):
        try:
            data[at : at + n].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return n
    return 1


def side_by_side(recorded: bytes, replayed: bytes) -> dict[str, Any]:
    """The first differing byte of two replies, and the bytes around it in each: ``before``
    (common), ``first`` (the character holding the first differing byte), ``rest``, ``after``."""
    from harness.panel.views import reply_parts

    at = next(
        (i for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)) if a != b),
        min(len(recorded), len(replayed)),
    )
    start = max(0, at - CONTEXT)

    def cut(data: bytes) -> dict[str, str]:
        n = _first_char(data, at)
        return {
            "before": data[start:at].decode("utf-8", "replace"),
            "first": data[at : at + n].decode("utf-8", "replace") or "(the reply ends here)",
            "rest": data[at + n : at + SPAN].decode("utf-8", "replace"),
            "after": data[at + SPAN : at + SPAN + CONTEXT].decode("utf-8", "replace"),
        }

    return {
        "byte": at,
        "recorded": cut(recorded),
        "replayed": cut(replayed),
        "recorded_reply": reply_parts(recorded)[0],
        "replayed_reply": reply_parts(replayed)[0],
    }


def _step_replies(bodies: list[tuple[int, Strict]], turn: int | None = None) -> dict[int, bytes]:
    """Each model step's reply bytes, by step number (of ``turn`` when given)."""
    asked: dict[int, int] = {}
    replies: dict[int, bytes] = {}
    for seq, body in bodies:
        if isinstance(body, ModelRequest) and (turn is None or body.turn == turn):
            asked[seq] = body.step if body.step is not None else len(asked)
        elif isinstance(body, ModelResponse) and body.request_seq in asked:
            replies[asked[body.request_seq]] = body.response_bytes or body.error_bytes or b""
    return replies


# -- replay ---------------------------------------------------------------------------------


def run_replay(job: Job, source: Source, opened: Opened) -> None:
    """Re-execute the job's turn through the running appliance, verdict by verdict."""
    from harness.reexecute import StepVerdict, reexecute_turn
    from harness.session import read_bodies

    assert source.home is not None, "a replay needs the appliance's state folder"

    def on_step(verdict: StepVerdict) -> None:
        same = verdict.prompt and verdict.clock and verdict.request and verdict.reply
        with job.lock:
            job.lines.append(verdict.line())
            job.marks.append("same" if same else "differs")
            job.steps[verdict.step] = {**verdict.json(), "line": verdict.line(), "identical": same}

    report = reexecute_turn(source.home, job.stream, job.turn, key=opened.key, on_step=on_step)
    differing = [s for s, v in job.steps.items() if not v["identical"]]
    if differing:
        store = source.home.appliance().store
        recorded = _step_replies(opened.strict(), job.turn)
        replayed = _step_replies(read_bodies(store, report.replay_stream, opened.key))
        for step in differing:
            if step in recorded and step in replayed:
                with job.lock:
                    job.steps[step]["side_by_side"] = side_by_side(recorded[step], replayed[step])
    with job.lock:
        job.summary = report.summary()
        job.ok = report.identical
        job.result = report.json()


# -- verify ---------------------------------------------------------------------------------


def run_verify(job: Job, source: Source, record: StreamRecord, opened: Opened) -> None:
    """Reconstruct the turn from the bodies read here, audit the stream, check its proofs."""
    from harness.reconstruct import reconstruct_turn
    from record.audit import audit_stream
    from record.bundle import verify_bundle

    def say(line: str, mark: str = "") -> None:
        with job.lock:
            job.lines.append(line)
            job.marks.append(mark)

    turn = job.turn
    say(f"Reconstructing turn {turn}: today's harness, re-driven from the record (no network)")
    report = reconstruct_turn(
        source.store_path(), job.stream, turn, opened.key, bodies=opened.strict()
    )
    for step in report.steps:
        word = "identical" if step["identical"] else "differs"
        say(
            f"Reconstruct turn {turn}, step {step['step']}: request {word} "
            f"(seq {step['request_seq']})",
            "same" if step["identical"] else "differs",
        )
    if report.ok:
        say(
            f"Turn {turn}: reconstructed exactly: {report.summary()}, byte for byte",
            "same",
        )
    else:
        d = report.difference
        assert d is not None
        say(
            f"Turn {turn}: reconstruction FAILED at step {d.step} (entry seq {d.seq}): {d.what}",
            "differs",
        )
        if d.diff:
            say(d.diff.rstrip(), "differs")
    if source.mode == "bundle":
        audit = verify_bundle(source.store_path(), key=opened.key)
        problems = audit.problems
        where = "the bundle"
    else:
        kept = [(f"kept checkpoint #{i}", note) for i, note in enumerate(record.kept)]
        notes = [(f"checkpoint #{i}", note) for i, note in enumerate(record.notes)]
        problems = audit_stream(
            job.stream, record.rows, notes, record.log_key, key=opened.key, kept=kept
        )
        where = f"stream {job.stream}"
    anchor = record.anchor()
    if problems:
        say(f"Audit of {where}: {counted(len(problems), 'problem')}", "differs")
        for p in problems[:20]:
            say(f"  {p.code} (seq {p.seq}): {p.detail}", "differs")
    else:
        covered = (
            f"the latest covers {counted(anchor[0].size, 'entry', 'entries')}"
            if anchor
            else "none yet"
        )
        say(
            f"Audit of {where}: {counted(len(record.rows), 'entry', 'entries')}, "
            f"{counted(len(record.notes), 'checkpoint')} "
            f"signed by the log key ({covered}), {counted(len(record.kept), 'kept checkpoint')} consistent "
            "with them, every body opened and every digest recomputed: no problem",
            "same",
        )
    proven, unproven, failed = _proofs(record, opened, turn)
    say(
        f"Inclusion proofs of turn {turn}: {counted(proven, 'entry', 'entries')} proven in the latest checkpoint"
        + (f", {unproven} not yet covered by a checkpoint" if unproven else "")
        + (f", {failed} FAILED" if failed else ""),
        "differs" if failed else "same",
    )
    ok = report.ok and not problems and not failed
    with job.lock:
        job.ok = ok
        job.summary = (
            f"Turn {turn} of {job.stream}: verified: reconstruction exact, record consistent, "
            f"{proven} inclusion proofs verified"
            if ok
            else f"Turn {turn} of {job.stream}: verification FAILED"
        )
        job.result = {
            "reconstruct": report.json(),
            "problems": [p.__dict__ for p in problems],
            "proofs": {"verified": proven, "not_covered": unproven, "failed": failed},
        }


def _proofs(record: StreamRecord, opened: Opened, turn: int) -> tuple[int, int, int]:
    from harness.panel.views import NoTurn, turn_view

    try:
        view = turn_view(record, opened, turn)
    except NoTurn:
        return 0, 0, 0
    positions = [view.started]
    for step in view.steps:
        positions.append(step.request_at)
        if step.response_at:
            positions.append(step.response_at)
        for tool in step.tools:
            if tool.kind == "unsent":
                continue  # its position is the reply that asked for it, counted above
            positions.append(tool.call)
            if tool.answer:
                positions.append(tool.answer)
    if view.ended_at:
        positions.append(view.ended_at)
    proven = sum(p.verified for p in positions)
    unproven = sum(p.checkpoint_size is None or p.index >= p.checkpoint_size for p in positions)
    return proven, unproven, len(positions) - proven - unproven
