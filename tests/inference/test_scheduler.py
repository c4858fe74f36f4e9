"""The continuous-batching scheduler, driven in process (no HTTP).

- text release: stop strings cut the text even across tokens, a partial stop string or
  tool-call tag and an incomplete UTF-8 character are held back until they resolve;
- a request generates the same tokens and logprobs alone and inside batches of 2, 8 and
  32 others with other prompts, seeds and settings (its own sampler; decode rows that do
  not depend on the batch), and reports how many others it shared a step with;
- ``max_tokens`` ends with ``length``, an end token with ``stop``; a fixed mask is obeyed;
- a cancelled request leaves the batch; a failing request fails alone and the loop keeps
  serving; closing fails what is left;
- strict jobs (no scope) neither read nor write the prefix cache; scoped jobs reuse it and
  still draw the same tokens.
"""

from __future__ import annotations

import queue
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.cache import SequenceCache  # noqa: E402
from inference.model import DecoderModel  # noqa: E402
from inference.prefix_cache import PrefixCache  # noqa: E402
from inference.sampling import SamplingParams  # noqa: E402
from inference.scheduler import (  # noqa: E402
    Event,
    Finished,
    Job,
    Scheduler,
    TextTracker,
    TokenEvent,
)
from inference.tokenizer import ChatTokenizer  # noqa: E402

TIMEOUT_S = 60.0
WORDS = ("the", "a", "cat", "sat", "on", "mat", "sky", "tool", "call", "city", "river", "stone")


def _words(decode_map: dict[int, str]) -> Callable[[Sequence[int]], str]:
    def decode(ids: Sequence[int]) -> str:
        return "".join(decode_map[i] for i in ids)

    return decode


def test_stop_string_across_tokens_is_cut_and_never_released() -> None:
    pieces = {1: "hel", 2: "lo ST", 3: "OP tail"}
    tracker = TextTracker(_words(pieces), stop=["STOP"])
    assert tracker.push([1]) == "hel"
    assert tracker.push([1, 2]) == "lo "  # "ST" could begin "STOP": held back
    assert tracker.push([1, 2, 3]) == ""
    assert tracker.stopped and tracker.text == "hello "
    assert tracker.flush() == ""


def test_held_prefix_is_released_when_it_does_not_become_a_stop_string() -> None:
    pieces = {1: "a S", 2: "Tx", 3: "\ufffd", 4: "é"}
    tracker = TextTracker(_words(pieces), stop=["STOP"])
    assert tracker.push([1]) == "a "
    assert tracker.push([1, 2]) == "STx"
    assert tracker.push([1, 2, 3]) == ""  # an incomplete UTF-8 character waits
    assert tracker.push([1, 2, 4]) == "é"
    assert tracker.flush() == "" and not tracker.stopped


def test_hold_markers_stop_the_release_of_text() -> None:
    pieces = {1: "see <tool", 2: "_call>{", 3: "}"}
    tracker = TextTracker(_words(pieces), hold=["<tool_call>"])
    assert tracker.push([1]) == "see "
    assert tracker.push([1, 2]) == ""
    assert tracker.push([1, 2, 3]) == ""
    assert tracker.flush() == "" and tracker.text == "see <tool_call>{}"
    silent = TextTracker(_words(pieces), release=False)
    assert silent.push([1]) == "" and silent.flush() == ""


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer.from_dir(tiny_model_dir)


@pytest.fixture()
def scheduler(tiny_model: DecoderModel, tokenizer: ChatTokenizer) -> Iterator[Scheduler]:
    s = Scheduler(
        tiny_model,
        decode_text=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        eos_token_ids=tokenizer.eos_token_ids,
        prefix_cache=PrefixCache(4096),
        max_batch=64,
    )
    s.start()
    yield s
    s.close()


class Run:
    """One submitted job and everything its sink received."""

    def __init__(self, scheduler: Scheduler, job: Job) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.ticket = scheduler.submit(job, self.events.put)
        self.tokens: list[TokenEvent] = []
        self.done: Finished | None = None

    def result(self) -> Finished:
        while self.done is None:
            event = self.events.get(timeout=TIMEOUT_S)
            if isinstance(event, Finished):
                self.done = event
            else:
                self.tokens.append(event)
        return self.done

    def draws(self) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
        return [(e.token.token_id, e.token.logprob, e.token.top) for e in self.tokens]


def _job(
    tokenizer: ChatTokenizer,
    text: str,
    seed: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_tokens: int = 12,
    **job_fields: Any,
) -> Job:
    prompt = tokenizer.render([{"role": "user", "content": text}])
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        logprobs=True,
        top_logprobs=3,
    )
    return Job(tokenizer.encode(prompt), params, seed, max_tokens, **job_fields)


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _batch(scheduler: Scheduler, jobs: list[Job]) -> list[Run]:
    """Submit ``jobs`` while admission is paused, so they all start in the same step."""
    scheduler.pause()
    runs = [Run(scheduler, job) for job in jobs]
    _wait(lambda: scheduler.stats().waiting == len(jobs), "the queue to fill")
    scheduler.resume()
    for run in runs:
        run.result()
    return runs


def test_a_request_draws_the_same_alone_and_in_batches(
    scheduler: Scheduler, tokenizer: ChatTokenizer
) -> None:
    rng = random.Random(7)

    def other(i: int) -> Job:
        return _job(
            tokenizer,
            " ".join(rng.choices(WORDS, k=rng.randint(1, 30))),
            seed=rng.randrange(2**32),
            temperature=rng.choice([0.0, 0.7, 1.0, 1.3]),
            top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([0, 20]),
            max_tokens=rng.randint(4, 20),
            scope=rng.choice([None, f"s{i % 3}"]),
        )

    for probe_index in range(4):
        probe = _job(tokenizer, f"probe number {probe_index}", seed=1000 + probe_index)
        alone = Run(scheduler, probe)
        solo = alone.result()
        assert solo.batch_peers_max == 0
        for size in (2, 8, 32):
            jobs = [other(i) for i in range(size - 1)]
            jobs.insert(rng.randrange(size), probe)
            mine = _batch(scheduler, jobs)[jobs.index(probe)]
            assert mine.draws() == alone.draws(), (probe_index, size)
            assert mine.result().text == solo.text
            assert mine.result().batch_peers_max == size - 1
    _wait(lambda: scheduler.stats().running == 0, "the batch to drain")


def test_batch_peers_reports_the_batch_that_formed(
    scheduler: Scheduler, tokenizer: ChatTokenizer
) -> None:
    jobs = [_job(tokenizer, f"hello {i}", seed=i, max_tokens=6) for i in range(5)]
    scheduler.pause()
    runs = [Run(scheduler, job) for job in jobs]
    _wait(lambda: scheduler.stats().waiting == 5, "the queue to fill")
    scheduler.resume()
    done = [run.result() for run in runs]
    assert [d.batch_peers_max for d in done] == [4] * 5
    assert all(d.reason == "length" and len(d.token_ids) == 6 for d in done)
    assert "".join(e.text for e in runs[0].tokens) + done[0].tail == done[0].text


def test_end_tokens_and_masks(scheduler: Scheduler, tokenizer: ChatTokenizer) -> None:
    vocab = tokenizer.vocab_size
    only_eos = torch.zeros(vocab, dtype=torch.bool)
    only_eos[tokenizer.eos_token_ids[0]] = True
    done = Run(scheduler, _job(tokenizer, "x", seed=1, allowed=only_eos)).result()
    assert done.reason == "stop" and done.token_ids == (tokenizer.eos_token_ids[0],)
    assert done.text == ""

    some = torch.zeros(vocab, dtype=torch.bool)
    some[[5, 6, 7]] = True
    run = Run(scheduler, _job(tokenizer, "y", seed=2, allowed=some, max_tokens=20))
    assert run.result().reason == "length"
    assert {e.token.token_id for e in run.tokens} <= {5, 6, 7}


def test_a_failing_request_fails_alone(scheduler: Scheduler, tokenizer: ChatTokenizer) -> None:
    nothing = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    jobs = [_job(tokenizer, "ok", seed=3, max_tokens=5), _job(tokenizer, "bad", seed=4)]
    jobs[1].allowed = nothing
    runs = [Run(scheduler, job) for job in jobs]
    good, bad = (run.result() for run in runs)
    assert bad.reason == "error" and bad.error and "no allowed token" in bad.error
    assert good.reason == "length"
    assert Run(scheduler, _job(tokenizer, "after", seed=5, max_tokens=3)).result().reason == (
        "length"
    )


def test_cancel_frees_the_slot(scheduler: Scheduler, tokenizer: ChatTokenizer) -> None:
    long = Run(scheduler, _job(tokenizer, "long one", seed=6, max_tokens=1500))
    long.events.get(timeout=TIMEOUT_S)
    _wait(lambda: scheduler.stats().running == 1, "the request to run")
    long.ticket.cancel()
    assert long.result().reason == "cancelled"
    _wait(lambda: scheduler.stats().running == 0, "the slot to free")

    scheduler.pause()
    queued = Run(scheduler, _job(tokenizer, "never admitted", seed=7))
    queued.ticket.cancel()
    assert queued.result().reason == "cancelled"
    assert scheduler.stats().waiting == 0
    scheduler.resume()


def test_close_fails_what_is_left(tiny_model: DecoderModel, tokenizer: ChatTokenizer) -> None:
    s = Scheduler(tiny_model, decode_text=tokenizer.decode, eos_token_ids=())
    s.start()
    s.pause()
    run = Run(s, _job(tokenizer, "late", seed=8))
    s.close()
    done = run.result()
    assert done.reason == "error" and done.error == "the engine is shutting down"
    with pytest.raises(RuntimeError):
        s.submit(_job(tokenizer, "after close", seed=9), lambda event: None)


def test_strict_jobs_leave_the_prefix_cache_alone(
    scheduler: Scheduler, tokenizer: ChatTokenizer
) -> None:
    cache = scheduler.prefix_cache
    assert cache is not None
    cache.clear()
    before = cache.stats()
    strict = Run(scheduler, _job(tokenizer, "a shared question", seed=11, scope=None))
    cold = strict.result()
    after = cache.stats()
    assert (after.entries, after.lookups) == (0, before.lookups) and cold.cached_tokens == 0

    first = Run(scheduler, _job(tokenizer, "a shared question", seed=11, scope="t"))
    assert first.result().cached_tokens == 0
    warm = Run(scheduler, _job(tokenizer, "a shared question", seed=11, scope="t"))
    hit = warm.result()
    assert hit.cached_tokens == cold.prompt_tokens - 1
    assert warm.draws() == strict.draws() == first.draws()
    other = Run(scheduler, _job(tokenizer, "a shared question", seed=11, scope="u"))
    assert other.result().cached_tokens == 0


class _BrokenCache(PrefixCache):
    def insert(self, scope: str, tokens: Sequence[int], cache: SequenceCache) -> None:
        raise RuntimeError("cache is broken")


def test_a_broken_prefix_cache_costs_reuse_not_replies(
    tiny_model: DecoderModel, tokenizer: ChatTokenizer
) -> None:
    s = Scheduler(
        tiny_model, decode_text=tokenizer.decode, eos_token_ids=(), prefix_cache=_BrokenCache()
    )
    s.start()
    try:
        done = Run(s, _job(tokenizer, "still answers", seed=1, max_tokens=4, scope="a")).result()
        assert done.reason == "length" and len(done.token_ids) == 4
    finally:
        s.close()


def test_requests_admitted_together_are_prefilled_in_one_pass(
    scheduler: Scheduler,
    tokenizer: ChatTokenizer,
    tiny_model: DecoderModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One forward pass for every request of a step (the weights read once, not once per
    request); each draws what it draws alone (shown at larger batches by
    ``test_a_request_draws_the_same_alone_and_in_batches``)."""
    passes: list[int] = []
    pass_tokens: list[int] = []
    alone_calls: list[int] = []
    many, one = tiny_model.prefill_many, tiny_model.prefill

    def counted_many(segments: list[tuple[SequenceCache, list[int]]]) -> torch.Tensor:
        passes.append(len(segments))
        pass_tokens.append(sum(len(ids) for _, ids in segments))
        return many(segments)

    def counted_one(cache: SequenceCache, ids: list[int]) -> torch.Tensor:
        alone_calls.append(len(ids))
        return one(cache, ids)

    monkeypatch.setattr(tiny_model, "prefill_many", counted_many)
    monkeypatch.setattr(tiny_model, "prefill", counted_one)
    jobs = [_job(tokenizer, f"together {i}", seed=i, max_tokens=3) for i in range(6)]
    runs = _batch(scheduler, jobs)
    assert passes == [6] and alone_calls == []
    assert all(run.result().reason == "length" for run in runs)
    # a bounded pass: never more prompt tokens together than the limit (a longer prompt
    # alone), so a crowd of long prompts holds no more activations than one of them
    size = len(jobs[0].prompt_ids)
    monkeypatch.setattr("inference.scheduler.PREFILL_PASS_TOKENS", 2 * size + 1)
    passes.clear()
    pass_tokens.clear()
    longer = _job(tokenizer, "together, but much longer than the others " * 3, seed=9)
    runs = _batch(scheduler, [*jobs[:3], longer, *jobs[3:]])
    # in order: [0 1] [2] [longer] [3 4] [5]; a pass of one is a plain prefill
    assert passes == [2, 2] and pass_tokens == [2 * size] * 2, (passes, pass_tokens)
    assert alone_calls == [size, len(longer.prompt_ids), size]
    assert all(run.result().reason == "length" for run in runs)


def test_a_request_that_cannot_be_prefilled_fails_alone_among_others(
    scheduler: Scheduler, tokenizer: ChatTokenizer
) -> None:
    """The shared pass refuses a token id out of range; the others are prefilled alone,
    each once (what they draw is what they draw alone), and the bad one fails."""
    good = [_job(tokenizer, f"fine {i}", seed=20 + i, max_tokens=5) for i in range(2)]
    alone = [_drawn(Run(scheduler, job)) for job in good]
    bad = _job(tokenizer, "broken", seed=3)
    bad.prompt_ids = [*bad.prompt_ids, tokenizer.vocab_size + 7]
    runs = _batch(scheduler, [good[0], bad, good[1]])
    assert [r.result().reason for r in runs] == ["length", "error", "length"]
    assert "prefill failed" in (runs[1].result().error or "")
    assert [runs[0].draws(), runs[2].draws()] == alone


def _drawn(run: Run) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    run.result()
    return run.draws()
