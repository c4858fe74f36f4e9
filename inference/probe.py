"""``affidavit probe``: does an endpoint answer a pinned request the same in any batch?

A reply that changes with the load on the server cannot be replayed, so this asks the
question from outside, against any OpenAI-compatible ``/v1/chat/completions``. For each of
K *probes* (a fixed prompt, ``seed``, ``temperature``, ``max_tokens`` and
``logprobs: true``) it first sends the probe alone, as the reference. Then, for each batch
size B, it sends the same probe bytes again together with B - 1 random *filler* requests,
all released at once (a thread each, behind a barrier), so the server has to batch them.
The probe streams; its text and its ``logprobs.content`` list (re-serialised from the
parsed JSON, which round-trips every float exactly) must equal the reference string for
string. Fillers ask for twice the probe's tokens, so they are still decoding while it does.

Where the endpoint reports ``reproducibility.batch_peers_max`` (this project's engines:
how many *other* requests shared a decode step with this one), a probe counts as
``batch_formed`` when it shared a step with at least one; elsewhere that column is empty
and the probe only shows that the reply did not change, not that a batch formed.

Throughput is measured on the way: ``tokens_per_s`` is every completion token of a row's
batches (probe and fillers) over their wall time, ``tpot_ms`` the probe's time per output
token between its first and last streamed token. Only the standard library is used, so the
probe runs on the base install; it connects directly, ignoring ``*_proxy`` variables.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PROBES",
    "EXIT_DIFFERENT",
    "EXIT_IDENTICAL",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "EndpointError",
    "ProbeConfig",
    "ProbeResult",
    "Row",
    "StreamedReply",
    "Unreachable",
    "base_url",
    "format_table",
    "list_models",
    "main",
    "parse_batch_sizes",
    "probe_request",
    "run_probe",
]

EXIT_IDENTICAL = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DEFAULT_PROBES = 12
DEFAULT_BATCH_SIZES = (1, 2, 8, 32)
DEFAULT_MAX_TOKENS = 32
DEFAULT_SEED = 1234
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TIMEOUT_S = 300.0

WORDS = (
    "the", "a", "river", "stone", "city", "cat", "sat", "on", "mat", "sky", "light", "old",
    "green", "runs", "under", "bridge", "quiet", "north", "wind", "tells", "story", "of",
)  # fmt: skip


class Unreachable(Exception):
    """The endpoint could not be connected to (exit 3)."""


class EndpointError(Exception):
    """The endpoint answered, but not with a usable reply (exit 1)."""


@dataclass(frozen=True)
class ProbeConfig:
    """What to probe and how hard."""

    url: str
    model: str | None = None
    probes: int = DEFAULT_PROBES
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    seed: int = DEFAULT_SEED
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: sent as the Bearer credential (an engine behind a token file); never shown
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StreamedReply:
    """What of a streamed reply is compared, and what it tells about timing and batching."""

    content: str
    logprobs: str
    finish_reason: str | None
    tokens: int
    tpot_s: float | None
    peers: int | None

    def same_as(self, other: StreamedReply) -> bool:
        """Bit for bit: the text, the logprobs JSON and the finish reason."""
        return (self.content, self.logprobs, self.finish_reason) == (
            other.content,
            other.logprobs,
            other.finish_reason,
        )


@dataclass(frozen=True)
class Row:
    """One batch size: how many probes came back identical, and the speed on the way.

    ``batch_formed`` counts probes that shared a decode step with another request, ``None``
    for batch 1 or where the endpoint does not report peers; ``peers_max`` is the largest
    ``batch_peers_max`` reported.
    """

    batch_size: int
    probes: int
    identical: int
    tokens_per_s: float
    tpot_ms: float | None
    batch_formed: int | None
    peers_max: int | None


@dataclass(frozen=True)
class ProbeResult:
    """The table's rows, and a line for each probe that differed."""

    url: str
    model: str
    config: ProbeConfig
    rows: tuple[Row, ...]
    differences: tuple[str, ...]

    @property
    def all_identical(self) -> bool:
        return all(row.identical == row.probes for row in self.rows)

    def to_json(self) -> dict[str, Any]:
        """``{"url", "model", "rows": [...]}``, the shape ``--json`` prints."""
        return {"url": self.url, "model": self.model, "rows": [asdict(r) for r in self.rows]}


def base_url(url: str) -> str:
    """``http(s)://host:port[/prefix]`` without a trailing ``/`` or ``/v1``; ``ValueError`` else."""
    trimmed = url.strip().rstrip("/")
    parts = urllib.parse.urlsplit(trimmed)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ValueError(f"--url must be an http:// or https:// URL, not {url!r}")
    return trimmed.removesuffix("/v1")


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,8"`` → ``(1, 2, 8)``: positive, distinct, in the order given."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"batch sizes must be comma-separated integers, not {text!r}") from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"batch sizes must be distinct and >= 1, not {text!r}")
    return sizes


def probe_request(model: str, index: int, config: ProbeConfig) -> dict[str, Any]:
    """Probe ``index``: the same bytes every time it is sent, alone or in a batch."""
    rng = random.Random(config.seed * 1_000_003 + index)
    words = " ".join(rng.choices(WORDS, k=8))
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Probe {index}: {words}"}],
        "seed": config.seed + index,
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
        "logprobs": True,
        "stream": True,
    }


def _filler(model: str, rng: random.Random, max_tokens: int) -> dict[str, Any]:
    words = " ".join(rng.choices(WORDS, k=rng.randint(3, 24)))
    return {
        "model": model,
        "messages": [{"role": "user", "content": words}],
        "seed": rng.randrange(2**31),
        "temperature": 1.0,
        "max_tokens": 2 * max_tokens,
    }


class _Client:
    """JSON over HTTP with the standard library, without any proxy."""

    def __init__(self, url: str, timeout_s: float, token: str | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.token = token
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _open(self, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data)
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            return self._opener.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise EndpointError(f"{path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach {self.url}: {reason}") from None

    @contextlib.contextmanager
    def _reading(self, path: str) -> Iterator[None]:
        """A reply cut short or not JSON is the endpoint's problem, not a traceback."""
        try:
            yield
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise EndpointError(f"{path}: unreadable reply: {exc!r}") from None

    def get(self, path: str) -> dict[str, Any]:
        with self._reading(path), self._open(path, None) as response:
            return _object(json.loads(response.read()), path)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._reading(path), self._open(path, body) as response:
            return _object(json.loads(response.read()), path)

    def stream(self, path: str, body: dict[str, Any]) -> StreamedReply:
        """Send a streaming request and gather its text, logprobs, timing and peers."""
        parts: list[str] = []
        entries: list[Any] = []
        stamps: list[float] = []
        finish: str | None = None
        peers: int | None = None
        with self._reading(path), self._open(path, body) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                event = _object(json.loads(payload), path)
                if "error" in event:
                    raise EndpointError(f"{path}: error event: {event['error']}")
                block = event.get("reproducibility")
                if isinstance(block, dict) and isinstance(block.get("batch_peers_max"), int):
                    peers = block["batch_peers_max"]
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        parts.append(delta["content"])
                    content = (choice.get("logprobs") or {}).get("content") or []
                    entries.extend(content)
                    stamps.extend([time.perf_counter()] * len(content))
                    finish = choice.get("finish_reason") or finish
        tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
        return StreamedReply(
            content="".join(parts),
            logprobs=json.dumps(entries, ensure_ascii=False, sort_keys=True),
            finish_reason=finish,
            tokens=len(entries),
            tpot_s=tpot,
            peers=peers,
        )


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EndpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def list_models(url: str, timeout_s: float = 30.0, token: str | None = None) -> list[str]:
    """The model ids of ``/v1/models``; :class:`Unreachable` if nothing answers."""
    data = _Client(base_url(url), timeout_s, token).get("/v1/models").get("data")
    cards = data if isinstance(data, list) else []
    return [str(m["id"]) for m in cards if isinstance(m, dict) and "id" in m]


def _completion_tokens(reply: dict[str, Any]) -> int:
    usage = reply.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0


def _first_difference(alone: StreamedReply, batched: StreamedReply) -> str:
    mine, theirs = json.loads(batched.logprobs), json.loads(alone.logprobs)
    for position, (a, b) in enumerate(zip(theirs, mine, strict=False)):
        if a != b:
            return f"token {position}: alone {json.dumps(a)[:120]} batched {json.dumps(b)[:120]}"
    if len(mine) != len(theirs):
        return f"{len(theirs)} tokens alone, {len(mine)} batched"
    return f"text alone {alone.content[:60]!r}, batched {batched.content[:60]!r}"


def run_probe(config: ProbeConfig, *, progress: TextIO | None = None) -> ProbeResult:
    """Probe the endpoint: the reference replies, then every batch size in turn."""
    url = base_url(config.url)
    client = _Client(url, config.timeout_s, config.token)
    model = config.model
    if model is None:
        models = list_models(url, config.timeout_s, config.token)
        if not models:
            raise EndpointError("/v1/models lists no model; pass --model")
        model = models[0]
    probes = [probe_request(model, k, config) for k in range(config.probes)]
    reference = [client.stream("/v1/chat/completions", p) for p in probes]
    rows: list[Row] = []
    differences: list[str] = []
    with ThreadPoolExecutor(max_workers=max(config.batch_sizes)) as pool:
        for size in config.batch_sizes:
            identical = tokens = 0
            seconds = 0.0
            tpots: list[float] = []
            peers: list[int] = []
            for index, probe in enumerate(probes):
                rng = random.Random(config.seed * 7919 + size * 1009 + index)
                fillers = [_filler(model, rng, config.max_tokens) for _ in range(size - 1)]
                reply, filled, took = _batch(client, pool, probe, fillers)
                tokens += reply.tokens + filled
                seconds += took
                if reply.tpot_s is not None:
                    tpots.append(reply.tpot_s)
                if reply.peers is not None:
                    peers.append(reply.peers)
                if reply.same_as(reference[index]):
                    identical += 1
                else:
                    detail = _first_difference(reference[index], reply)
                    differences.append(f"probe {index} in a batch of {size} differs: {detail}")
            reported = len(peers) == len(probes)
            row = Row(
                batch_size=size,
                probes=len(probes),
                identical=identical,
                tokens_per_s=round(tokens / seconds, 2) if seconds > 0 else 0.0,
                tpot_ms=round(1000 * sum(tpots) / len(tpots), 3) if tpots else None,
                batch_formed=sum(p >= 1 for p in peers) if reported and size > 1 else None,
                peers_max=max(peers) if reported else None,
            )
            rows.append(row)
            if progress is not None:
                print(f"batch {size}: {identical}/{len(probes)} identical", file=progress)
    return ProbeResult(url, model, config, tuple(rows), tuple(differences))


def _batch(
    client: _Client,
    pool: ThreadPoolExecutor,
    probe: dict[str, Any],
    fillers: Sequence[dict[str, Any]],
) -> tuple[StreamedReply, int, float]:
    """Release the probe and its fillers together: its reply, the fillers' tokens, the time."""
    gate = threading.Barrier(len(fillers) + 1, timeout=client.timeout_s)

    def fill(body: dict[str, Any]) -> int:
        gate.wait()
        return _completion_tokens(client.post("/v1/chat/completions", body))

    def send_probe() -> StreamedReply:
        gate.wait()
        return client.stream("/v1/chat/completions", probe)

    started = time.perf_counter()
    filled = [pool.submit(fill, body) for body in fillers]
    mine = pool.submit(send_probe)
    try:
        reply = mine.result()
        tokens = sum(f.result() for f in filled)
    except threading.BrokenBarrierError:
        raise EndpointError("the batch's requests could not be released together") from None
    return reply, tokens, time.perf_counter() - started


def format_table(result: ProbeResult) -> str:
    """The human-readable report: one line per batch size."""
    c = result.config
    lines = [
        f"determinism probe of {result.url}, model {result.model!r}: {c.probes} probes, "
        f"max_tokens {c.max_tokens}, temperature {c.temperature}, seeds {c.seed}..",
        f"{'batch':>5}  {'probes':>6}  {'identical':>14}  {'batch_formed':>12}  "
        f"{'peers_max':>9}  {'tokens/s':>10}  {'tpot_ms':>9}",
    ]
    for row in result.rows:
        share = f"{row.identical} ({100 * row.identical / row.probes:.0f}%)"
        formed = "-" if row.batch_formed is None else f"{row.batch_formed}/{row.probes}"
        peers = "-" if row.peers_max is None else str(row.peers_max)
        tpot = "-" if row.tpot_ms is None else f"{row.tpot_ms:.2f}"
        lines.append(
            f"{row.batch_size:>5}  {row.probes:>6}  {share:>14}  {formed:>12}  "
            f"{peers:>9}  {row.tokens_per_s:>10.1f}  {tpot:>9}"
        )
    verdict = "all probes bit-identical" if result.all_identical else "SOME PROBES DIFFER"
    lines.append(verdict)
    return "\n".join(lines)


def main(config: ProbeConfig, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Run and report: 0 all identical, 1 any differ (or a bad reply), 3 unreachable."""
    try:
        result = run_probe(config, progress=None if as_json else err)
    except Unreachable as exc:
        print(f"affidavit: missing: {exc}", file=err)
        return EXIT_UNREACHABLE
    except EndpointError as exc:
        print(f"affidavit: the endpoint gave an unusable reply: {exc}", file=err)
        return EXIT_DIFFERENT
    for line in result.differences:
        print(line, file=err)
    if as_json:
        print(json.dumps(result.to_json()), file=out)
    else:
        print(format_table(result), file=out)
    return EXIT_IDENTICAL if result.all_identical else EXIT_DIFFERENT
