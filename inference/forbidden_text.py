"""Keeping strings out of a reply whatever tokens spell them (``tool_choice: "none"``).

Where a vocabulary has one token for ``<tool_call>`` (Qwen's), masking that token is enough
to keep a reply free of tool calls. Where the tag is several tokens (SmolLM2's: ``<``,
``tool``, ``_``, ``call``, ``>``), a token mask cannot say it; :class:`ForbiddenText` can.
It is a constraint for the scheduler (the :class:`~inference.scheduler.Constraint`
protocol): before each token it allows exactly the tokens whose text, appended to what the
reply already ends with, completes none of the forbidden strings.

Per step it costs one look-up: for every forbidden string and every proper prefix of it,
the mask of tokens that would complete the string after that prefix is computed once per
vocabulary (:class:`ForbiddenMasks`); the reply's tail picks the prefixes that apply.
Under ``tool_choice: "none"`` the engine forbids both tags of the tool-call layout: the
call tag (no calls) and the tool-response tag (the model does not write tool results).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ForbiddenMasks", "ForbiddenText"]


class ForbiddenMasks:
    """Per forbidden string and prefix length ``k``: the tokens allowed after ``s[:k]``."""

    def __init__(self, token_texts: Sequence[str], forbidden: Sequence[str]) -> None:
        if not forbidden or any(not s for s in forbidden):
            raise ValueError("forbidden strings must be non-empty")
        self.forbidden = tuple(forbidden)
        self._masks: dict[tuple[str, int], torch.Tensor] = {}
        for s in self.forbidden:
            for k in range(len(s)):
                head = s[:k]
                self._masks[s, k] = torch.tensor([s not in head + t for t in token_texts])

    def allowed_after(self, text: str) -> torch.Tensor:
        """Tokens that may follow ``text`` (its tail decides) without completing a string."""
        mask: torch.Tensor | None = None
        for s in self.forbidden:
            for k in range(len(s)):
                if text.endswith(s[:k]):
                    m = self._masks[s, k]
                    mask = m if mask is None else mask & m
        assert mask is not None  # k = 0 always applies
        return mask


class ForbiddenText:
    """One reply's constraint: never complete a forbidden string; never complete itself."""

    def __init__(self, masks: ForbiddenMasks, token_texts: Sequence[str]) -> None:
        self._masks = masks
        self._texts = token_texts
        self._tail = ""
        self._keep = max(len(s) for s in masks.forbidden)

    def allowed(self) -> torch.Tensor:
        return self._masks.allowed_after(self._tail)

    def advance(self, token_id: int) -> None:
        self._tail = (self._tail + self._texts[token_id])[-self._keep :]

    @property
    def complete(self) -> bool:
        return False  # it only forbids: the reply ends by an end token or max_tokens
