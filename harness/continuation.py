"""A session carried on from another appliance's stream: one session, two streams.

A stream is written by the appliance that opened it, for life (``record.log``). When that
appliance is gone, ``affidavit session continue OLD`` (``harness.carry_on``) opens a stream
on this appliance whose ``stream.opened`` names OLD (``record.continuation``): OLD's last
signed checkpoint, and how many of OLD's entries the new stream takes over (``size``) with
their Merkle root.

To the harness the two streams are one session. :func:`linked` reads OLD's entries up to the
link's ``size``, then the new stream's, each ``seq`` moved up by that size, and so is every
member that names a ``seq`` of the same stream. Turn numbers, history, ``session show``,
reconstruct and resume all read that view, so a turn begun on one appliance and finished on
the other reads as one turn. Chains (a continuation of a continuation) are followed to
:data:`MAX_HOPS`.

**What is taken over** (:func:`take_over`), when OLD's last turn did not end:
- Committed model steps are served from OLD's record on resume, tool and fetch answers too. So
  the new stream must never need a tool call admitted against a reply in OLD: its proxy
  cannot read OLD, which is sealed to OLD's appliance and the user.
- So OLD's last model step is taken over only if every tool call and fetch recorded after it
  has an answer. A later call that asks for more is refused on resume before anything is
  recorded.
- Otherwise the link stops before that step's request, and the new stream sends it again.
  That is a model call, which has no side effect, and nothing of it had reached a tool.
- A call after it with no answer, or one whose outcome is unknown, may have had its effect.
  Only the appliance that made the call can settle it, so continuing is refused, naming the
  call, unless the turn is given up (``--abandon-turn``): the link then stops before the
  turn, and the new stream starts that turn's number again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from harness.state import HomeError
from record.continuation import LinkBroken, check_link_in
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    StreamOpened,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
    TurnEnded,
    TurnStarted,
)
from record.seal import KeyPair

__all__ = [
    "MAX_HOPS",
    "CannotContinue",
    "Linked",
    "linked",
    "pins_of",
    "refreshed",
    "take_over",
]

#: How many links one view follows: a longer chain is refused, and so is a loop.
MAX_HOPS = 32

#: Body members that name a ``seq`` of the same stream (``replayed_from`` names another).
_SEQ_MEMBERS: dict[type[Strict], str] = {
    ModelResponse: "request_seq",
    ToolCall: "reply_seq",
    ToolResult: "call_seq",
    FetchRequest: "reply_seq",
    FetchResponse: "request_seq",
    TurnDecided: "call_seq",
}


class CannotContinue(HomeError):
    """The old stream cannot be carried on as asked (exit 1: what was found is said)."""


@dataclass
class Linked:
    """A session's bodies across its streams, oldest first, in one ``seq`` numbering."""

    bodies: list[tuple[int, Strict]]
    offset: int  # where the newest stream's own seq 0 sits in that numbering
    streams: list[str]  # oldest first; the last is the stream asked for

    def own_seq(self, seq: int) -> int:
        """A seq of the view as the newest stream numbers it (for what is appended there)."""
        if seq < self.offset:
            raise CannotContinue(
                f"seq {seq} is in {self.streams[-2]}, which this appliance does not write"
            )
        return seq - self.offset


def _moved(body: Strict, by: int) -> Strict:
    member = _SEQ_MEMBERS.get(type(body))
    if by == 0 or member is None:
        return body
    value = getattr(body, member)
    return body if value is None else body.model_copy(update={member: value + by})


def linked(store: Path | str, stream: str, key: KeyPair, *, hops: int = MAX_HOPS) -> Linked:
    """``stream``'s bodies, after those of the streams it continues (each link checked
    against the store first: ``CannotContinue`` when one does not hold)."""
    from egress_proxy.replay import read_stream
    from record.backends import open_store

    own = read_stream(store, stream, key)
    opened = own[0][1] if own else None
    link = opened.continues if isinstance(opened, StreamOpened) else None
    if link is None:
        return Linked(own, 0, [stream])
    if hops <= 0:
        raise CannotContinue(f"{stream}: more than {MAX_HOPS} links, or a loop of them")
    readonly = open_store(store, readonly=True)
    try:
        check_link_in(readonly, link)
    except LinkBroken as exc:
        raise CannotContinue(f"{stream} continues {link.stream}, but {exc}") from None
    finally:
        readonly.close()
    earlier = linked(store, link.stream, key, hops=hops - 1)
    offset = earlier.offset + link.size
    return _spliced(earlier.bodies, own, offset, [*earlier.streams, stream])


def refreshed(view: Linked, store: Path | str, key: KeyPair) -> Linked:
    """``view`` with its newest stream read again: the older ones end at their links, which
    were checked when the view was made, so they are neither read nor checked again."""
    from egress_proxy.replay import read_stream

    own = read_stream(store, view.streams[-1], key)
    return _spliced(view.bodies, own, view.offset, view.streams)


def _spliced(
    earlier: Sequence[tuple[int, Strict]],
    own: Sequence[tuple[int, Strict]],
    offset: int,
    streams: list[str],
) -> Linked:
    """The older streams' bodies before ``offset``, then the newest's, moved up by it."""
    taken = [(seq, body) for seq, body in earlier if seq < offset]
    mine = [(seq + offset, _moved(body, offset)) for seq, body in own]
    return Linked(taken + mine, offset, streams)


def pins_of(bodies: Sequence[tuple[int, Strict]]) -> dict[str, JsonValue] | None:
    """The pins in force at the end of ``bodies`` (the last ``pins.set``; None: unpinned)."""
    last = next((b for _, b in reversed(bodies) if isinstance(b, PinsSet)), None)
    return dict(last.pins) if last is not None and last.pins else None


def take_over(
    bodies: Sequence[tuple[int, Strict]], size: int, *, abandon_turn: bool = False
) -> int:
    """How many of the old stream's ``size`` entries a continuation takes over (module
    docstring); ``bodies`` are its opened bodies in seq order, seqs as the old stream's."""
    started = next(((s, b) for s, b in reversed(bodies) if isinstance(b, TurnStarted)), None)
    if started is None:
        return size
    turn_seq, turn = started
    if any(isinstance(b, TurnEnded) and b.turn == turn.turn for s, b in bodies if s > turn_seq):
        return size
    if abandon_turn:
        return turn_seq
    inside = [(s, b) for s, b in bodies if s > turn_seq]
    last_request = next((s for s, b in reversed(inside) if isinstance(b, ModelRequest)), None)
    if last_request is None:
        return size  # nothing asked yet: the turn's whole start is taken over
    after = [(s, b) for s, b in inside if s > last_request]
    reply = next(
        (b for _, b in after if isinstance(b, ModelResponse) and b.request_seq == last_request),
        None,
    )
    calls = [(s, b) for s, b in after if isinstance(b, ToolCall | FetchRequest)]
    if reply is None or reply.outcome != "COMMITTED" or not calls:
        return last_request  # the step is sent again: nothing of it reached a tool
    answers = {b.call_seq: b.outcome for _, b in after if isinstance(b, ToolResult)}
    answers |= {b.request_seq: b.outcome for _, b in after if isinstance(b, FetchResponse)}
    # a person's "skip" settles a call without sending it; "retry" would send it again,
    # against a reply only the old stream holds
    skipped = {b.call_seq for _, b in after if isinstance(b, TurnDecided) and b.decision == "skip"}
    for seq, call in calls:
        outcome = answers.get(seq, "none")
        if outcome in ("COMMITTED", "FAILED") or seq in skipped:
            continue
        what = (
            f"tool call {call.server}/{call.tool} ({call.call_id})"
            if isinstance(call, ToolCall)
            else f"web fetch {call.url}"
        )
        raise CannotContinue(
            f"turn {turn.turn} stopped after {what} at seq {seq}, whose outcome "
            f"{'is unknown' if outcome == 'UNKNOWN' else 'was never recorded'}: it may have "
            "had its effect, and only the appliance that made it can settle it. "
            "--abandon-turn carries the session on from before that turn instead"
        )
    return size
