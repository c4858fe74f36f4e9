"""``affidavit up``: the appliance on this machine, for the harness commands to use.

It starts the embedded engine (SmolLM2-135M-Instruct unless ``--model`` names another:
another known name, ``tiny`` for the random test model, or a model folder or ``.gguf``
file), the
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

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.state import Appliance, Home, HomeInUse, HomeLock, write_atomic

if TYPE_CHECKING:
    from egress_proxy.server import ProxyServer

__all__ = [
    "DEFAULT_MODEL",
    "TINY_MODEL",
    "RunningAppliance",
    "engine_model",
    "running_appliance",
    "serve_forever",
]

#: The model ``affidavit up`` and ``make demo`` serve unless told otherwise (pulled from PyPI).
DEFAULT_MODEL = "smollm2-135m"
#: The random tiny model (``affidavit engine make-model``): fast, deterministic, nonsense.
TINY_MODEL = "tiny"
#: In the state folder: the proxy's last port, and its session book (``egress_proxy.session_book``).
PORT_FILE = "proxy.port"
SESSION_BOOK = "proxy-sessions.db"
_TINY_NAME = "affidavit-tiny"


def engine_model(home: Home, spec: str | Path, progress: Any = None) -> tuple[Path, str]:
    """The checkpoint ``spec`` names and the model id it is served under.

    ``spec`` is a name :mod:`inference.pull` knows (pulled into its cache when missing),
    ``tiny`` (made in the state folder when missing), or a model folder or ``.gguf`` file.
    """
    from inference.pull import KNOWN_MODELS, ensure_model

    say = progress or (lambda _: None)
    if spec == TINY_MODEL:
        from inference.make_model import make_model

        path = home.root / "model"
        if not (path / "config.json").is_file():
            say("making the random tiny model")
            make_model(path)
        return path, _TINY_NAME
    if isinstance(spec, str) and spec in KNOWN_MODELS:
        return ensure_model(spec, progress=say), spec
    path = Path(spec)
    if not path.exists():
        known = ", ".join([*KNOWN_MODELS, TINY_MODEL])
        raise FileNotFoundError(
            f"model {str(spec)!r} is neither a known model ({known}) nor a path"
        )
    return path, path.stem if path.is_file() else path.name


@dataclass
class RunningAppliance:
    home: Home
    appliance: Appliance
    engine: Any  # inference.server.Engine (None: another provider is behind the proxy)
    proxy: Any  # egress_proxy.server.ProxyServer
    log: Any  # record.log.Log


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
) -> Iterator[RunningAppliance]:
    """Engine, proxy and control plane, running until the block ends. ``engine`` is the
    embedded engine's model (:func:`engine_model`). ``clock`` fixes the instant the proxy
    injects (tests: the model's output then depends on nothing else). ``provider`` (a proxy
    provider table: ``api``, ``base_url``, ``api_key_env`` …) puts that provider behind the
    proxy instead of the embedded engine, which then is not started. ``model`` names the
    provider's model, or the id the engine serves its model under (default: from
    :func:`engine_model`). ``fetch_allow``: networks the fetch endpoint may reach although its
    rule refuses them (a loopback web: ``("127.0.0.1/32",)``; ``docs/proxy.md`` §10).
    ``HomeInUse`` when another appliance holds ``home`` (its ``up.lock``)."""
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
        if provider is None:
            import torch

            torch.set_num_threads(1)  # two cores: the proxy and the harness need the other
            model_path, served = engine_model(home, engine, say)
            model = model or served
        key_file = home.root / "appliance.key"
        if not key_file.is_file():
            KeyPair.generate().write(key_file)
        appliance_key = KeyPair.read(key_file)
        running, engine_url = None, None
        if provider is None:
            from inference.engine_token import new_token, write_token_file
            from inference.server import Engine, create_app

            say(f"starting the engine ({model}: loading and self-testing takes a few seconds)")
            running = Engine(model_path, model_name=model).start()
            stack.callback(running.close)
            token = new_token()  # this run's: the proxy holds it, the engine answers no one else
            token_file = write_token_file(home.root / "engine.token", token)
            stack.callback(token_file.unlink, missing_ok=True)
            engine_url = stack.enter_context(_serve(create_app(running, token=token)))
            provider = {
                "api": "openai",
                "base_url": engine_url,
                "engine_extensions": True,
                "api_key_file": str(token_file),
            }
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
        store = home.root / "record.db"
        log = stack.enter_context(Log.open(store, appliance_key=appliance_key))
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
            store=str(store),
            model=model,
            api="anthropic" if api == "anthropic" else "openai",
            engine_url=engine_url,
            search_url=search_url,
            mcp_servers={
                name: list(cfg.get("idempotent_tools", ())) for name, cfg in servers.items()
            },
            pid=os.getpid(),
        )
        home.write_appliance(appliance)
        stack.callback(_remove_if_ours, home.appliance_file, home.appliance_file.read_bytes())
        yield RunningAppliance(home, appliance, running, proxy, log)


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


def serve_forever(home: Home, **options: Any) -> int:
    """Run the appliance until SIGINT or SIGTERM."""
    import sys

    from egress_proxy.errors import ConfigError
    from inference.config import UnsupportedModelError
    from inference.pull import PullError

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with running_appliance(
            home, progress=lambda line: print(line, flush=True), **options
        ) as up:
            a = up.appliance
            print(f"affidavit is up: proxy {a.proxy_url}, control {a.control_socket}", flush=True)
            print(f"record {a.store}; state in {home.root}. Ctrl-C stops it.", flush=True)
            stop.wait()
    except (PullError, FileNotFoundError, UnsupportedModelError) as exc:
        code = exc.exit_code if isinstance(exc, PullError) else 3  # 1: a changed model file
        print(f"affidavit: cannot start the engine: {exc}", file=sys.stderr)
        return code
    except ConfigError as exc:  # the proxy's config (MCP servers included): 2, or 3 if missing
        print(f"affidavit: cannot start the proxy: {exc}", file=sys.stderr)
        return exc.exit_code
    except HomeInUse as exc:  # another `up` holds this home: 2, naming its pid and URL
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print("affidavit stopped", flush=True)
    return 0
