"""``tool_choice: "none"`` where the tool-call tag is several tokens: the tag can be spelled
by no sequence of tokens, while everything else stays allowed."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="the constraint builds torch masks (`engine` extra)")

from inference.forbidden_text import ForbiddenMasks, ForbiddenText  # noqa: E402

VOCAB = [
    "<",
    "tool",
    "_",
    "call",
    ">",
    "<tool",
    "_call>",
    "<tool_call>",
    "hi",
    " ",
    "tool_call>",
    "",
]


masks = ForbiddenMasks(VOCAB, ["<tool_call>"])


def test_no_token_sequence_spells_the_tag_and_other_text_stays_reachable() -> None:
    for seq in itertools.product(range(len(VOCAB)), repeat=4):
        c, text = ForbiddenText(masks, VOCAB), ""
        for token in seq:
            if not c.allowed()[token]:
                break
            c.advance(token)
            text += VOCAB[token]
        assert "<tool_call>" not in text, [VOCAB[t] for t in seq]
    c = ForbiddenText(masks, VOCAB)
    for token in ("<", "tool", "_", "call"):
        assert c.allowed()[VOCAB.index(token)]
        c.advance(VOCAB.index(token))
    allowed = c.allowed()
    assert not allowed[VOCAB.index(">")]  # the one token that would finish the tag
    c2 = ForbiddenText(masks, VOCAB)
    c2.advance(VOCAB.index("<"))
    assert not c2.allowed()[VOCAB.index("tool_call>")]  # "<" + "tool_call>" is the tag
    assert c2.allowed()[VOCAB.index("tool")]
    assert allowed[VOCAB.index("hi")] and allowed[VOCAB.index("_")]
    assert not ForbiddenText(masks, VOCAB).allowed()[VOCAB.index("<tool_call>")]
    assert not c.complete  # it only forbids; the reply ends by an end token or length


def test_empty_forbidden_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ForbiddenMasks(VOCAB, [""])
