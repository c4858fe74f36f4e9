"""``affidavit engine …``: the embedded engine's commands.

``harness.cli`` builds the top-level parser and calls :func:`add_commands`. Importing this
module must work on the base install (no torch: an auditor's machine), so everything of the
engine is imported inside the command, and a missing engine dependency becomes exit code 3
with the install hint rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys

__all__ = [
    "EXIT_MISSING",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "add_commands",
    "run_make_model",
    "run_probe",
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


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``engine make-model DIR`` and ``engine serve`` on the top-level subparsers."""
    engine = sub.add_parser("engine", help="the embedded CPU inference engine")
    commands = engine.add_subparsers(dest="engine", required=True)
    make = commands.add_parser(
        "make-model",
        help="write the small model that ships with the product (deterministic)",
        description=(
            "Write a tiny Qwen3-architecture checkpoint (config, safetensors weights from a "
            "fixed seed, a byte-level BPE tokenizer, a chat template with tool calls) into "
            "DIR, and check its digests against the committed known answers."
        ),
    )
    make.add_argument("dir", metavar="DIR", help="directory to create (absent or empty)")
    make.set_defaults(func=run_make_model)
    serve = commands.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description=(
            "Serve /v1/chat/completions (JSON and SSE) and /v1/models for the model in DIR, "
            "with continuous batching, a salted prefix cache and a reproducibility block on "
            "every reply. The start-up self-test picks a batch-invariant matmul path."
        ),
    )
    serve.add_argument("--model", required=True, metavar="DIR", help="model directory")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    serve.add_argument("--model-name", help="the served model id (default: DIR's name)")
    serve.add_argument(
        "--no-batch-invariance",
        dest="batch_invariance",
        action="store_false",
        help="use the stock matmul path (faster; replies may change with the batch)",
    )
    serve.add_argument("--max-batch", type=int, default=64, help="running sequences at most")
    serve.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=65536,
        help="token positions the prefix cache keeps (0 turns it off)",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn's log level")
    serve.set_defaults(func=run_serve)
    _add_vllm_backend(serve)
    _add_probe(sub)


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
    serve(engine, host=args.host, port=args.port, log_level=args.log_level)
    return 0


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
    print(f"wrote {made.path}")
    print(f"weights_digest {made.weights_digest}")
    expected, got = known_answers(), made.answers()
    differing = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    if differing:
        print(
            f"affidavit: the model differs from the known answers in {KNOWN_ANSWERS.name}: "
            f"{', '.join(differing)}",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    print(f"matches the known answers ({KNOWN_ANSWERS.name})")
    return 0


def _add_vllm_backend(serve: argparse.ArgumentParser) -> None:
    """``engine serve --backend vllm``: the same command, vLLM on a GPU behind a front."""
    serve.add_argument(
        "--backend",
        choices=("embedded", "vllm"),
        default="embedded",
        help="embedded: this CPU engine; vllm: start `vllm serve` (batch-invariant) and "
        "front it with the reproducibility block (needs the `gpu` extra)",
    )
    vllm = serve.add_argument_group("vllm backend")
    vllm.add_argument("--seed", type=int, default=0, help="vLLM's fixed --seed (0)")
    vllm.add_argument(
        "--max-model-len",
        type=int,
        help="context length (default: config.json); the batch token budget is at least this",
    )
    vllm.add_argument(
        "--upstream-port", type=int, default=0, help="vLLM's own loopback port (0: any free one)"
    )
    vllm.add_argument(
        "--startup-timeout", type=float, default=1800.0, help="seconds to wait for vLLM (1800)"
    )
    vllm.add_argument(
        "--vllm-arg",
        action="append",
        metavar="ARG",
        help="one more argument for `vllm serve` (repeatable; use --vllm-arg=--flag)",
    )
    serve.set_defaults(func=run_serve_backend)


def run_serve_backend(args: argparse.Namespace) -> int:
    """``engine serve``: the embedded engine, or vLLM behind the front (``--backend``)."""
    if args.backend != "vllm":
        return run_serve(args)
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


def _add_probe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``affidavit probe``: the determinism probe of any OpenAI-compatible endpoint."""
    from inference.probe import DEFAULT_MAX_TOKENS, DEFAULT_PROBES

    probe = sub.add_parser(
        "probe",
        help="check that an OpenAI-compatible endpoint answers the same in any batch",
        description=(
            "Send K pinned probe requests alone and again inside batches of concurrent "
            "random requests, and compare each probe's text and logprobs bit for bit with "
            "the probe alone. Prints identical probes, tokens/s and time per output token "
            "per batch size. Exit 0 all identical, 1 any differ, 2 usage, 3 unreachable."
        ),
    )
    probe.add_argument("--url", required=True, help="the endpoint, e.g. http://127.0.0.1:8000")
    probe.add_argument("--model", help="the model id (default: the first of /v1/models)")
    probe.add_argument(
        "--probes", type=_positive, default=DEFAULT_PROBES, help="pinned probes (12)"
    )
    probe.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=None,
        help="comma-separated batch sizes, the probe counted (1,2,8,32)",
    )
    probe.add_argument(
        "--max-tokens",
        type=_positive,
        default=DEFAULT_MAX_TOKENS,
        help=f"tokens per probe ({DEFAULT_MAX_TOKENS})",
    )
    probe.add_argument("--json", action="store_true", help="print one JSON object, no table")
    probe.set_defaults(func=run_probe)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _batch_sizes(text: str) -> tuple[int, ...]:
    from inference.probe import parse_batch_sizes

    try:
        return parse_batch_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_probe(args: argparse.Namespace) -> int:
    """Probe ``--url``: 0 all identical, 1 any differ, 2 bad URL, 3 unreachable."""
    from inference import probe

    try:
        url = probe.base_url(args.url)
    except ValueError as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = probe.ProbeConfig(
        url=url,
        model=args.model,
        probes=args.probes,
        batch_sizes=args.batch_sizes or probe.DEFAULT_BATCH_SIZES,
        max_tokens=args.max_tokens,
    )
    return probe.main(config, as_json=args.json, out=sys.stdout, err=sys.stderr)
