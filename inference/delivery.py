"""A job handed from the event loop to the scheduler's thread, and the wait for its end.

Every route (Chat Completions, Responses, Messages) submits the same way and, when it does
not stream, waits the same way: until the sequence's :class:`Finished` arrives, asking
every :data:`DISCONNECT_POLL_S` whether the client is still there, however fast tokens
arrive (a client that left gets ``None``, and the caller frees the slot).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from inference.scheduler import Event, Finished, Job, Scheduler, Ticket, TokenEvent

__all__ = ["DISCONNECT_POLL_S", "finished", "submit"]

DISCONNECT_POLL_S = 0.5


def submit(scheduler: Scheduler, job: Job) -> tuple[asyncio.Queue[Event], Ticket]:
    """Start ``job``; its events arrive on the returned queue, on this event loop."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    return events, scheduler.submit(job, sink)


async def finished(
    events: asyncio.Queue[Event],
    disconnected: Callable[[], Awaitable[bool]],
    on_token: Callable[[TokenEvent], None] | None = None,
) -> Finished | None:
    """The sequence's end, or ``None`` once the client has gone; ``on_token`` sees each
    token on the way."""
    loop = asyncio.get_running_loop()
    check_at = loop.time() + DISCONNECT_POLL_S
    while True:
        try:
            event = await asyncio.wait_for(events.get(), max(0.0, check_at - loop.time()))
        except TimeoutError:
            event = None
        if loop.time() >= check_at:
            if await disconnected():
                return None
            check_at = loop.time() + DISCONNECT_POLL_S
        if isinstance(event, Finished):
            return event
        if isinstance(event, TokenEvent) and on_token is not None:
            on_token(event)
