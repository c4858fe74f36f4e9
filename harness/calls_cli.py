"""``affidavit replay SESSION --calls [SEQ...] [--reconstruct]``: the printing side of
``harness.calls``. Exit codes: 0 every call matched, 1 a call differs (the first is named),
2 a SEQ names no recorded call, 3 no store, key or appliance."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from record.backends import StoreLocation

__all__ = ["replay_calls"]


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def replay_calls(
    home: Any,
    session: str,
    seqs: list[int] | None,
    reconstruct: bool,
    store: StoreLocation | None,
    key: Path | None,
    as_json: bool,
) -> int:
    from harness.calls import UnknownCall, reconstruct_calls, reexecute_calls, replay_verdicts
    from harness.session import read_bodies, user_key
    from harness.state import HomeMissing
    from record.errors import CannotOpen

    try:
        opener = user_key(home, key)
        if reconstruct:
            where = store if store is not None else home.appliance().store
            bodies = read_bodies(where, session, opener)
            if not bodies:
                _err(f"affidavit: the store holds no stream {session}")
                return 3
            report = reconstruct_calls(where, session, opener, seqs, bodies=bodies)
            judged = replay_verdicts(bodies)  # a replay stream: the verdicts it was given
            if as_json:
                print(json.dumps({**report.json(), "replay_verdicts": judged}, indent=2))
            else:
                for call in report.calls:
                    print(call.line(), flush=True)
                    if call.diff:
                        print(call.diff.rstrip())
                print(report.summary())
                if judged:
                    same = sum(_identical(v) for v in judged)
                    print(
                        f"Recorded verdicts: {same} of {len(judged)} calls judged identical to "
                        f"their recorded twins in {judged[0].get('replays')}"
                    )
            return 0 if report.ok else 1
        result = reexecute_calls(
            home,
            session,
            key=opener,
            seqs=seqs,
            on_call=None if as_json else (lambda v: print(v.line(), flush=True)),
        )
    except HomeMissing as exc:
        _err(f"affidavit: missing: {exc}")
        return 3
    except CannotOpen as exc:  # no such stream in the store, or not sealed to this key
        _err(f"affidavit: missing: {session}: {exc}")
        return 3
    except UnknownCall as exc:
        _err(f"affidavit: {exc}")
        return 2
    except KeyError as exc:
        _err(f"affidavit: {exc.args[0] if exc.args else exc}")
        return 1
    if as_json:
        print(json.dumps(result.json(), indent=2))
    else:
        if not result.pinned:
            print(
                "note: these calls were not pinned in strict cache mode: replies are not "
                "expected to match"
            )
        print(result.summary())
    return 0 if result.identical else 1


def _identical(verdict: dict[str, Any]) -> bool:
    return all(
        verdict.get(name)
        for name in ("prompt_identical", "clock_identical", "request_identical", "reply_identical")
    )
