"""What a tool-call grammar costs per token, against the model step it constrains.

Run from the repository root::

    .venv/bin/python bench/grammar_mask.py            # full run, about a minute on 2 cores
    .venv/bin/python bench/grammar_mask.py --quick    # smoke run, a few seconds

On the shipped tiny model (one intra-op thread), for each of several seeds it samples a whole
tool call under ``ToolCallGrammar`` (four tools: nested ``$defs``, ``anyOf`` with null,
patterns, bounds) and times, per token, the grammar's mask (``allowed()`` plus ``advance``)
and the model's decode step. The baseline is the decode step in the same run: the figure is
the median ratio mask / step. The tiny model's step is far cheaper than a real model's, so
this is the hardest case for the grammar.

Target (2 cores): the mask costs at most 0.5 x the tiny model's decode step. It prints one
table and, last, one line of JSON (``{"figures": …, "targets": …, "met": …}``). It exits 0
whenever it ran: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from target import Target

from inference.constrained import ToolCallGrammar, Vocabulary
from inference.make_model import make_model
from inference.model import DecoderModel
from inference.protocol import TokenTable
from inference.sampling import Sampler, SamplingParams
from inference.tokenizer import ChatTokenizer

TARGET_RATIO = 0.5
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 14}, {"type": "null"}]},
    },
    "required": ["city"],
}
BOOK = {
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
    },
    "type": "object",
    "properties": {
        "guest": {"$ref": "#/$defs/Guest"},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,5}$"}},
    },
    "required": ["guest"],
}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}}
    for name, schema in (("get_weather", WEATHER), ("book", BOOK), ("ping", {"type": "object"}))
]


def run(seeds: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        made = make_model(Path(tmp) / "model")
        tokenizer = ChatTokenizer.from_dir(made.path)
        table = TokenTable.load(made.path, tokenizer.vocab_size)
        open_id, close_id = (
            tokenizer.token_to_id("<tool_call>"),
            tokenizer.token_to_id("</tool_call>"),
        )
        vocabulary = Vocabulary.build(
            tokenizer.to_json(),
            table.raw,
            tokenizer.eos_token_ids,
            vocab_size=tokenizer.vocab_size,
            tag_ids={"<tool_call>": open_id, "</tool_call>": close_id},
        )
        model = DecoderModel.load(made.path)
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        prompt = tokenizer.encode(tokenizer.render(messages, tools=TOOLS))
        masks: list[float] = []
        steps: list[float] = []
        for seed in range(seeds):
            cache = model.new_cache()
            logits = model.prefill(cache, prompt)
            grammar = ToolCallGrammar(vocabulary, TOOLS, "required")
            sampler = Sampler(SamplingParams(temperature=1.0), seed=seed)
            for _ in range(400):
                start = time.perf_counter()
                mask = grammar.allowed()
                masked = time.perf_counter() - start
                token = sampler.sample(logits, mask).token_id
                if token in tokenizer.eos_token_ids or grammar.complete:
                    break
                start = time.perf_counter()
                grammar.advance(token)
                masks.append(masked + time.perf_counter() - start)
                start = time.perf_counter()
                logits = model.decode([cache], [token])[0]
                steps.append(time.perf_counter() - start)
    mask_ms, step_ms = 1000 * statistics.median(masks), 1000 * statistics.median(steps)
    return {
        "tokens": len(masks),
        "mask_ms": round(mask_ms, 4),
        "decode_step_ms": round(step_ms, 4),
        "ratio_vs_decode_step": round(mask_ms / step_ms, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 seeds")
    args = parser.parse_args(argv)
    figures = run(2 if args.quick else 20)
    print(f"{'tokens':>8} {'mask ms':>10} {'step ms':>10} {'mask/step':>10}")
    print(
        f"{figures['tokens']:>8} {figures['mask_ms']:>10.4f} {figures['decode_step_ms']:>10.4f} "
        f"{figures['ratio_vs_decode_step']:>10.3f}"
    )
    met = {"mask_vs_decode_step": figures["ratio_vs_decode_step"] <= TARGET_RATIO}
    print("target met" if all(met.values()) else f"target missed: mask > {TARGET_RATIO}x step")
    targets = {"mask_vs_decode_step": TARGET_RATIO}
    summary = [
        Target("mask_vs_decode_step", figures["ratio_vs_decode_step"], TARGET_RATIO, "lower", "x")
    ]
    doc = {"figures": figures, "targets": targets, "met": met}
    print(json.dumps({**doc, "summary": [t.row() for t in summary]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
