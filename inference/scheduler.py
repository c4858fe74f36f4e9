"""Continuous batching: one thread runs every sequence, one decode step at a time.

Each step of the loop (:meth:`Scheduler._run`):

1. admit the waiting requests: each is prefilled in one shot (from position 0, or after
   a prefix the :class:`~inference.prefix_cache.PrefixCache` of its scope held), those
   admitted together in one forward pass, and its first token is sampled from the prefill
   logits;
2. run one :meth:`DecoderModel.decode` over every running sequence;
3. sample each sequence's row with that request's own :class:`Sampler`, whose generator
   is seeded from the request's seed alone.

Requests never share a cache or a generator, and the model's rows, prefill or decode, do
not depend on the batch (see :mod:`inference.invariant`), so a pinned request draws the
same tokens however many others run beside it. Each sequence records the largest number
of other sequences it shared a decode step with (``batch_peers_max``), so a test can show
that a batch formed.

Results go to a per-request *sink*, a callable run on this thread (the server's sink hands
each event to its event loop with ``call_soon_threadsafe``). Text is released as it becomes
final: held back while it could still grow into a stop string or a tool-call tag, or ends
in an incomplete UTF-8 character.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from inference.cache import SequenceCache
from inference.model import DecoderModel
from inference.prefix_cache import PrefixCache
from inference.sampling import SampledToken, Sampler, SamplingParams

__all__ = [
    "Constraint",
    "Event",
    "Finished",
    "Job",
    "Scheduler",
    "SchedulerStats",
    "TextTracker",
    "Ticket",
    "TokenEvent",
]

log = logging.getLogger("affidavit.engine")

FinishReason = Literal["stop", "length", "cancelled", "error"]


class Constraint(Protocol):
    """What constrained decoding needs of a grammar (:class:`ToolCallGrammar` fits)."""

    def allowed(self) -> torch.Tensor: ...

    def advance(self, token_id: int) -> None: ...

    @property
    def complete(self) -> bool: ...


@dataclass
class Job:
    """One request's generation, as the scheduler runs it.

    ``scope`` is the prefix-cache scope, or ``None`` for strict mode (the shared cache is
    neither read nor written). ``allowed`` is a fixed token mask (e.g. no tool-call tag
    when ``tool_choice`` is ``none``); ``constraint`` a grammar that narrows it each step.
    ``stream_text=False`` releases no text while generating (tool-call markup).
    """

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    stop: tuple[str, ...] = ()
    hold: tuple[str, ...] = ()
    allowed: torch.Tensor | None = None
    constraint: Constraint | None = None
    scope: str | None = None
    stream_text: bool = True


#: The most prompt tokens prefilled together in one forward pass.
PREFILL_PASS_TOKENS = 4096


@dataclass(frozen=True)
class TokenEvent:
    """A sampled token and the text it released (``""`` while text is held back)."""

    token: SampledToken
    text: str


@dataclass(frozen=True)
class Finished:
    """The end of a sequence. ``tail`` is released text no token event carried yet.

    ``text`` is the whole reply text (cut before a stop string when one matched);
    ``reason`` is ``stop`` for an end token, a stop string or a completed constraint.
    """

    reason: FinishReason
    token_ids: tuple[int, ...]
    text: str
    tail: str
    prompt_tokens: int
    cached_tokens: int
    batch_peers_max: int
    constraint_complete: bool
    error: str | None = None


Event = TokenEvent | Finished
Sink = Callable[[Event], None]


@dataclass(frozen=True)
class SchedulerStats:
    """Counters for the debug endpoint; ``running`` returns to 0 when nothing is left."""

    running: int
    waiting: int
    steps: int
    admitted: int
    finished: int
    cancelled: int
    paused: bool


class TextTracker:
    """Incremental text of a token stream, cut at stop strings, released when final."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        stop: Sequence[str] = (),
        hold: Sequence[str] = (),
        *,
        release: bool = True,
    ) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = tuple(hold)
        self._release = release
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> str:
        """The text newly released by the tokens so far; sets :attr:`stopped` on a match."""
        self.text = self._decode(token_ids)
        cut = min((i for s in self._stop if (i := self.text.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._release_to(len(self.text))
        limit = len(self.text.rstrip("\ufffd"))
        for marker in self._hold:
            found = self.text.find(marker)
            if found >= 0:
                limit = min(limit, found)
        return self._release_to(limit - self._partial(limit))

    def _partial(self, limit: int) -> int:
        """Length of the longest end of ``text[:limit]`` that could begin a stop or marker."""
        longest = 0
        for s in self._stop + self._hold:
            for k in range(min(len(s) - 1, limit), longest, -1):
                if self.text.endswith(s[:k], 0, limit):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        """At the end: everything not yet released, except from a held marker on."""
        limit = len(self.text)
        for marker in self._hold:
            found = self.text.find(marker)
            if found >= 0:
                limit = min(limit, found)
        return self._release_to(limit)

    def _release_to(self, limit: int) -> str:
        if not self._release or limit <= self.emitted:
            return ""
        delta = self.text[self.emitted : limit]
        self.emitted = limit
        return delta


class Ticket:
    """The submitter's hold on a request: cancel it (a client went away)."""

    def __init__(self, scheduler: Scheduler, seq: _Seq) -> None:
        self._scheduler = scheduler
        self._seq = seq

    def cancel(self) -> None:
        """Stop generating and free the batch slot (at the next step at the latest)."""
        self._scheduler._cancel(self._seq)


@dataclass(eq=False)
class _Seq:
    job: Job
    sink: Sink
    tracker: TextTracker
    sampler: Sampler | None = None
    cache: SequenceCache | None = None
    cached: int = 0
    generated: list[int] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    mask: torch.Tensor | None = None
    peers_max: int = 0
    cancelled: bool = False
    done: bool = False


class Scheduler:
    """The loop thread, its waiting queue and running batch."""

    def __init__(
        self,
        model: DecoderModel,
        *,
        decode_text: Callable[[Sequence[int]], str],
        eos_token_ids: Sequence[int],
        prefix_cache: PrefixCache | None = None,
        max_batch: int = 64,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.model = model
        self.prefix_cache = prefix_cache
        self.max_batch = max_batch
        self._decode_text = decode_text
        self._eos = frozenset(eos_token_ids)
        self._cond = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._paused = False
        self._closed = False
        self._steps = self._admitted = self._finished = self._cancelled = 0
        self._thread = threading.Thread(target=self._run, name="affidavit-scheduler", daemon=True)

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop; sequences still queued or running finish with ``error``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job, sink: Sink) -> Ticket:
        """Queue ``job``; its events go to ``sink`` on the scheduler thread."""
        if not job.prompt_ids:
            raise ValueError("a job needs at least one prompt token")
        if job.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        tracker = TextTracker(self._decode_text, job.stop, job.hold, release=job.stream_text)
        seq = _Seq(job, sink, tracker)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._waiting.append(seq)
            self._cond.notify_all()
        return Ticket(self, seq)

    def pause(self) -> None:
        """Admit nothing new (running sequences go on): lets a test line up a batch."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Admit again; everything queued meanwhile joins in the same step."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def stats(self) -> SchedulerStats:
        """A snapshot of the queue and batch sizes and counters."""
        with self._cond:
            return SchedulerStats(
                running=len(self._running),
                waiting=len(self._waiting),
                steps=self._steps,
                admitted=self._admitted,
                finished=self._finished,
                cancelled=self._cancelled,
                paused=self._paused,
            )

    def _cancel(self, seq: _Seq) -> None:
        with self._cond:
            seq.cancelled = True
            if seq in self._waiting:
                self._waiting.remove(seq)
                self._finish(seq, "cancelled")
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._closed and not self._running and (self._paused or not self._waiting)
                ):
                    self._cond.wait()
                if self._closed:
                    break
                admit: list[_Seq] = []
                while (
                    not self._paused
                    and self._waiting
                    and (len(self._running) + len(admit) < self.max_batch)
                ):
                    admit.append(self._waiting.popleft())
                self._admitted += len(admit)
            try:
                self._admit(admit)
                self._step()
            except Exception as exc:  # a bug here must not strand every waiting client
                log.exception("scheduler step failed")
                with self._cond:
                    broken, self._running = self._running + admit, []
                for seq in broken:
                    self._finish(seq, "error", f"scheduler step failed: {exc}")
        with self._cond:
            leftover = list(self._waiting) + self._running
            self._waiting.clear()
            self._running = []
        for seq in leftover:
            self._finish(seq, "error", "the engine is shutting down")

    def _admit(self, admit: list[_Seq]) -> None:
        """Prefill the sequences admitted in one step together: one forward pass reads the
        weights once, where one pass each read them once per sequence, and each row is the
        bits its own prefill gives (batch invariance). Should that pass fail, each is
        prefilled alone, so that a request that cannot be prefilled fails alone."""
        for group in _passes([seq for seq in admit if self._prepare(seq)]):
            if len(group) > 1:
                segments = [_unprefilled(seq) for seq in group]
                lengths = [cache.length for cache, _ in segments]
                try:
                    logits = self.model.prefill_many(segments)
                except Exception:
                    for (cache, _), length in zip(segments, lengths, strict=True):
                        cache.truncate(length)  # where the failed pass got as far as lm_head
                else:
                    for seq, row in zip(group, logits, strict=True):
                        self._start(seq, row)
                    continue
            for seq in group:
                self._start(seq, None)

    def _prepare(self, seq: _Seq) -> bool:
        """The sequence's sampler and cache (a prefix-cache hit's, or a new one)."""
        job = seq.job
        try:
            seq.sampler = Sampler(job.params, seed=job.seed)
            hit = None
            if job.scope is not None and self.prefix_cache is not None:
                hit = self.prefix_cache.lookup(job.scope, job.prompt_ids)
            seq.cache = hit.cache if hit else self.model.new_cache()
            seq.cached = hit.cached if hit else 0
        except Exception as exc:
            log.exception("prefill failed")
            self._finish(seq, "error", f"prefill failed: {exc}")
            return False
        return True

    def _start(self, seq: _Seq, logits: torch.Tensor | None) -> None:
        """Its first token from its prefill's ``logits`` (``None``: prefill it alone now)."""
        job = seq.job
        try:
            if logits is None:
                logits = self.model.prefill(*_unprefilled(seq))
            assert seq.cache is not None
            if job.scope is not None and self.prefix_cache is not None:
                self._remember(job.scope, job.prompt_ids, seq.cache.clone())
            self._sample(seq, logits.clone())
        except Exception as exc:
            log.exception("prefill failed")
            self._finish(seq, "error", f"prefill failed: {exc}")
        if not seq.done:
            with self._cond:
                self._running.append(seq)

    def _step(self) -> None:
        with self._cond:
            for seq in [s for s in self._running if s.cancelled]:
                self._finish(seq, "cancelled")
            live = [s for s in self._running if not s.done]
            self._running = live
        if not live:
            return
        try:
            caches = [s.cache for s in live if s.cache is not None]
            logits = self.model.decode(caches, [s.generated[-1] for s in live])
        except Exception as exc:
            log.exception("decode step failed")
            for seq in live:
                self._finish(seq, "error", f"decode failed: {exc}")
        else:
            for row, seq in enumerate(live):
                seq.peers_max = max(seq.peers_max, len(live) - 1)
                try:
                    self._sample(seq, logits[row].clone())
                except Exception as exc:
                    log.exception("sampling failed")
                    self._finish(seq, "error", f"sampling failed: {exc}")
        with self._cond:
            self._steps += 1
            self._running = [s for s in self._running if not s.done]

    def _sample(self, seq: _Seq, logits: torch.Tensor) -> None:
        """Draw one token from a fresh copy of the row, emit it, and end the sequence if due."""
        job = seq.job
        if seq.mask is None:
            seq.mask = self._mask(seq)
        assert seq.sampler is not None
        token = seq.sampler.sample(logits, seq.mask)
        seq.generated.append(token.token_id)
        if token.token_id in self._eos:
            self._emit(seq, TokenEvent(token, ""))
            self._finish(seq, "stop")
            return
        seq.text_ids.append(token.token_id)
        if job.constraint is not None:
            job.constraint.advance(token.token_id)
        seq.mask = self._mask(seq)
        self._emit(seq, TokenEvent(token, seq.tracker.push(seq.text_ids)))
        if seq.tracker.stopped or self._constraint_done(seq):
            self._finish(seq, "stop")
        elif len(seq.generated) >= job.max_tokens:
            self._finish(seq, "length")

    def _mask(self, seq: _Seq) -> torch.Tensor | None:
        job = seq.job
        if job.constraint is None:
            return job.allowed
        mask = job.constraint.allowed()
        return mask if job.allowed is None else mask & job.allowed

    def _constraint_done(self, seq: _Seq) -> bool:
        """A complete grammar that allows nothing but an end token ends the sequence now."""
        constraint = seq.job.constraint
        if constraint is None or not constraint.complete or seq.mask is None:
            return False
        allowed = {int(i) for i in torch.nonzero(seq.mask).flatten()}
        return not allowed - self._eos

    def _remember(self, scope: str, tokens: list[int], cache: SequenceCache) -> None:
        """Offer a cache to the prefix cache; a failure there costs reuse, never a reply."""
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.insert(scope, tokens, cache)
        except Exception:
            log.exception("prefix cache insert failed")

    def _emit(self, seq: _Seq, event: Event) -> None:
        try:
            seq.sink(event)
        except Exception:
            log.exception("a result sink failed; cancelling its sequence")
            seq.cancelled = True

    def _finish(self, seq: _Seq, reason: FinishReason, error: str | None = None) -> None:
        if seq.done:
            return
        seq.done = True
        with self._cond:  # an RLock: _cancel and _step call this while holding it
            self._finished += 1
            self._cancelled += reason == "cancelled"
        job = seq.job
        tail = seq.tracker.flush() if reason in ("stop", "length") else ""
        cache, seq.cache = seq.cache, None
        if reason != "error" and job.scope is not None and cache is not None:
            self._remember(job.scope, job.prompt_ids + seq.generated, cache)
        self._emit(
            seq,
            Finished(
                reason=reason,
                token_ids=tuple(seq.generated),
                text=seq.tracker.text,
                tail=tail,
                prompt_tokens=len(job.prompt_ids),
                cached_tokens=seq.cached,
                batch_peers_max=seq.peers_max,
                constraint_complete=job.constraint is not None and job.constraint.complete,
                error=error,
            ),
        )


def _unprefilled(seq: _Seq) -> tuple[SequenceCache, list[int]]:
    """A prepared sequence's cache and the prompt tokens it does not hold yet."""
    assert seq.cache is not None
    return seq.cache, seq.job.prompt_ids[seq.cached :]


def _passes(ready: list[_Seq]) -> list[list[_Seq]]:
    """``ready`` in admission order, cut into prefill passes of at most
    :data:`PREFILL_PASS_TOKENS` tokens (a longer prompt: a pass of its own, as alone), so
    that prefilling together never holds more activations than one long prompt does."""
    passes: list[list[_Seq]] = []
    tokens = 0
    for seq in ready:
        n = len(_unprefilled(seq)[1])
        if not passes or tokens + n > PREFILL_PASS_TOKENS:
            passes.append([])
            tokens = 0
        passes[-1].append(seq)
        tokens += n
    return passes
