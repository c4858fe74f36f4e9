"""The proxy's side of one upstream MCP server: connections to it, and faults kept to one.

A :class:`Link` is a configured server as one session (or, for a ``shared`` or remote
server, every session) reaches it. It holds the :class:`Connection` new requests go to: one
``ClientSession`` of the official ``mcp`` SDK, over ``stdio_client`` (one process the proxy
spawns, by default under ``unshare --net``) or ``streamable_http_client`` (through
``transports.network``'s client), held open by a task of its own.

Faults stay with the connection that had them:

- **A request past ``timeout_s``** is abandoned by the SDK, which sends the server
  ``notifications/cancelled`` for its id; the link then *retires* the connection: new
  requests start a fresh one (a new process) at once, while requests still running on the
  old one (another session's, on a shared server) go on; the old one is closed when the last
  of them ends, each bounded by its own timeout. A request whose write to the server blocks
  (a stuck process that stopped reading) is cut a little after its timeout all the same.
- **A closed connection** (the process died) is retired the same way.
- **A server that ends before it answers ``initialize``** raises :class:`ServerFailed`,
  which carries the last lines it wrote on stderr.

Requests on one connection run concurrently (the SDK multiplexes them by id); the link's
lock is held only while a connection is started. This module never reads the record and
knows nothing of sessions or admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from egress_proxy.tool_config import RemoteServer, StdioServer

logger = logging.getLogger(__name__)

#: How long past its timeout a request whose write never went through is cut anyway.
WRITE_GRACE_S = 5.0

_Result = TypeVar("_Result", bound=BaseModel)


class ServerFailed(Exception):
    """A spawned server ended before it answered ``initialize``; what it said on stderr."""


class Connection:
    """One ``ClientSession`` to a server (for a stdio server, one process), held open by a
    task of its own until :meth:`aclose`."""

    def __init__(self, name: str, config: StdioServer | RemoteServer, token: str | None) -> None:
        self.name, self.config, self._token = name, config, token
        self.session: ClientSession | None = None
        self.calls = 0  # requests running on it now
        self.retired = False  # new requests go elsewhere; closed once ``calls`` is 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._errlog: Any = None  # a spawned process's stderr, read back when it fails

    @property
    def live(self) -> bool:
        return self._task is not None and not self._task.done()

    async def open(self) -> None:
        """Start the server (or dial it) and initialize; a server that ends first raises
        ``ServerFailed`` with its stderr, one that never answers ``TimeoutError``."""
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        try:  # a server that never answers initialize must not hold the link's lock for ever
            self.session = await asyncio.wait_for(ready, self.config.timeout_s)
        except BaseException as exc:
            said = self._said()  # read before the task's teardown closes the file
            self._task.cancel()
            if said and isinstance(exc, TimeoutError):
                raise ServerFailed(f"no answer to initialize; it said: {said}") from exc
            raise

    async def ask(self, request: Any, result: type[_Result]) -> _Result:
        """One request, bounded by the server's ``timeout_s``: past it the SDK sends
        ``notifications/cancelled`` and raises ``MCPError`` ``REQUEST_TIMEOUT``."""
        assert self.session is not None, "an open connection"
        timeout = self.config.timeout_s
        try:  # the SDK's clock starts once the request is written: this one bounds the write
            async with asyncio.timeout(timeout + WRITE_GRACE_S):
                return await self.session.send_request(request, result, timeout)
        except TimeoutError:
            raise MCPError(types.REQUEST_TIMEOUT, "the request could not be sent") from None

    def _said(self) -> str:
        """The last lines a spawned process wrote to stderr (empty if none or not spawned)."""
        if self._errlog is None:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            text: str = self._errlog.read()[-2000:]
        except (OSError, ValueError):
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-5:])

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with self._streams() as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                if ready.done():  # the caller gave up waiting
                    return
                ready.set_result(session)
                await self._stop.wait()
        except Exception as exc:
            if ready.done():
                logger.warning("MCP server %r: connection ended: %r", self.name, exc)
            else:  # the process has ended here: all it wrote is in the file
                said = self._said()
                failed = ServerFailed(f"{type(exc).__name__}: {exc}; it said: {said}")
                ready.set_exception(failed if said else exc)
        finally:
            if self._errlog is not None:
                self._errlog.close()

    def _streams(self) -> contextlib.AbstractAsyncContextManager[Any]:
        config = self.config
        if isinstance(config, StdioServer):
            command, args = config.command, list(config.args)
            if config.network == "none":
                command, args = "unshare", ["--net", "--", command, *args]
            # A byte that is not UTF-8 in a reply would end the SDK's reader (strict decoding)
            # and every request on the process would wait out its timeout: it reads as U+FFFD.
            params = StdioServerParameters(
                command=command,
                args=args,
                env=config.env,
                cwd=config.cwd,
                encoding_error_handler="replace",
            )
            # kept open while the process lives: read back when it fails
            self._errlog = tempfile.TemporaryFile("w+", errors="replace")  # noqa: SIM115
            return stdio_client(params, errlog=self._errlog)
        from egress_proxy.transports.network import mcp_http_client

        headers = dict(config.headers)
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        client = mcp_http_client(
            headers, config.timeout_s, config.connect_timeout_s, config.max_reply_bytes
        )
        return _owning(client, streamable_http_client(config.url, http_client=client))

    async def aclose(self) -> None:
        """Close the session; a spawned process gets its stdin closed, then is killed."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=10)


@contextlib.asynccontextmanager
async def _owning(client: Any, streams: Any) -> AsyncIterator[Any]:
    async with client, streams as pair:
        yield pair


class Link:
    """A configured server as one session (or all) reaches it: the connection new requests
    go to, and retired ones still finishing their requests."""

    def __init__(self, name: str, config: StdioServer | RemoteServer, token: str | None) -> None:
        self.name, self.config, self._token = name, config, token
        self.current: Connection | None = None
        self._retired: set[Connection] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.busy = 0  # requests using it now: the reaper leaves it alone
        self.last_used = time.monotonic()

    @property
    def live(self) -> bool:
        return any(c.live for c in (self.current, *self._retired) if c is not None)

    @contextlib.asynccontextmanager
    async def using(self) -> AsyncIterator[None]:
        """Mark the link in use for the block (it is not idle, whatever the clock says)."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else now - self.last_used

    async def connect(self) -> Connection:
        """The connection to ask now, started if there is none (a dead one is replaced)."""
        async with self._lock:
            conn = self.current
            if conn is not None and not conn.live:
                self.retire(conn, "its connection ended")
            if self.current is None:
                conn = Connection(self.name, self.config, self._token)
                await conn.open()
                self.current = conn
            assert self.current is not None
            return self.current

    @contextlib.asynccontextmanager
    async def holding(self, conn: Connection) -> AsyncIterator[Connection]:
        """Count one request on ``conn`` for the block: a retired connection is closed only
        once its last request has left. Enter it straight after :meth:`connect`."""
        conn.calls += 1
        try:
            yield conn
        finally:
            conn.calls -= 1
            if conn.retired and conn.calls == 0:
                self._close_later(conn)

    def lost(self, exc: MCPError, conn: Connection) -> None:
        """After a timeout or a closed connection, send no more requests to ``conn``."""
        if exc.code == types.REQUEST_TIMEOUT:
            self.retire(conn, f"a request got no answer within {self.config.timeout_s:g} s")
        elif exc.code == types.CONNECTION_CLOSED:
            self.retire(conn, "its connection closed")

    def retire(self, conn: Connection, why: str) -> None:
        """New requests start a fresh connection; ``conn`` is closed once unused."""
        if conn.retired:
            return
        conn.retired = True
        if self.current is conn:
            self.current = None
        logger.warning("MCP server %r: %s; the next request starts it afresh", self.name, why)
        if conn.calls:
            self._retired.add(conn)
        else:
            self._close_later(conn)

    def _close_later(self, conn: Connection) -> None:
        self._retired.discard(conn)
        task = asyncio.create_task(conn.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every connection (spawned processes are stopped and waited for)."""
        conns = [c for c in (self.current, *self._retired) if c is not None]
        self.current = None
        self._retired.clear()
        await asyncio.gather(*(c.aclose() for c in conns), *self._closing)
