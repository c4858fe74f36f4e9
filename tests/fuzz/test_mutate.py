"""The JSON-aware mutation ``make fuzz`` uses: it keeps JSON valid, changes it, and never
fails on what it reads (a cycle once made it crash the fuzzer)."""

from __future__ import annotations

import json

from fuzz import reply_anthropic, request_openai
from fuzz._mutate import mutate_json


def test_mutating_a_request_gives_other_valid_json() -> None:
    seed = request_openai.seeds()[1]
    changed = 0
    for i in range(500):
        out = mutate_json(seed, i)
        assert out is not None
        json.loads(out)
        changed += out != seed
    assert changed > 400


def test_mutating_a_stream_changes_one_data_line_and_keeps_the_prefix() -> None:
    seed = reply_anthropic.seeds()[1]
    for i in range(500):
        out = mutate_json(seed, i, prefix=1)
        assert out is not None and out[:1] == seed[:1]
        for line in out[1:].split(b"\n"):
            if line.startswith(b"data:"):
                json.loads(line[5:])


def test_no_json_no_mutation() -> None:
    assert mutate_json(b"\x00\x01 not json", 3) is None
