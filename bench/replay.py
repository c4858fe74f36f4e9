"""Replay cost: reconstructing a recorded turn from the record, and re-executing it.

Run from the repository root::

    .venv/bin/python bench/replay.py            # full run, about 30 s on 2 cores
    .venv/bin/python bench/replay.py --quick    # smoke run, under 10 s

One process runs the whole appliance on loopback, as ``affidavit up`` does
(``harness.up.running_appliance``: the random tiny model behind the embedded engine, the
egress proxy writing the record, its control plane on a Unix socket), with a loopback page
server (a raw ASGI app under uvicorn) as the search endpoint. For each turn length N (1, 2,
4 and 10 model steps; ``--quick``: 1, 2 and 4) it opens pinned sessions
(``harness.session.open_session``: seed 42, temperature 0.7, top_p 0.95, strict cache;
the proxy injects a fixed clock, ``--live-clock`` the system's) whose turn policy forces a tool call on each of the first N - 1 steps and forbids one on
the last, so a turn is N model steps and N - 1 tool calls through the proxy. Per session:

- ``original``: one live turn (``harness.session.run_turn``), timed: model calls to the
  engine through the proxy, tool calls through the proxy's fetch endpoint, every entry
  sealed and durably committed. The steps it really made are counted (a turn that ends
  early is said in the table, with its outcome: a figure for fewer steps is not one for N).
- ``re-execute``: ``harness.reexecute.reexecute_turn`` of that turn right after it (the
  engine decodes every step again; the proxy judges each reply and serves the tools from
  the record), timed. It must be ``identical``. Its ratio is paired: each re-execution
  over the original turn it replays, then the median.
- ``reconstruct``: ``harness.reconstruct.reconstruct_turn`` of that turn (no network, no
  engine, no writes: the record answers), repeated; it must be ``ok``. Reported per turn and
  per step made, as the median over every sample of every session of that length (and the
  fastest sample, ``best``: on a shared machine it shows what contention added). The
  reconstructions run once the appliance is stopped, from the store file, as ``affidavit
  replay --reconstruct`` does: no engine or proxy thread competes for the GIL.
- where the reconstruction's time goes: more reconstructions with probes around the parts
  of ``reconstruct_turn`` (each part's own time, nested probes subtracted): reading the
  stream (``read_bodies``: the SQLite read and line parse; unwrapping the data key; AEAD
  opening; validating the bodies), ``turn_setup``, building the in-process pipeline,
  making the SDK client, serving each model step from the record (the proxy's pipeline),
  answering each tool call from the record, the ``openai`` SDK's request-params transform
  and its stream parsing (``harness.model_api._collect_openai``), and the rest (the agent loop, the
  SDK's request building and sending). The probes add about a microsecond a call; the
  headline figures come from runs without them.

Two departures from the plainest policy, both to measure what is meant. The forced steps
name ``web_search`` (``--tool-choice required`` lets the model choose): with random weights
the tiny model's ``web_fetch`` URLs are mostly not URLs, refused (400) before anything is
recorded, and a well-formed one would be dialled wherever it points; a search always goes
to the loopback page server and is recorded. ``max_tokens`` is 96 (``--max-tokens``): the
call framing is about 21 tokens and the argument may be 48 characters, so at 48 nearly
every forced call is cut, and the turn ends there (``FAILED``: a cut forced call).

Goal: a 10-step turn reconstructed in <= 10 ms. Before anything is timed, one turn is
recorded and re-executed, and later reconstructed, untimed (imports, the engine's first
decode, the control-plane channel, the SDK's first request). It prints one table, the breakdown table and, last, one line of
JSON holding every figure. It exits 0 whenever it ran (a failed reconstruction or a
re-execution that is not identical stops it with an error: then nothing was measured).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from target import Target

from harness.agent import TurnPolicy, TurnResult
from harness.reconstruct import reconstruct_turn
from harness.reexecute import reexecute_turn
from harness.session import open_session, read_bodies, run_turn
from harness.state import Home
from harness.up import TINY_MODEL, _serve, running_appliance
from record.seal import KeyPair

GOAL_10_STEP_MS = 10.0  # reconstruct a 10-step turn in at most this
PINS: dict[str, Any] = {
    "seed": 42,
    "temperature": 0.7,
    "top_p": 0.95,
    "max_tokens": 96,
    "strict_cache": True,
}
SEARCH: dict[str, Any] = {"type": "function", "function": {"name": "web_search"}}
#: The instant the proxy injects into every prompt (``--live-clock``: the system clock). Fixed,
#: the tiny model's turns depend on nothing else, so runs on different days do the same work.
CLOCK = "2026-07-22T09:30:00Z"
QUESTION = "Search the web for the river stone, then say what you found."
PAGE = (
    b"<html><head><title>River stone</title></head><body><p>The river stone sits by the old "
    b"city wall. This page was served on 127.0.0.1.</p></body></html>\n"
)


@dataclass(frozen=True)
class Plan:
    steps: tuple[int, ...]  # the turn lengths measured
    turns: int  # sessions recorded per length (each re-executed once)
    reconstructs: int  # timed reconstructions of each session
    probes: int  # instrumented reconstructions of each session (the breakdown)


FULL = Plan(steps=(1, 2, 4, 10), turns=5, reconstructs=9, probes=3)
QUICK = Plan(steps=(1, 2, 4), turns=1, reconstructs=3, probes=2)


# -- the page server -----------------------------------------------------------------------------


async def page_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
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


# -- probes: where one reconstruction's time goes ------------------------------------------------

#: (module, attribute path, part). Each part's own time: a probed call inside another probed
#: call is taken out of the outer one's figure. Missing attributes are skipped (``None``).
PROBES: tuple[tuple[str, str, str], ...] = (
    ("harness.reconstruct", "read_bodies", "read_bodies: sqlite + lines"),
    ("record.reader", "StreamKeys.collect", "read_bodies: unwrap key"),
    ("record.reader", "open_sealed", "read_bodies: aead open"),
    ("record.reader", "parse_body", "read_bodies: validate bodies"),
    ("harness.reconstruct", "turn_setup", "turn_setup"),
    ("egress_proxy.replay", "reconstruct_pipeline", "pipeline build"),
    ("httpx2", "Client.__init__", "client setup"),
    ("openai", "OpenAI.__init__", "client setup"),
    ("harness.reconstruct", "_PipelineTransport.handle_request", "model steps (pipeline)"),
    ("harness.reconstruct", "RecordToolbox.call", "tool calls (record)"),
    ("openai.resources.chat.completions.completions", "maybe_transform", "sdk: request params"),
    ("harness.model_api", "_collect_openai", "sdk: stream parsing"),
)
READ_PARTS = tuple(part for _, _, part in PROBES if part.startswith("read_bodies"))
REST = "rest: agent loop, sdk send"
PARTS = (*dict.fromkeys(part for _, _, part in PROBES), REST)


class Probe:
    """Accumulates each part's own time while installed."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.missing: list[str] = []
        self._children: list[float] = []  # per open probed call: its probed callees' time

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._children.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                inner = self._children.pop()
                self.own[part] = self.own.get(part, 0.0) + elapsed - inner
                if self._children:
                    self._children[-1] += elapsed

        return wrapper

    @contextmanager
    def installed(self) -> Iterator[Probe]:
        self.missing = []
        with ExitStack() as undo:
            for module_name, path, part in PROBES:
                *outer, name = path.split(".")
                try:
                    owner: Any = importlib.import_module(module_name)
                    for attr in outer:
                        owner = getattr(owner, attr)
                    raw = inspect.getattr_static(owner, name)
                except (ImportError, AttributeError):
                    self.missing.append(f"{module_name}.{path}")
                    continue
                if isinstance(raw, classmethod):
                    patched: Any = classmethod(self.timed(part, raw.__func__))
                elif isinstance(raw, staticmethod):
                    patched = staticmethod(self.timed(part, raw.__func__))
                else:
                    patched = self.timed(part, raw)
                setattr(owner, name, patched)
                undo.callback(setattr, owner, name, raw)
            yield self


# -- one session ---------------------------------------------------------------------------------


@dataclass
class Session:
    steps: int  # asked for
    sid: str
    made: int  # model steps the turn really made
    outcome: str
    tools_recorded: int  # tool calls that committed (recorded, answered)
    tools_other: int  # tool calls refused or failed
    original_s: float
    reexecute_s: float = 0.0
    reconstruct_s: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)  # per probed run, seconds
    entries: int = 0  # entries of the stream the reconstruction reads


def policy(steps: int, choice: str) -> TurnPolicy:
    forced: Any = SEARCH if choice == "search" else "required"
    return TurnPolicy(steps, tuple([forced] * (steps - 1) + ["none"]))


def record_turn(home: Home, steps: int, choice: str, pins: dict[str, Any]) -> Session:
    state = open_session(home, pins, policy=policy(steps, choice))
    t0 = time.perf_counter()
    result: TurnResult = run_turn(home, state.session_id, QUESTION)
    elapsed = time.perf_counter() - t0
    outcomes = [o.outcome for s in result.steps for o in s.tool_outputs]
    recorded = sum(o == "COMMITTED" for o in outcomes)
    return Session(
        steps,
        state.session_id,
        len(result.steps),
        result.outcome,
        recorded,
        len(outcomes) - recorded,
        elapsed,
    )


def reconstruct(store: str, session: Session, key: KeyPair) -> float:
    t0 = time.perf_counter()
    report = reconstruct_turn(store, session.sid, 0, key)
    elapsed = time.perf_counter() - t0
    if not report.ok:
        raise RuntimeError(f"reconstruction of {session.sid} failed: {json.dumps(report.json())}")
    return elapsed


def reexecute(home: Home, session: Session, key: KeyPair) -> float:
    t0 = time.perf_counter()
    report = reexecute_turn(home, session.sid, 0, key=key)
    elapsed = time.perf_counter() - t0
    if not report.identical:
        raise RuntimeError(f"re-execution is not identical: {report.summary()}")
    return elapsed


def probed(store: str, session: Session, key: KeyPair, probe: Probe) -> dict[str, float]:
    probe.own = {}
    whole = reconstruct(store, session, key)
    parts = {part: probe.own.get(part, 0.0) for part in PARTS if part != REST}
    parts[REST] = whole - sum(parts.values())
    parts["whole"] = whole
    return parts


def measure(
    plan: Plan, choice: str, pins: dict[str, Any], clock: str | None, scratch: Path
) -> list[Session]:
    home = Home(scratch / "home")
    sessions: list[Session] = []
    with (
        _serve(page_app) as page_url,
        running_appliance(
            home,
            engine=TINY_MODEL,
            search_url=page_url + "/search?q={query}",
            fetch_allow=("127.0.0.1/32",),  # the loopback page: refused unless allow-listed
            clock=clock,
        ) as up,
    ):
        store = up.appliance.store
        progress("warm-up: one turn recorded and re-executed, untimed")
        warm = record_turn(home, 2, choice, pins)
        key = KeyPair.read(home.user_key_file)
        reexecute(home, warm, key)
        for steps in plan.steps:
            progress(f"{steps}-step turns: recording and re-executing ...")
            for _ in range(plan.turns):
                session = record_turn(home, steps, choice, pins)
                session.reexecute_s = reexecute(home, session, key)
                sessions.append(session)
    # The appliance is down: a reconstruction reads the store file, in a quiet process, as
    # ``affidavit replay --reconstruct`` does (no engine or proxy thread competing for the GIL).
    progress("reconstructing (the appliance is stopped) ...")
    reconstruct(store, warm, key)  # warm-up, untimed: imports, the SDK's first request
    probe = Probe()
    for session in sessions:
        session.entries = len(read_bodies(store, session.sid, key))
        reconstruct(store, session, key)  # untimed: this stream's pages into the cache
        session.reconstruct_s = [reconstruct(store, session, key) for _ in range(plan.reconstructs)]
        with probe.installed():
            session.parts = [probed(store, session, key, probe) for _ in range(plan.probes)]
    if probe.missing:
        progress(f"note: not probed (renamed or gone): {', '.join(probe.missing)}")
    return sessions


# -- figures -------------------------------------------------------------------------------------


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def figures_of(sessions: Sequence[Session], plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: {}
        for name in (
            "reconstruct_ms",
            "reconstruct_ms_min",
            "reconstruct_ms_per_step",
            "original_turn_ms",
            "reexecute_ms",
            "reexecute_ratio",
            "steps_made",
            "outcomes",
            "tool_calls",
            "stream_entries",
            "breakdown_ms",
        )
    }
    for steps in plan.steps:
        of = [s for s in sessions if s.steps == steps]
        n = str(steps)
        samples = [x for s in of for x in s.reconstruct_s]
        out["reconstruct_ms"][n] = ms(statistics.median(samples))
        out["reconstruct_ms_min"][n] = ms(min(samples))
        out["reconstruct_ms_per_step"][n] = ms(
            statistics.median(x / s.made for s in of for x in s.reconstruct_s)
        )
        out["original_turn_ms"][n] = ms(statistics.median(s.original_s for s in of))
        out["reexecute_ms"][n] = ms(statistics.median(s.reexecute_s for s in of))
        out["reexecute_ratio"][n] = round(
            statistics.median(s.reexecute_s / s.original_s for s in of), 3
        )
        out["steps_made"][n] = [s.made for s in of]
        out["outcomes"][n] = [s.outcome for s in of]
        out["tool_calls"][n] = {
            "recorded": [s.tools_recorded for s in of],
            "refused_or_failed": [s.tools_other for s in of],
        }
        out["stream_entries"][n] = [s.entries for s in of]
        runs = [p for s in of for p in s.parts]
        out["breakdown_ms"][n] = {
            part: ms(statistics.median(p[part] for p in runs)) for part in (*PARTS, "whole")
        }
        out["breakdown_ms"][n]["read_bodies (all)"] = ms(
            statistics.median(sum(p[part] for part in READ_PARTS) for p in runs)
        )
    return out


def goal(figures: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether a 10-step turn reconstructs within the goal, and the sentence that says so."""
    if "10" not in figures["reconstruct_ms"]:
        return None, "not measured (no 10-step turn in this run)"
    made = figures["steps_made"]["10"]
    if any(m != 10 for m in made):
        return None, f"not measured: the 10-step turns made {made} steps"
    value = figures["reconstruct_ms"]["10"]
    met = bool(value <= GOAL_10_STEP_MS)
    return met, f"{value:.2f} ms against <= {GOAL_10_STEP_MS:g} ms: {'met' if met else 'MISSED'}"


# -- report --------------------------------------------------------------------------------------


def render(rows: list[tuple[str, ...]], left: int = 0) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [
            c.ljust(w) if j < left else c.rjust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append(" | ".join(cells).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return lines


def span(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def table(figures: dict[str, Any], verdict: bool | None) -> str:
    head = (
        "steps",
        "made",
        "tool calls",
        "original",
        "re-execute",
        "ratio",
        "reconstruct",
        "best",
        "per step",
        "entries",
        "goal",
    )
    rows: list[tuple[str, ...]] = [head]
    for n in figures["reconstruct_ms"]:
        made = figures["steps_made"][n]
        early = sorted(
            {o for m, o in zip(made, figures["outcomes"][n], strict=True) if m != int(n)}
        )
        tools = figures["tool_calls"][n]
        other = sum(tools["refused_or_failed"])
        calls = f"{span(tools['recorded'])} recorded" + (f", {other} not" if other else "")
        target = "-"
        if n == "10":
            target = (
                f"<= {GOAL_10_STEP_MS:g} ms: "
                + {True: "met", False: "MISSED", None: "n/a"}[verdict]
            )
        rows.append(
            (
                n,
                span(made) + (f" (ended early: {', '.join(early)})" if early else ""),
                calls,
                f"{figures['original_turn_ms'][n]:,.1f} ms",
                f"{figures['reexecute_ms'][n]:,.1f} ms",
                f"{figures['reexecute_ratio'][n]:.2f}x",
                f"{figures['reconstruct_ms'][n]:.2f} ms",
                f"{figures['reconstruct_ms_min'][n]:.2f} ms",
                f"{figures['reconstruct_ms_per_step'][n]:.2f} ms",
                span(figures["stream_entries"][n]),
                target,
            )
        )
    return "\n".join(render(rows))


def breakdown_table(figures: dict[str, Any]) -> str:
    steps = list(figures["breakdown_ms"])
    rows: list[tuple[str, ...]] = [
        ("where reconstruct time goes (ms)", *(f"{n} steps" for n in steps))
    ]
    for part in (*PARTS, "read_bodies (all)", "whole"):
        cells = []
        for n in steps:
            b = figures["breakdown_ms"][n]
            share = 100.0 * b[part] / b["whole"] if b["whole"] else 0.0
            cells.append(f"{b[part]:.3f} ({share:3.0f}%)")
        rows.append((part, *cells))
    return "\n".join(render(rows, left=1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (1, 2 and 4 steps, one session each)"
    )
    parser.add_argument(
        "--tool-choice",
        choices=("search", "required"),
        default="search",
        help="what forces each tool step: web_search by name (default), or 'required'",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=PINS["max_tokens"], help="the max_tokens pin"
    )
    parser.add_argument(
        "--live-clock",
        action="store_true",
        help=f"inject the system clock (default: the fixed instant {CLOCK})",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    pins = {**PINS, "max_tokens": args.max_tokens}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    scratch = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    started = time.perf_counter()
    try:
        clock = None if args.live_clock else CLOCK
        sessions = measure(plan, args.tool_choice, pins, clock, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = figures_of(sessions, plan)
    met, sentence = goal(figures)
    figures["goal_10_step_ms"] = GOAL_10_STEP_MS
    figures["goal_met"] = met
    figures["run"] = {
        "mode": "quick" if args.quick else "full",
        "cores": cores,
        "python": sys.version.split()[0],
        "pins": pins,
        "tool_choice": args.tool_choice,
        "clock": "system" if args.live_clock else CLOCK,
        "sessions_per_length": plan.turns,
        "reconstructs_per_session": plan.reconstructs,
        "probed_runs_per_session": plan.probes,
        "seconds": round(time.perf_counter() - started, 1),
    }

    print(table(figures, met))
    print()
    print(breakdown_table(figures))
    print()
    print(
        "original: one live turn (run_turn); re-execute: reexecute_turn of it, identical, "
        "ratio paired per session, median; reconstruct: reconstruct_turn, ok, median of "
        f"{plan.reconstructs} x {plan.turns} session(s) (best: the fastest of them, for a shared "
        "machine); per step: per step made; entries: the stream reconstruct reads"
    )
    print(
        "breakdown: each part's own time (nested probes subtracted), median of the probed runs; "
        "sdk: the openai SDK's request-params transform and its stream parsing (harness.model_api."
        "_collect_openai); rest: the agent loop and the SDK's request building and sending"
    )
    print(f"cores: {cores}; mode: {figures['run']['mode']}; {figures['run']['seconds']:.1f} s")
    if args.quick:
        print("note: --quick runs no 10-step turn and one session per length: indicative only")
    if cores != 2:
        print(f"note: the goal is stated for 2 cores; this machine gives {cores}")
    print(f"goal (10-step turn reconstructed): {sentence}")
    measured = met is not None
    ten = figures["reconstruct_ms"].get("10") if measured else None
    summary = [Target("reconstruct_10_step_ms", ten, GOAL_10_STEP_MS, "lower", " ms")]
    print(json.dumps({**figures, "summary": [t.row() for t in summary]}, sort_keys=True))
    return 0


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
