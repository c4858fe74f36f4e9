"""The reproducibility block, the reply identity a pinned request derives, and the reply.

Every reply carries a ``reproducibility`` object naming what produced it: the weights
(by digest), the engine and torch builds, the MKL version and CBWR branch, the linear path
the start-up self-test picked, the cache mode, the sampling settings, and where it ran
(``tee_type``/``image_digest`` from the enclave's environment). The proxy records it next
to the reply, so a later divergence can be traced to whichever of these changed.

For a pinned request (``seed`` given) the reply must be a pure function of the request
bytes, so the reply's ``id``, the block's ``request_id`` and ``created`` are derived from
those bytes and the clock they carry: ``created`` is the request's ``clock`` instant, or
**0 when a pinned request carries no clock** (never the wall clock). Unpinned requests get
random ids and, without a clock, the wall-clock time.

Two block members describe the run rather than the request, and so are the only ones that
can differ between runs of the same pinned bytes: ``batch_peers_max`` (how many other
requests shared a decode step) and, in shared cache mode only, ``cached_tokens``.

:class:`Reply` puts a finished sequence into OpenAI's shapes around these: the message or
its tool calls (ids derived from the prompt digest and seed, never random), the finish
reason, ``usage``, and the chunks of a stream, whose framing depends on the tokens alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib import metadata
from typing import Any

import torch

from inference.constrained import ToolCallGrammar, parse_tool_calls
from inference.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    FinishReason,
    Message,
    PromptTokensDetails,
    TokenLogprob,
    TokenTable,
    ToolCall,
    Usage,
)
from inference.scheduler import Finished
from inference.tool_calls import derived_tool_call_ids, openai_tool_calls
from record.digest import Domain, canonical_json, digest, digest_hex

__all__ = [
    "EngineInfo",
    "Reply",
    "ReplyIdentity",
    "engine_version",
    "mkl_version",
    "prompt_tokens_digest",
    "reply_identity",
    "reproducibility_block",
    "system_fingerprint",
]

ENGINE_NAME = "affidavit-embedded"


def engine_version() -> str:
    """The installed ``affidavit`` version (``0+unknown`` when run from a bare checkout)."""
    try:
        return metadata.version("affidavit")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def mkl_version() -> str | None:
    """The MKL build torch links, from ``torch.__config__.show()``; ``None`` without MKL."""
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        return None
    found = re.search(r"Math Kernel Library Version (.+?) for ", torch.__config__.show())
    return found.group(1) if found else "unknown"


def system_fingerprint(weights_digest: str, engine: str, invariance_path: str) -> str:
    """``fp_`` and 16 hex digits of SHA-256 over (weights digest, engine, linear path)."""
    material = canonical_json([weights_digest, engine, invariance_path])
    return "fp_" + hashlib.sha256(material).hexdigest()[:16]


@dataclass(frozen=True)
class EngineInfo:
    """The block members that are fixed for the life of the server."""

    model: str
    weights_digest: str
    weights_source: dict[str, Any] | None
    engine: str
    torch_version: str
    mkl_version: str | None
    mkl_cbwr: str | None
    device: str
    dtype: str
    batch_invariance: bool
    invariance_path: str
    tee_type: str
    image_digest: str | None
    system_fingerprint: str

    @classmethod
    def collect(
        cls,
        *,
        model: str,
        weights_digest: str,
        invariance_path: str,
        batch_invariance: bool,
        weights_source: dict[str, Any] | None = None,
    ) -> EngineInfo:
        """Read the builds and the enclave environment (``AFFIDAVIT_TEE_TYPE``, …)."""
        engine = f"{ENGINE_NAME}/{engine_version()}"
        return cls(
            model=model,
            weights_digest=weights_digest,
            weights_source=weights_source,
            engine=engine,
            torch_version=torch.__version__,
            mkl_version=mkl_version(),
            mkl_cbwr=os.environ.get("MKL_CBWR"),
            device="cpu",
            dtype="float32",
            batch_invariance=batch_invariance,
            invariance_path=invariance_path,
            tee_type=os.environ.get("AFFIDAVIT_TEE_TYPE") or "none",
            image_digest=os.environ.get("AFFIDAVIT_IMAGE_DIGEST") or None,
            system_fingerprint=system_fingerprint(weights_digest, engine, invariance_path),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


@dataclass(frozen=True)
class ReplyIdentity:
    """The reply's ``id``, the block's ``request_id`` and ``created`` (Unix seconds)."""

    id: str
    request_id: str
    created: int


def reply_identity(body: bytes, *, pinned: bool, clock: datetime | None) -> ReplyIdentity:
    """Derived from the request bytes when pinned, random otherwise (module docstring)."""
    if pinned:
        h = digest_hex(Domain.REQUEST, body)[:32]
        created = int(clock.timestamp()) if clock is not None else 0
        return ReplyIdentity(f"chatcmpl-{h}", f"req_{h}", created)
    h = uuid.uuid4().hex
    created = int(clock.timestamp()) if clock is not None else int(time.time())
    return ReplyIdentity(f"chatcmpl-{h}", f"req_{h}", created)


def prompt_tokens_digest(token_ids: list[int]) -> str:
    """``sha256:…`` of domain 0x0D and the canonical JSON list of the prompt's token ids."""
    return digest(Domain.PROMPT_TOKENS, canonical_json(list(token_ids)))


def reproducibility_block(
    info: EngineInfo,
    *,
    request_id: str,
    seed: int,
    temperature: float,
    top_p: float,
    top_k: int,
    max_tokens: int,
    clock: str | None,
    kv_cache_mode: str,
    cached_tokens: int,
    batch_peers_max: int,
    prompt_digest: str,
    prompt_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """The block of one reply, members in a fixed order (the bytes are compared).

    ``prompt_tokens_digest`` (domain 0x0D over the canonical JSON list of the prompt's token
    ids) names what the model actually ran: the same ``prompt_digest`` rendered by another
    template or tokenizer gives another one. ``None`` where the engine does not know them.
    """
    return {
        "request_id": request_id,
        "seed": seed,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "max_tokens": max_tokens,
        "clock": clock,
        "model": info.model,
        "weights_digest": info.weights_digest,
        "weights_source": info.weights_source,
        "engine": info.engine,
        "torch_version": info.torch_version,
        "mkl_version": info.mkl_version,
        "mkl_cbwr": info.mkl_cbwr,
        "device": info.device,
        "dtype": info.dtype,
        "batch_invariance": info.batch_invariance,
        "invariance_path": info.invariance_path,
        "kv_cache_mode": kv_cache_mode,
        "cached_tokens": cached_tokens,
        "batch_peers_max": batch_peers_max,
        "tee_type": info.tee_type,
        "image_digest": info.image_digest,
        "prompt_digest": prompt_digest,
        "prompt_tokens_digest": (
            None if prompt_token_ids is None else prompt_tokens_digest(prompt_token_ids)
        ),
        "system_fingerprint": info.system_fingerprint,
    }


@dataclass
class Reply:
    """Everything a reply needs beyond the scheduler's events."""

    identity: ReplyIdentity
    model: str
    fingerprint: str
    block: dict[str, Any]
    tool_mode: str
    grammar: ToolCallGrammar | None
    prompt_digest: str
    seed: int
    logprobs: bool
    stream: bool
    include_usage: bool
    tokens: TokenTable

    def outcome(self, done: Finished) -> tuple[str | None, list[ToolCall], FinishReason]:
        """``(content, tool_calls, finish_reason)`` of a finished sequence."""
        calls: list[tuple[str, str]] = []
        content: str | None = done.text
        if self.grammar is not None:
            calls = self.grammar.calls()
            content = None if calls else done.text
        elif self.tool_mode == "auto":
            content, calls = parse_tool_calls(done.text)
        if calls and not content:
            content = None
        ids = derived_tool_call_ids(self.prompt_digest, self.seed, len(calls))
        tool_calls = [ToolCall.model_validate(c) for c in openai_tool_calls(calls, ids)]
        reason: FinishReason = "stop"
        if done.reason == "length":
            reason = "length"
        elif calls:
            reason = "tool_calls"
        return content, tool_calls, reason

    def usage(self, done: Finished) -> Usage:
        """Token counts, the prefix-cache share of the prompt included."""
        completion = len(done.token_ids)
        return Usage(
            prompt_tokens=done.prompt_tokens,
            completion_tokens=completion,
            total_tokens=done.prompt_tokens + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=done.cached_tokens),
        )

    def final_block(self, done: Finished) -> dict[str, Any]:
        """The block with what only the run knows: cache reuse and batch peers."""
        return dict(
            self.block, cached_tokens=done.cached_tokens, batch_peers_max=done.batch_peers_max
        )

    def completion(self, done: Finished, entries: list[TokenLogprob]) -> ChatCompletion:
        """The non-streaming ``chat.completion``."""
        content, tool_calls, reason = self.outcome(done)
        return ChatCompletion(
            id=self.identity.id,
            created=self.identity.created,
            model=self.model,
            choices=[
                Choice(
                    message=Message(content=content, tool_calls=tool_calls or None),
                    logprobs=ChoiceLogprobs(content=entries) if self.logprobs else None,
                    finish_reason=reason,
                )
            ],
            usage=self.usage(done),
            system_fingerprint=self.fingerprint,
            reproducibility=self.final_block(done),
        )

    def chunk(
        self,
        delta: dict[str, Any] | None,
        *,
        logprobs: ChoiceLogprobs | None = None,
        finish_reason: FinishReason | None = None,
    ) -> bytes:
        """One ``chat.completion.chunk`` event; ``delta=None`` makes a choice-less chunk."""
        choices = []
        if delta is not None:
            choices = [ChunkChoice(delta=delta, logprobs=logprobs, finish_reason=finish_reason)]
        return self._chunk(choices).sse()

    def trailer(self, done: Finished) -> bytes:
        """The last event: no choices, the block (and ``usage`` when it was asked for)."""
        chunk = self._chunk([])
        chunk.reproducibility = self.final_block(done)
        chunk.usage = self.usage(done) if self.include_usage else None
        return chunk.sse()

    def _chunk(self, choices: list[ChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.identity.id,
            created=self.identity.created,
            model=self.model,
            system_fingerprint=self.fingerprint,
            choices=choices,
        )
