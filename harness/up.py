"""``affidavit up``: the appliance on this machine, for the harness commands to use.

It starts the embedded engine (SmolLM2-135M-Instruct unless ``--model`` names another:
another known name, ``tiny`` for the random test model, or a model folder or ``.gguf``
file) as a process of its own, ``affidavit engine serve`` on a loopback port with a token
file, as the appliance runs it (the harness imports no engine code; the engine writes to
``engine.log`` in the state folder), then the
egress proxy in front of it writing the record (data plane on 127.0.0.1, control plane on a
Unix socket in the state folder), with the fetch endpoint on and any MCP servers the proxy
config lists, and writes ``appliance.json`` so ``session``, ``turn``, ``replay`` and
``resume`` find it. It runs until interrupted, then stops everything it started and removes
the ``appliance.json`` it wrote. Tests and the demo use ``running_appliance`` directly.

One ``up`` per home: it holds the home's ``up.lock`` (``flock``) from before the engine loads
until everything is stopped, so a second ``up`` is refused at once (exit 2, naming the
running one's pid and URL). What a killed ``up`` left (``appliance.json``, ``control.sock``)
is replaced by the next one, said in one line.

The appliance key (a recipient of every stream, so resume and re-execute work unattended)
is kept in the state folder here; inside the confidential VM it is born in the guest.

A restart, after a clean stop or a SIGKILL, keeps every session: the proxy binds the port
the last run chose (``proxy.port``; a new one only if that is taken, said on the console),
restores its sessions from its session book (``proxy-sessions.db``) and the record, and
answers the calls a dead run left with ``UNKNOWN``. The same ``base_url`` and token keep
working, and ``affidavit resume`` finishes an interrupted turn.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from harness.panel.prefix import PANEL_ROOT
from harness.state import Appliance, Home, HomeInUse, HomeLock, write_atomic
from record.backends import StoreLocation, is_url, location, store_name
from record.cli import SIGNING_KEY_FILE, STORE_FILE, home_store

if TYPE_CHECKING:
    from attestation.channel import EvidenceSource
    from egress_proxy.server import ProxyServer
    from harness.front import Front

__all__ = [
    "DEFAULT_MODEL",
    "TINY_MODEL",
    "EngineProcess",
    "EngineStartError",
    "ExternalError",
    "RunningAppliance",
    "engine_model",
    "running_appliance",
    "serve_forever",
    "start_engine",
]

#: The model ``affidavit up`` and ``make demo`` serve unless told otherwise (pulled from PyPI).
DEFAULT_MODEL = "smollm2-135m"
#: The random tiny model (``affidavit engine make-model``): fast, deterministic, nonsense.
TINY_MODEL = "tiny"
#: In the state folder: the proxy's last port, and its session book (``egress_proxy.session_book``).
PORT_FILE = "proxy.port"
SESSION_BOOK = "proxy-sessions.db"
_TINY_NAME = "affidavit-tiny"


class ExternalError(Exception):
    """``--external`` cannot be served: its address is taken or not ours, or the home's TLS
    key is unusable (exit 2: choose another address, or mend or remove ``tls.key``)."""

    exit_code = 2


class EngineStartError(Exception):
    """The engine could not be started: its model (3 missing, 1 a changed file refused) or its
    process (the code it exited with, and the last lines it wrote)."""

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _engine_command(*args: str) -> list[str]:
    """``affidavit engine ARGS`` as a process of its own, in this Python (``python -m
    affidavit``: the same command line, whatever script name or venv started this one)."""
    return [sys.executable, "-m", "affidavit", "engine", *args]


def engine_model(home: Home, spec: str | Path, progress: Any = None) -> tuple[Path, str]:
    """The checkpoint ``spec`` names and the model id it is served under.

    ``spec`` is a model folder or ``.gguf`` file, ``tiny`` (made in the state folder when
    missing, by ``affidavit engine make-model``), or a name ``affidavit engine pull`` knows
    (pulled into its cache when missing; its progress goes to this stderr). The engine's own
    commands do it, in a process of their own: the harness imports no engine code.
    """
    say = progress or (lambda _: None)
    path = Path(spec)
    if spec != TINY_MODEL and path.exists():
        return path, path.stem if path.is_file() else path.name
    if spec == TINY_MODEL:
        made = home.root / "model"
        if not (made / "config.json").is_file():
            say("making the random tiny model")
            _engine_tool("make-model", str(made))
        return made, _TINY_NAME
    pulled = _engine_tool("pull", str(spec), "--json")
    try:
        return Path(json.loads(pulled)["path"]), str(spec)
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineStartError(f"`engine pull {spec}` printed no model path: {exc}") from None


def _engine_tool(*args: str) -> str:
    """Run one ``affidavit engine`` command to its end and return its stdout. Its progress (a
    download's) is passed on to this stderr as it comes; its error line becomes the message
    of the ``EngineStartError`` raised if it fails, so a failure is said once."""
    with subprocess.Popen(
        _engine_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        # stdout is read on its own thread: a child that fills the stdout pipe while this
        # one waits on stderr would otherwise block both for ever.
        stdout, out_chunks = process.stdout, list[bytes]()
        reader = threading.Thread(target=lambda: out_chunks.append(stdout.read()), daemon=True)
        reader.start()
        said: list[str] = []
        for raw in process.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("affidavit: "):
                said.append(line.removeprefix("affidavit: ").removeprefix("error: "))
            else:
                print(line, file=sys.stderr, flush=True)
        reader.join()
        out = b"".join(out_chunks)
    code = process.returncode
    if code == 0:
        return out.decode("utf-8", "replace")
    why = "; ".join(said) or f"`affidavit engine {' '.join(args)}` exited {code}"
    if args[0] == "pull" and code == 2:  # a name pull does not know
        raise EngineStartError(f"model {args[1]!r} is neither a path nor a known model: {why}")
    raise EngineStartError(why, code if code in (1, 3) else 1)


@dataclass
class EngineProcess:
    """``affidavit engine serve`` running as a process of its own, as the appliance runs it:
    on a loopback port, answering only the token in ``token_file``; what it writes goes to
    ``log``."""

    process: subprocess.Popen[bytes]
    url: str
    token_file: Path
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _die_with_parent() -> Callable[[], None]:
    """What the child runs before exec so that it gets SIGTERM when ``up`` dies, even by
    SIGKILL: no engine is left behind. Resolved here, in the parent: the child, forked from a
    process with threads, only calls it (no import, no lookup)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_engine(
    home: Home, model_path: Path, served: str, timeout_s: float = 900
) -> EngineProcess:
    """Start the engine on ``model_path`` and return once it answers ``/v1/models``;
    ``EngineStartError`` with its last lines if it exits first or takes past ``timeout_s``."""
    import secrets
    import time
    import urllib.error
    import urllib.request

    # this run's token: the proxy holds it, the engine answers no one else
    token = secrets.token_urlsafe(32)
    token_file = home.root / "engine.token"
    write_atomic(token_file, token.encode("ascii") + b"\n", 0o600)
    log = home.root / "engine.log"
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")  # two cores: the proxy and the harness need the other
    with log.open("ab") as out:
        out.write(f"--- affidavit up: engine starting, {time.ctime()}\n".encode())
        out.flush()  # the tail quoted on failure is this run's, never an older one's
        this_run = out.tell()
        process = subprocess.Popen(
            _engine_command(
                "serve",
                "--model",
                str(model_path),
                "--model-name",
                served,
                "--host",
                "127.0.0.1",
                # port 0: the engine binds a free port itself and prints it, so no other
                # process can take the port between our choosing it and its binding it
                "--port",
                "0",
                "--token-file",
                str(token_file),
                "--log-level",
                "warning",
            ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,  # Ctrl-C reaches `up`, which stops the engine itself
            preexec_fn=_die_with_parent(),
        )
    engine = EngineProcess(process, "", token_file, log)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise EngineStartError(
                f"the engine exited ({process.returncode}) before it answered: "
                f"{_tail(log)} (all of it in {log})",
                3 if process.returncode == 3 else 1,
            )
        if not engine.url:
            engine.url = _served_at(log, this_run)
        if engine.url:
            ask = urllib.request.Request(
                engine.url + "/v1/models", headers={"authorization": f"Bearer {token}"}
            )
            try:
                with direct.open(ask, timeout=5) as answer:
                    if answer.status == 200:
                        return engine
            except (OSError, urllib.error.URLError):
                pass
        if time.monotonic() > deadline:
            engine.stop()
            raise EngineStartError(f"the engine did not answer in {timeout_s:.0f} s (see {log})", 1)
        time.sleep(0.2)


_SERVING = re.compile(rb"affidavit engine serving .* on (http://127\.0\.0\.1:\d+)\n")


def _served_at(log: Path, offset: int) -> str:
    """The address this run's engine printed once it bound its port ('' until then)."""
    with log.open("rb") as said:
        said.seek(offset)
        found = _SERVING.search(said.read())
    return found.group(1).decode() if found else ""


def _tail(log: Path, lines: int = 3) -> str:
    """The last ``lines`` lines this run's engine wrote (after its ``---`` header)."""
    try:
        said = log.read_text("utf-8", "replace").rsplit("--- affidavit up:", 1)[-1]
    except OSError:
        return ""
    return " | ".join(said.strip().splitlines()[1:][-lines:]) or "it wrote nothing"


@dataclass
class RunningAppliance:
    home: Home
    appliance: Appliance
    engine: EngineProcess | None  # None: another provider is behind the proxy
    proxy: Any  # egress_proxy.server.ProxyServer
    log: Any  # record.log.Log
    front: Front | None = None  # the external TLS address, when asked for
    panel_url: str | None = None  # the panel there, with its access token (never written down)


@contextmanager
def running_appliance(
    home: Home,
    *,
    engine: str | Path = DEFAULT_MODEL,
    mcp_servers: Mapping[str, Mapping[str, Any]] | None = None,
    search_url: str | None = None,
    fetch_allow: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    progress: Any = None,
    clock: str | None = None,
    provider: Mapping[str, Any] | None = None,
    model: str | None = None,
    store: str | None = None,
    external: tuple[str, int] | None = None,
    evidence: EvidenceSource | None = None,
    release: str | None = None,
) -> Iterator[RunningAppliance]:
    """Engine, proxy and control plane, running until the block ends. ``engine`` is the
    embedded engine's model (:func:`engine_model`). ``clock`` fixes the instant the proxy
    injects (tests: the model's output then depends on nothing else). ``provider`` (a proxy
    provider table: ``api``, ``base_url``, ``api_key_env`` …) puts that provider behind the
    proxy instead of the embedded engine, which then is not started. ``model`` names the
    provider's model, or the id the engine serves its model under (default: from
    :func:`engine_model`). ``fetch_allow``: networks the fetch endpoint may reach although its
    rule refuses them (a loopback web: ``("127.0.0.1/32",)``; ``docs/proxy.md`` §10).
    ``store``: where the record goes, a SQLite file or a ``postgresql://`` URL (default, and
    until another is given: ``record.db`` in the home); kept in the home's ``store`` file, so
    that readers find it with no ``up`` running. ``HomeInUse`` when another appliance holds
    ``home`` (its ``up.lock``). ``external`` (host, port): also serve the data plane there
    over TLS with the home's TLS key (``tls.key``, made at first use), answering
    ``/attestation`` from ``evidence`` (an ``attestation.channel.EvidenceSource``; default
    none: this machine is no TEE, and ``/attestation`` says so); ``release`` is the published
    version it claims."""
    from egress_proxy.clock import Clock
    from egress_proxy.config import parse_config
    from egress_proxy.server import ProxyServer
    from record.log import Log
    from record.seal import KeyPair

    say = progress or (lambda _: None)
    if provider is not None and model is None:
        raise ValueError("a provider needs the model it serves")
    with ExitStack() as stack:
        lock = HomeLock.take(home)  # first: a second `up` is refused before any work
        stack.callback(lock.release)  # last out: the home is held until all is stopped
        _clear_stale(home, say)
        key_file = home.root / "appliance.key"
        if not key_file.is_file():
            KeyPair.generate().write(key_file)
        appliance_key = KeyPair.read(key_file)
        running: EngineProcess | None = None
        if provider is None:
            model_path, served = engine_model(home, engine, say)
            model = model or served
            say(f"starting the engine ({model}: loading and self-testing takes a few seconds)")
            running = start_engine(home, model_path, model)
            stack.callback(running.token_file.unlink, missing_ok=True)
            stack.callback(running.stop)
            provider = {
                "api": "openai",
                "base_url": running.url,
                "engine_extensions": True,
                "api_key_file": str(running.token_file),
            }
        assert model is not None  # a provider came with its model, or the engine gave one
        api = str(provider["api"])
        route = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
        servers = {name: dict(cfg) for name, cfg in (mcp_servers or {}).items()}
        messages = _messages_provider(provider)
        messages_mount = {"/v1/messages": "messages"} if messages else {}
        config = parse_config(
            {
                "listen": {"host": "127.0.0.1", "port": 0},
                "providers": {"model": dict(provider), **messages},
                "mounts": {route: "model", **_responses_mount(provider), **messages_mount},
                "fetch": {
                    "enabled": True,
                    "max_response_bytes": 1 << 20,
                    "allow": list(fetch_allow),
                },
                **({"mcp_servers": servers} if servers else {}),
            }
        )
        record_at, signing_key = _record_store(home, store)
        log = stack.enter_context(
            Log.open(record_at, signing_key=signing_key, appliance_key=appliance_key)
        )
        if store is not None:  # opened: from now on the home's store
            write_atomic(home.root / STORE_FILE, f"{store}\n".encode(), 0o600)
        socket_path = home.root / "control.sock"
        say("starting the egress proxy")
        fixed = Clock.fixed(clock) if clock is not None else None
        proxy = _proxy_on_last_port(
            home,
            say,
            lambda port: ProxyServer(
                config,
                log,
                env=env,
                control_socket=socket_path,
                clock=fixed,
                port=port,
                sessions=home.root / SESSION_BOOK,
            ),
        )
        stack.enter_context(proxy)
        write_atomic(home.root / PORT_FILE, f"{proxy.port}\n".encode(), 0o644)
        if proxy.restored.sessions:
            say(f"restored {len(proxy.restored.sessions)} sessions (same base_url and token)")
        for left, why in proxy.restored.left_out.items():
            say(f"session {left} not restored: {why}")
        appliance = Appliance(
            proxy_url=proxy.url,
            control_socket=str(socket_path),
            store=str(record_at),
            model=model,
            api="anthropic" if api == "anthropic" else "openai",
            engine_url=running.url if running is not None else None,
            external_url=None,
            search_url=search_url,
            mcp_servers={
                name: list(cfg.get("idempotent_tools", ())) for name, cfg in servers.items()
            },
            pid=os.getpid(),
            log_key=log.log_key(),
        )
        front = panel_url = None
        if external is not None:
            front, panel_token = _front(
                home, external, log, appliance_key, proxy.url, evidence, release
            )
            stack.enter_context(front)
            say(f"serving {front.url} over TLS (key sha256:{front.tls.spki_sha256.hex()})")
            appliance = appliance.model_copy(update={"external_url": front.url})
            panel_url = f"{front.url}{PANEL_ROOT}/?token={panel_token}"
        home.write_appliance(appliance)
        stack.callback(_remove_if_ours, home.appliance_file, home.appliance_file.read_bytes())
        yield RunningAppliance(home, appliance, running, proxy, log, front, panel_url)


def _front(
    home: Home,
    external: tuple[str, int],
    log: Any,
    appliance_key: Any,
    proxy_url: str,
    evidence: EvidenceSource | None,
    release: str | None,
) -> tuple[Front, str]:
    """The external TLS listener, its key the home's (made here the first time): the data
    plane relayed to the proxy, and the panel under ``/panel``, in this process (with its
    access token)."""
    from attestation.channel import ChannelIdentity, claimed_release
    from attestation.relay import Relay
    from attestation.tls_identity import TlsIdentityError, tls_identity
    from harness.front import SESSION_ROUTES, Attested, Front, NoTee
    from harness.panel.app import create_app
    from harness.panel.prefix import Prefixed
    from harness.panel.source import ApplianceSource

    host, port = external
    try:
        tls = tls_identity(home.root)
    except TlsIdentityError as exc:
        raise ExternalError(f"the TLS key: {exc}") from None
    identity = ChannelIdentity(
        log.log_key(), appliance_key.recipient.public.public_bytes_raw(), tls.spki_sha256
    )
    try:
        claimed = release or claimed_release()
        relay = Relay(proxy_url, only=SESSION_ROUTES)
        panel = create_app(ApplianceSource(home, None), root=PANEL_ROOT)
        app = Attested(
            relay, identity, evidence or NoTee(), claimed, panel=Prefixed(panel, PANEL_ROOT)
        )
        return Front(host, port, tls, app), panel.state.token
    except OSError as exc:
        raise ExternalError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _clear_stale(home: Home, say: Callable[[str], None]) -> None:
    """With the lock held, an ``appliance.json`` or ``control.sock`` here was left by an
    ``up`` that did not stop cleanly: replace it, saying so in one line. Sessions,
    checkpoints, keys and the store are never touched: a restart keeps them all."""
    left = [p for p in (home.appliance_file, home.root / "control.sock") if p.exists()]
    if not left:
        return
    recorded = home.recorded_appliance()
    by = f" (pid {recorded.pid})" if recorded is not None and recorded.pid is not None else ""
    names = " and ".join(p.name for p in left)
    say(f"replacing the {names} a stopped `affidavit up`{by} left in {home.root}")
    for path in left:
        path.unlink(missing_ok=True)


def _remove_if_ours(path: Path, written: bytes) -> None:
    """Remove ``path`` only if it still holds what this process wrote."""
    try:
        if path.read_bytes() == written:
            path.unlink()
    except FileNotFoundError:
        pass


def _proxy_on_last_port(
    home: Home, say: Callable[[str], None], build: Callable[[int], ProxyServer]
) -> ProxyServer:
    """The proxy bound to the port the last run chose (``proxy.port``), so a restart keeps
    every session's ``base_url``; a fresh port only when there was none or it is taken."""
    import errno

    last = _last_port(home)
    if last is not None:
        try:
            return build(last)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            say(f"port {last} is taken: the proxy takes a new one, and old base_urls break")
    return build(0)


def _last_port(home: Home) -> int | None:
    try:
        port = int((home.root / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def _responses_mount(provider: Mapping[str, Any]) -> dict[str, str]:
    """The engine also serves OpenAI's Responses API: mounted beside its chat route, so a
    session can speak either (the Agents SDK's default model speaks Responses)."""
    engine = provider.get("engine_extensions") and provider.get("api") == "openai"
    return {"/v1/responses": "model"} if engine else {}


def _messages_provider(provider: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The engine also serves Anthropic's Messages API: the same engine as an ``anthropic``
    provider (``messages``), mounted on ``/v1/messages``, so the ``anthropic`` SDK and a
    session labelled ``anthropic`` work against the default stack too."""
    if provider.get("engine_extensions") and provider.get("api") == "openai":
        return {"messages": {**provider, "api": "anthropic"}}
    return {}


@contextmanager
def _serve(app: Any) -> Iterator[str]:
    import socket
    import time

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("a loopback server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def load_mcp_servers(path: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``--mcp-config``: the file's servers as the proxy's ``mcp_servers`` table.

    Raises ``ConfigError`` (exit 2) naming the path of a fault, or ``ConfigMissing`` (exit 3)
    for a missing file or an unset ``${VAR}``, each variable named (never a value)."""
    from egress_proxy.errors import ConfigMissing
    from egress_proxy.mcp_config import load_mcp_config, missing_variables

    servers = load_mcp_config(path)
    unset = missing_variables(servers, os.environ if env is None else env)
    if unset:
        names = "; ".join(f"mcpServers.{place}" for place in unset)
        raise ConfigMissing(f"{path}: environment variables not set: {names}")
    return servers


def _record_store(home: Home, store: str | None) -> tuple[StoreLocation, Path | None]:
    """The record's store and, for a database, its signing key's file in the home.

    A ``--store`` given is written to the home's ``store`` file once it opens, and later
    starts and every reader then use it; without one, the file's store, else ``record.db``. A
    URL carrying a password is refused: the URL is kept in the home, so the password belongs
    in libpq's ``~/.pgpass`` or ``PGPASSWORD``.
    """
    from egress_proxy.errors import ConfigError

    if store is not None and is_url(store) and urlsplit(store).password:
        raise ConfigError(
            "--store: keep the password out of the URL (it is written to the home): "
            "use ~/.pgpass or PGPASSWORD"
        )
    where = home_store(home.root) if store is None else location(store)
    return where, home.root / SIGNING_KEY_FILE if is_url(where) else None


def serve_forever(home: Home, **options: Any) -> int:
    """Run the appliance until SIGINT or SIGTERM."""
    import sys

    from egress_proxy.errors import ConfigError

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with running_appliance(
            home, progress=lambda line: print(line, flush=True), **options
        ) as up:
            a = up.appliance
            print(f"affidavit is up: proxy {a.proxy_url}, control {a.control_socket}", flush=True)
            if a.external_url is not None:
                print(
                    f"outside users: {a.external_url} (check it first: affidavit connect "
                    f"{a.external_url} --published FILE)",
                    flush=True,
                )
                print(f"panel there: {up.panel_url}", flush=True)
            print(
                f"record {store_name(a.store)}; state in {home.root}. Ctrl-C stops it.",
                flush=True,
            )
            stop.wait()
    except EngineStartError as exc:  # its model (3; 1: a changed file, refused) or its process
        print(f"affidavit: cannot start the engine: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:  # the proxy's config (MCP servers included): 2, or 3 if missing
        print(f"affidavit: cannot start the proxy: {exc}", file=sys.stderr)
        return exc.exit_code
    except ExternalError as exc:  # --external: the address or the home's TLS key, 2
        print(f"affidavit: --external: {exc}", file=sys.stderr)
        return exc.exit_code
    except HomeInUse as exc:  # another `up` holds this home: 2, naming its pid and URL
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print("affidavit stopped", flush=True)
    return 0
