"""Cost of determinism: the embedded engine's decode speed with batch invariance on and off.

Run from the repository root::

    .venv/bin/python bench/determinism_cost.py            # full run, about a minute on 2 cores
    .venv/bin/python bench/determinism_cost.py --quick    # smoke run, a few seconds after start-up

Why in-process: it drives the code path the server runs, minus HTTP. One
:class:`inference.server.Engine` loads the model as ``engine serve`` builds it (the start-up
self-test picks the batch-invariant linear path); "off" is the same engine with its linear
path set to stock ``F.linear``, what ``engine serve --no-batch-invariance`` runs. One engine,
not two: each engine's :class:`~inference.scheduler.Scheduler` thread keeps a team of torch's
OpenMP workers, and two teams on two cores throttle each other (the decode step ran ~7x
slower; ``inference.server.on_a_passing_thread``). For each batch size B (1, 4, 16) the
scheduler is paused, B jobs are queued (distinct prompts and seeds, temperature 0.7,
strict cache scope, end tokens masked out so every sequence decodes exactly the same
number of tokens), and it is resumed, so all B are admitted together and decode as one
batch. Every token event is time-stamped on the scheduler thread:

- ``tpot_ms``: the median gap between a sequence's consecutive tokens, over every
  sequence of the batch (a median, because a 2-core machine shared with other work
  stretches some steps; the mean is in ``tokens_per_s``);
- ``tokens_per_s``: the decode tokens (all but each sequence's first, which comes from its
  prefill) over the window from the last first token to the last token.

The thread line (#20 line 2): every forward pass of a batch of 16 the scheduler thread runs
is timed, and, once the engine is closed (its thread and its OpenMP team gone), the same
model runs the same batch's decode steps on the main thread; the ratio is scheduler / main
(target: <= 1.1, "as fast as the main thread").

The real default model against ``transformers`` (#20 line 3), in a full run: SmolLM2-135M
(``smollm2-135m``, pulled into the model cache when missing) through the invariant engine
as it serves, then the same GGUF file through ``transformers`` (float32, its default
attention, sdpa; batched ``generate`` with its KV cache; the same sampling; EOS held off
with ``min_new_tokens`` as ours masks it), each alone on the machine (ours first and closed,
then transformers on a thread of its own, so the two never hold OpenMP teams at once; all
of it in a process of its own, apart from the tiny model's runs), the
same 16 prompts of 24 tokens: decode tok/s at batch 16 (transformers': the time of 64 new
tokens less the time of one, its prefill) and the time of a 512-token prefill (ours:
submit to first token, strict cache; theirs: one forward pass with its cache). Targets:
decode >= 1.0x transformers', prefill <= 1.2x its time. ``--quick`` and
``--no-transformers`` skip it and say so.

Each figure is the median of the repeats. ``cost`` is TPOT on / TPOT off (1.0 = free),
paired: on and off run back to back within a repeat (in alternating order), the ratio is
taken per repeat and then the median, because other work on a shared machine comes and
goes between repeats. Target: cost <= 1.1 at batch 16.
For scale, the published costs of batch-invariant modes: vLLM 1.45x (H100), SGLang 1.34x.
It prints one table and, last, one line of JSON holding every figure. It exits 0 whenever
it ran: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from target import Target

from inference.make_model import make_model
from inference.sampling import SamplingParams
from inference.scheduler import Event, Finished, Job
from inference.server import Engine, on_a_passing_thread

BATCH_SIZES = (1, 4, 16)
DEFAULT_MODEL = "smollm2-135m"  # the real default model, measured against transformers
TARGET_DECODE_VS_TRANSFORMERS = 1.0  # decode tok/s at batch 16, ours / transformers'
TARGET_PREFILL_VS_TRANSFORMERS = 1.2  # prefill time of 512 tokens, ours / transformers'
PREFILL_TOKENS = 512
TARGET_COST_AT_16 = 1.1
TARGET_COST_AT_4 = 1.05  # #20 line 3
TARGET_COST_AT_1 = 1.5
TARGET_FORWARD_THREAD = 1.1  # the scheduler thread's forward pass / the main thread's
REFERENCES = {"vllm_h100": 1.45, "sglang": 1.34}
WORDS = ("the", "river", "stone", "city", "cat", "sat", "on", "mat", "sky", "light", "old")


@dataclass
class _Timeline:
    """Token times of one sequence, written by the scheduler thread."""

    stamps: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def sink(self, event: Event) -> None:
        if isinstance(event, Finished):
            if event.reason not in ("stop", "length"):
                self.error = event.error or event.reason
            self.done.set()
        else:
            self.stamps.append(time.perf_counter())


@dataclass(frozen=True)
class Measure:
    """One batch's decode speed."""

    tokens_per_s: float
    tpot_ms: float


def _no_end(vocab_size: int, ends: list[int]) -> torch.Tensor:
    mask = torch.ones(vocab_size, dtype=torch.bool)
    mask[ends] = False
    return mask


def _jobs(engine: Engine, batch: int, tokens: int, rng: random.Random) -> list[Job]:
    # built off the main thread: a parallel fill here would leave the main thread an OpenMP
    # team, which slows the scheduler's (the thread line would measure that, not the engine)
    mask = on_a_passing_thread(
        _no_end, engine.model.config.vocab_size, list(engine.tokenizer.eos_token_ids)
    )
    jobs = []
    for _ in range(batch):
        text = " ".join(rng.choices(WORDS, k=rng.randint(4, 16)))
        prompt = engine.tokenizer.encode(
            engine.tokenizer.render([{"role": "user", "content": text}])
        )
        seed = rng.randrange(2**31)
        jobs.append(
            Job(
                prompt_ids=prompt,
                params=SamplingParams(temperature=0.7, seed=seed),
                seed=seed,
                max_tokens=tokens,
                allowed=mask,
                scope=None,
            )
        )
    return jobs


def measure(engine: Engine, batch: int, tokens: int, rng: random.Random) -> Measure:
    """Decode ``batch`` sequences of ``tokens`` tokens together; their decode speed."""
    return decode_together(engine, _jobs(engine, batch, tokens, rng), tokens)


def decode_together(engine: Engine, jobs: list[Job], tokens: int) -> Measure:
    """Admit ``jobs`` at once (the scheduler paused meanwhile) and time their decode."""
    timelines = [_Timeline() for _ in jobs]
    engine.scheduler.pause()
    try:
        for job, timeline in zip(jobs, timelines, strict=True):
            engine.scheduler.submit(job, timeline.sink)
    finally:
        engine.scheduler.resume()
    for timeline in timelines:
        if not timeline.done.wait(600):
            raise RuntimeError("a sequence did not finish within 600 s")
        if timeline.error or len(timeline.stamps) != tokens:
            raise RuntimeError(f"a sequence ended early: {timeline.error or len(timeline.stamps)}")
    start = max(t.stamps[0] for t in timelines)
    end = max(t.stamps[-1] for t in timelines)
    decode_tokens = len(jobs) * (tokens - 1)
    steps = [b - a for t in timelines for a, b in zip(t.stamps, t.stamps[1:], strict=False)]
    tpot = statistics.median(steps)
    return Measure(tokens_per_s=decode_tokens / (end - start), tpot_ms=1000 * tpot)


class _ForwardTimer:
    """The model's ``decode``, timed on whatever thread calls it, for batches of ``batch``."""

    def __init__(self, model: Any, batch: int) -> None:
        self.inner = model.decode
        self.batch = batch
        self.active = False
        self.seconds: list[float] = []

    def __call__(self, caches: list[Any], token_ids: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        logits: torch.Tensor = self.inner(caches, token_ids)
        if self.active and len(caches) == self.batch:
            self.seconds.append(time.perf_counter() - start)
        return logits


def _main_thread_forward(engine: Engine, jobs: list[Job], steps: int) -> list[float]:
    """The same batch's decode steps on this (the main) thread, each timed."""
    model = engine.model
    caches = [model.new_cache() for _ in jobs]
    for cache, job in zip(caches, jobs, strict=True):
        model.prefill(cache, job.prompt_ids)
    tokens = [job.prompt_ids[-1] for job in jobs]
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        model.decode(caches, tokens)
        seconds.append(time.perf_counter() - start)
    return seconds


def run(model_dir: Path, *, tokens: int, repeats: int, sizes: Sequence[int]) -> dict[str, Any]:
    """Every figure of one run, as the closing JSON line holds them."""
    engine = Engine(model_dir, batch_invariance=True, max_batch=max(sizes))
    invariant = engine.model.linear_path
    timer = _ForwardTimer(engine.model, max(sizes))
    engine.model.decode = timer  # type: ignore[method-assign]
    modes = {"on": invariant, "off": "stock"}
    engine.start()
    rng = random.Random(2024)
    samples: dict[str, dict[int, list[Measure]]] = {m: {b: [] for b in sizes} for m in modes}
    try:
        for path in modes.values():  # warm-up: allocator, kernels, thread pools
            engine.model.linear_path = path
            measure(engine, max(sizes), min(tokens, 8), rng)
        for repeat in range(repeats):
            order = ("on", "off") if repeat % 2 == 0 else ("off", "on")
            for batch in sizes:
                for mode in order:
                    engine.model.linear_path = modes[mode]  # between batches: the loop is idle
                    timer.active = mode == "on"
                    samples[mode][batch].append(measure(engine, batch, tokens, rng))
                    timer.active = False
    finally:
        engine.close()
    engine.model.linear_path = invariant
    jobs = _jobs(engine, max(sizes), tokens, rng)
    main_seconds = _main_thread_forward(engine, jobs, max(len(timer.seconds) // 4, tokens))
    forward = {
        "batch": max(sizes),
        "scheduler_ms": round(1000 * statistics.median(timer.seconds), 4),
        "main_ms": round(1000 * statistics.median(main_seconds), 4),
    }
    forward["ratio"] = round(forward["scheduler_ms"] / forward["main_ms"], 3)
    figures: dict[str, Any] = {}
    for batch in sizes:
        row: dict[str, Any] = {}
        for mode in modes:
            runs = samples[mode][batch]
            row[mode] = {
                "tokens_per_s": round(statistics.median(m.tokens_per_s for m in runs), 2),
                "tpot_ms": round(statistics.median(m.tpot_ms for m in runs), 4),
                "tpot_ms_repeats": [round(m.tpot_ms, 4) for m in runs],
            }
        pairs = zip(samples["on"][batch], samples["off"][batch], strict=True)
        costs = [on.tpot_ms / off.tpot_ms for on, off in pairs]
        row["cost"] = round(statistics.median(costs), 3)
        row["cost_repeats"] = [round(c, 3) for c in costs]
        row["throughput_ratio"] = round(row["off"]["tokens_per_s"] / row["on"]["tokens_per_s"], 3)
        figures[str(batch)] = row
    report = engine.report
    return {
        "figures": figures,
        "forward_thread": forward,
        "run": {
            "model": model_dir.name,
            "invariance_path": invariant,
            "self_test_passed": report.passed if report is not None else None,
            "tokens": tokens,
            "repeats": repeats,
            "torch_threads": torch.get_num_threads(),
            "cores": os.cpu_count(),
        },
    }


def _prompts(engine: Engine, batch: int, length: int, rng: random.Random) -> list[list[int]]:
    """``batch`` prompts of exactly ``length`` tokens each (random words, no padding needed
    on either side), the same for both engines."""
    prompts = []
    for _ in range(batch):
        text = " ".join(rng.choices(WORDS, k=length))
        prompts.append(engine.tokenizer.encode(text)[:length])
    if any(len(p) != length for p in prompts):
        raise RuntimeError(f"a prompt came out shorter than {length} tokens")
    return prompts


def _ours_vs(engine: Engine, prompts: list[list[int]], tokens: int) -> float:
    """Our engine's decode tok/s for ``prompts`` decoded together, ``tokens`` each."""
    mask = on_a_passing_thread(
        _no_end, engine.model.config.vocab_size, list(engine.tokenizer.eos_token_ids)
    )
    jobs = [
        Job(ids, SamplingParams(temperature=0.7, seed=k), k, tokens, allowed=mask, scope=None)
        for k, ids in enumerate(prompts)
    ]
    return decode_together(engine, jobs, tokens).tokens_per_s


def _ours_prefill(engine: Engine, ids: list[int]) -> float:
    """Seconds from submitting a prompt of ``ids`` (nothing cached) to its first token."""
    timeline = _Timeline()
    params = SamplingParams(temperature=0.7, seed=1)
    start = time.perf_counter()
    engine.scheduler.submit(Job(ids, params, seed=1, max_tokens=1, scope=None), timeline.sink)
    if not timeline.done.wait(600) or timeline.error or not timeline.stamps:
        raise RuntimeError(f"the prefill did not finish: {timeline.error}")
    return timeline.stamps[0] - start


def _theirs(
    path: Path, prompts: list[list[int]], long: list[int], tokens: int, repeats: int
) -> dict[str, float]:
    """transformers on the same GGUF file: float32, its default attention (sdpa), batched
    ``generate`` with its KV cache, sampling at temperature 0.7, EOS held off until
    ``tokens`` (``min_new_tokens``); decode tok/s from the time of ``tokens`` new tokens
    less the least time of one (the prefill) over three runs, and a 512-token prefill (one forward pass)."""
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.eval()
    batch = torch.tensor(prompts)
    mask = torch.ones_like(batch)

    def generate(new: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=batch,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=0.7,
                top_p=1.0,
                top_k=0,
                pad_token_id=0,
            )
        if out.shape[1] != batch.shape[1] + new:
            raise RuntimeError("transformers stopped early")
        return time.perf_counter() - start

    def prefill() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model(torch.tensor([long]), use_cache=True)
        return time.perf_counter() - start

    generate(4)  # warm-up
    prefill()
    # The prefill's time at its least disturbed: other work on the machine only lengthens a
    # run, so a single noisy one-token run could exceed a short run of ``tokens`` and make
    # the difference negative (seen under load with ``tokens=4``).
    first = min(generate(1) for _ in range(3))
    decode = [len(prompts) * (tokens - 1) / (generate(tokens) - first) for _ in range(repeats)]
    return {
        "decode_tokens_per_s": statistics.median(decode),
        "prefill_s": statistics.median(prefill() for _ in range(repeats)),
    }


def versus_transformers(path: Path, *, tokens: int, repeats: int) -> dict[str, Any]:
    """The invariant engine against transformers on the real model: decode at batch 16 and a
    512-token prefill, each engine alone on the machine (ours first, then closed, so the two
    never keep OpenMP teams at once; transformers on a thread of its own, as ours runs)."""
    engine = Engine(path, batch_invariance=True, max_batch=16)
    rng = random.Random(16)
    prompts = _prompts(engine, 16, 24, rng)
    long = _prompts(engine, 1, PREFILL_TOKENS, rng)[0]
    engine.start()
    try:
        _ours_vs(engine, prompts, min(tokens, 8))  # warm-up
        _ours_prefill(engine, long[: PREFILL_TOKENS // 2])
        ours_decode = statistics.median(_ours_vs(engine, prompts, tokens) for _ in range(repeats))
        ours_prefill = []
        for _ in range(repeats):  # strict scope (None): nothing cached between them
            ours_prefill.append(_ours_prefill(engine, long))
        invariant = engine.model.linear_path
    finally:
        engine.close()
    theirs = on_a_passing_thread(_theirs, path, prompts, long, tokens, repeats)
    ours = {"decode_tokens_per_s": ours_decode, "prefill_s": statistics.median(ours_prefill)}
    return {
        "model": path.name,
        "invariance_path": invariant,
        "ours": {k: round(v, 4) for k, v in ours.items()},
        "transformers": {k: round(v, 4) for k, v in theirs.items()},
        "decode_ratio": round(ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"], 3),
        "prefill_ratio": round(ours["prefill_s"] / theirs["prefill_s"], 3),
        "batch": 16,
        "tokens": tokens,
        "prefill_tokens": PREFILL_TOKENS,
        "repeats": repeats,
    }


def table(result: dict[str, Any]) -> str:
    """Both modes side by side, the cost, and the published references beside it."""
    lines = [
        f"{'batch':>5}  {'tok/s on':>10}  {'tok/s off':>10}  {'tpot_ms on':>10}  "
        f"{'tpot_ms off':>11}  {'cost':>6}  reference cost (published)"
    ]
    refs = f"vLLM {REFERENCES['vllm_h100']}x (H100), SGLang {REFERENCES['sglang']}x"
    for batch, row in result["figures"].items():
        on, off = row["on"], row["off"]
        lines.append(
            f"{batch:>5}  {on['tokens_per_s']:>10.1f}  {off['tokens_per_s']:>10.1f}  "
            f"{on['tpot_ms']:>10.3f}  {off['tpot_ms']:>11.3f}  {row['cost']:>5.3f}x  "
            f"{refs if batch == '16' else ''}"
        )
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one short repeat (smoke run)")
    parser.add_argument(
        "--model",
        help="also measure this model beside the tiny one: a name `affidavit engine pull` "
        "knows (smollm2-135m), a model folder or a .gguf file",
    )
    parser.add_argument("--repeats", type=int, help="repeats for --model (default: 3)")
    parser.add_argument(
        "--no-transformers",
        action="store_true",
        help=f"skip the real default model ({DEFAULT_MODEL}) against transformers",
    )
    args = parser.parse_args(argv)
    tokens, repeats = (12, 1) if args.quick else (64, 11)
    started = time.perf_counter()
    versus, why_not = _versus(args.quick, args.no_transformers, tokens)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "tiny"
        make_model(model_dir)
        _log(f"measuring tiny: batches {BATCH_SIZES}, {tokens} tokens, {repeats} repeats")
        result = run(model_dir, tokens=tokens, repeats=repeats, sizes=BATCH_SIZES)
        result["run"]["mode"] = "quick" if args.quick else "full"
        others: dict[str, Any] = {}
        if args.model is not None:
            path = _model_path(args.model)
            more = args.repeats or (1 if args.quick else 3)
            _log(f"measuring {path.name}: batches {BATCH_SIZES}, {tokens} tokens, {more} repeats")
            others[args.model] = run(path, tokens=tokens, repeats=more, sizes=BATCH_SIZES)
    result["run"]["seconds"] = round(time.perf_counter() - started, 1)
    cost16 = result["figures"]["16"]["cost"]
    summary = [
        Target("cost_at_16", cost16, TARGET_COST_AT_16, "lower", "x"),
        Target("cost_at_4", result["figures"]["4"]["cost"], TARGET_COST_AT_4, "lower", "x"),
        Target("cost_at_1", result["figures"]["1"]["cost"], TARGET_COST_AT_1, "lower", "x"),
        Target(
            "forward_thread", result["forward_thread"]["ratio"], TARGET_FORWARD_THREAD, "lower", "x"
        ),
        Target(
            "decode_vs_transformers_at_16",
            versus["decode_ratio"] if versus else None,
            TARGET_DECODE_VS_TRANSFORMERS,
            "higher",
            "x",
        ),
        Target(
            "prefill_512_vs_transformers",
            versus["prefill_ratio"] if versus else None,
            TARGET_PREFILL_VS_TRANSFORMERS,
            "lower",
            "x",
        ),
    ]
    met = {t.name: t.met for t in summary}
    print("tiny (random weights)")
    print(table(result))
    for name, other in others.items():
        print(f"\n{name} ({other['run']['model']})")
        print(table(other))
    print()
    run_info = result["run"]
    print(
        f"invariant path: {run_info['invariance_path']}; torch threads {run_info['torch_threads']}; "
        f"{run_info['mode']} run, {run_info['seconds']:.1f} s"
    )
    if args.quick:
        print("note: --quick runs one short repeat; its verdict is indicative only")
    for batch, goal in (("4", TARGET_COST_AT_4), ("1", TARGET_COST_AT_1)):
        cost = result["figures"][batch]["cost"]
        said = "met" if met[f"cost_at_{batch}"] else "NOT met"
        print(f"target cost at batch {batch} (tiny): {cost:.3f}x against <= {goal}x: {said}")
    verdict = "met" if met["cost_at_16"] else "NOT met"
    print(
        f"target cost at batch 16 (tiny): {cost16:.3f}x against <= {TARGET_COST_AT_16}x: {verdict}"
    )
    fwd = result["forward_thread"]
    thread_verdict = "met" if met["forward_thread"] else "NOT met"
    print(
        f"forward pass at batch {fwd['batch']} (tiny): scheduler thread {fwd['scheduler_ms']:.3f} ms,"
        f" main thread {fwd['main_ms']:.3f} ms: {fwd['ratio']:.3f}x against"
        f" <= {TARGET_FORWARD_THREAD}x: {thread_verdict}"
    )
    for name, other in others.items():
        print(f"cost at batch 16 ({name}): {other['figures']['16']['cost']:.3f}x")
        fwd = other["forward_thread"]
        print(
            f"forward pass at batch {fwd['batch']} ({name}): scheduler thread"
            f" {fwd['scheduler_ms']:.3f} ms, main thread {fwd['main_ms']:.3f} ms: {fwd['ratio']:.3f}x"
        )
    if versus is None:
        print(f"{DEFAULT_MODEL} against transformers: not measured: {why_not}")
    else:
        ours, theirs = versus["ours"], versus["transformers"]
        print(
            f"{versus['model']} at batch 16 ({versus['tokens']} tokens, median of"
            f" {versus['repeats']}): decode {ours['decode_tokens_per_s']:.1f} tok/s (invariant,"
            f" {versus['invariance_path']}) against transformers'"
            f" {theirs['decode_tokens_per_s']:.1f}: {versus['decode_ratio']:.3f}x against"
            f" >= {TARGET_DECODE_VS_TRANSFORMERS}x: {_said(met['decode_vs_transformers_at_16'])}"
        )
        print(
            f"{versus['model']} prefill of {PREFILL_TOKENS} tokens: {1000 * ours['prefill_s']:.0f} ms"
            f" against transformers' {1000 * theirs['prefill_s']:.0f} ms:"
            f" {versus['prefill_ratio']:.3f}x against <= {TARGET_PREFILL_VS_TRANSFORMERS}x:"
            f" {_said(met['prefill_512_vs_transformers'])}"
        )
    targets = {t.name: t.goal for t in summary}
    doc = {
        **result,
        "targets": targets,
        "references": REFERENCES,
        "met": met,
        "summary": [t.row() for t in summary],
    }
    if others:
        doc["models"] = others
    doc["versus_transformers"] = versus if versus is not None else {"not_measured": why_not}
    print(json.dumps(doc, sort_keys=True))
    return 0


def _versus(quick: bool, skipped: bool, tokens: int) -> tuple[dict[str, Any] | None, str]:
    """The real default model against transformers, or None and why it was not measured."""
    if quick:
        return None, "--quick measures the tiny model only"
    if skipped:
        return None, "--no-transformers"
    try:
        import accelerate  # type: ignore[import-untyped]  # noqa: F401  (GGUF loading needs it)
        import transformers  # noqa: F401
    except ImportError as exc:
        return None, f"transformers is not installed (the dev extra): {exc}"
    path = _model_path(DEFAULT_MODEL)
    _log(f"measuring {path.name} against transformers: batch 16, {tokens} tokens, 3 repeats")
    # In a process of its own: what the two engines leave behind (OpenMP teams, allocator
    # state, transformers' threads) slowed the tiny model's later figures by up to 1.9x and
    # made their ratios noisy, and nothing of the tiny runs can slow this one either.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(versus_transformers, path, tokens=tokens, repeats=3).result(), ""


def _said(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def _model_path(spec: str) -> Path:
    """A name ``inference.pull`` knows (pulled when missing), else a path."""
    from inference.pull import KNOWN_MODELS, ensure_model

    return ensure_model(spec, progress=_log) if spec in KNOWN_MODELS else Path(spec)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
