"""``affidavit session continue OLD``: carry another appliance's session on in a stream here.

The rules of what is taken over, and the one-session view of the streams, are
``harness.continuation``'s; this module checks that OLD may be carried on (its appliance
gone, no other stream carrying it on already), makes the link and opens the new session.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from harness.continuation import CannotContinue, pins_of, take_over
from harness.session import LABEL_SEARCH, open_session, read_linked, user_key
from harness.state import Home, SessionState
from record.backends import open_store
from record.continuation import LinkBroken, continued_by, link_to, root_digest
from record.schema import Continuation, StreamOpened
from record.seal import KeyPair, RecipientKey

__all__ = ["continue_session"]


def continue_session(
    home: Home,
    old: str,
    *,
    key: KeyPair | None = None,
    recipients: Sequence[RecipientKey] = (),
    abandon_turn: bool = False,
) -> tuple[SessionState, Continuation]:
    """Carry session ``old`` (another appliance's stream, in this appliance's store) on in a
    new stream here: sealed to the user's key and ``recipients``, with ``old``'s labels and
    the pins in force where the link stops. If ``old``'s last turn did not end and is taken
    over, the new session's first command is ``resume``."""
    appliance = home.appliance()
    opener = key or user_key(home)
    view = read_linked(appliance.store, old, opener)
    store = open_store(appliance.store, readonly=True)
    try:
        if store.writer_alive(old):
            lease = store.lease(old)
            who = f" ({lease.holder}, since {lease.since})" if lease is not None else ""
            raise CannotContinue(
                f"{old} is being written right now by its appliance{who}: continue a session "
                "only once its appliance is gone (stopped, or its process dead), or the "
                "session would go on twice"
            )
        already = continued_by(store, old)
        if already:
            raise CannotContinue(
                f"{old} is already carried on by {', '.join(already)}: continue "
                f"{already[-1]} instead, or the session would go on twice"
            )
        link = link_to(store, old)
        cut = take_over(view.bodies, view.offset + link.size, abandon_turn=abandon_turn)
        if cut < view.offset:
            raise CannotContinue(
                f"the turn to give up began in {view.streams[-2]}, before {old} took the "
                "session over: a continuation gives up only a turn begun in the stream it "
                "continues"
            )
        if cut - view.offset < link.size:
            size = cut - view.offset
            leaves = store.leaf_hashes(old, size)
            link = link.model_copy(update={"size": size, "root": root_digest(leaves)})
    except LinkBroken as exc:
        raise CannotContinue(f"{old} cannot be continued: {exc}") from None
    finally:
        store.close()
    taken = [(s, b) for s, b in view.bodies if s < cut]
    opening = next((b for s, b in view.bodies if s == view.offset), None)  # old's own
    labels = dict(opening.labels) if isinstance(opening, StreamOpened) else {}
    # the search endpoint is this appliance's to choose, as for any session it opens
    labels.pop(LABEL_SEARCH, None)
    if appliance.search_url:
        labels[LABEL_SEARCH] = appliance.search_url
    try:
        state = open_session(home, pins_of(taken), recipients, labels=labels, continues=link)
    except grpc.RpcError as exc:  # the proxy checks the link again, against the store
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        raise CannotContinue(f"the proxy refused to continue {old}: {exc.details()}") from None
    return state, link
