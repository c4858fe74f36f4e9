"""What each member of a reply's reproducibility block means, in one line for an auditor.

The engine writes the block (``inference.block``), the proxy adds its own ``affidavit_…``
members; the panel shows it as a labelled table, one explanation per row, and warns when
nothing says the reply came out of a TEE (``tee_type`` ``none``, or no ``image_digest``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["FIELDS", "ReproRow", "no_tee", "repro_rows"]

#: One line per member: why an auditor would look at it.
FIELDS: dict[str, str] = {
    # where it ran
    "tee_type": "the trusted execution environment the engine ran in (none: not in a TEE)",
    "image_digest": "digest of the enclave image the engine ran from (null: no attested image)",
    # which model
    "model": "the model name the engine served",
    "weights_digest": "sha256 of the weights loaded: the model that actually ran",
    "weights_source": "where the weights came from (format, package, file and its sha256)",
    # what it was asked
    "prompt_digest": "sha256 of the prompt the engine rendered",
    "prompt_tokens_digest": "sha256 of the token ids the model actually ran",
    "clock": "the instant injected into the prompt, so the model's 'now' is recorded",
    "request_id": "the reply's id, derived from the request bytes when pinned (never random)",
    # how it sampled
    "seed": "the sampling seed the engine ran with: same seed, same bytes, same reply",
    "temperature": "sampling temperature the engine applied",
    "top_p": "nucleus sampling cut-off the engine applied",
    "top_k": "top-k sampling cut-off (0: off)",
    "max_tokens": "the longest reply the engine would write",
    # the software and numerics
    "engine": "the inference engine and its version",
    "system_fingerprint": "the engine's fingerprint of its configuration (OpenAI's field)",
    "torch_version": "the torch build: another build may round differently",
    "mkl_version": "the MKL math library build used on CPU",
    "mkl_cbwr": "MKL's conditional-numerical-reproducibility branch (null: not pinned)",
    "device": "where the model ran (cpu, cuda)",
    "dtype": "the number format of the weights and activations",
    "batch_invariance": "whether the engine's self-test found its kernels batch-invariant",
    "invariance_path": "the linear-algebra path the start-up self-test picked",
    "kv_cache_mode": "strict: no cache shared with other sessions; shared: cached prefixes reused",
    # the run (the only members that may differ between runs of the same pinned bytes)
    "cached_tokens": "prompt tokens served from a cache (only shared mode may differ per run)",
    "batch_peers_max": "most other requests that shared a decode step (describes the run)",
    # the proxy's own
    "affidavit_tool_call_ids": "the proxy's tool-call ids: derived ones replace the upstream's",
    "affidavit_harness": "what the harness told the proxy about this call",
    "affidavit_replay_verdict": "on a replay: whether prompt, clock, request and reply matched",
    "affidavit_proxy_timing": "the proxy's timings of this call (describe the run, not the reply)",
    "affidavit_proxy_added_latency_seconds": "time the proxy itself added to the call",
    "affidavit_proxy_added_ttfb_seconds": "time the proxy added before the first byte",
    "affidavit_proxy_bytes": "bytes the proxy relayed for this call",
    "affidavit_proxy_calls": "upstream calls the proxy made for this reply",
    "affidavit_proxy_outcomes": "how each upstream call the proxy made ended",
}
UNKNOWN = "not described by this panel: a member the engine or upstream added"


@dataclass(frozen=True)
class ReproRow:
    """One member of the block as the table shows it."""

    name: str
    value: str  # JSON text
    meaning: str
    warn: bool = False  # the member says nothing attests where the reply was made


def no_tee(block: dict[str, Any]) -> list[str]:
    """Why the block does not show the reply came from a TEE (empty: it does).

    Only a block that names where it ran is judged: a reply without these members (another
    upstream, or an error) is not, since there is nothing there to miss."""
    why = []
    if "tee_type" in block and block["tee_type"] in (None, "", "none"):
        why.append(f"tee_type is {json.dumps(block['tee_type'])}")
    if "image_digest" in block and not block["image_digest"]:
        why.append("image_digest is null")
    return why


def repro_rows(block: dict[str, Any]) -> list[ReproRow]:
    """The block's members, each with what it means: where it ran first, then the model, the
    request, sampling, software and the run (``FIELDS``' order), then members it does not
    know, by name."""
    flagged = {"tee_type", "image_digest"} if no_tee(block) else set()
    order = {name: i for i, name in enumerate(FIELDS)}
    return [
        ReproRow(
            name,
            json.dumps(block[name], sort_keys=True, ensure_ascii=False),
            FIELDS.get(name, UNKNOWN),
            name in flagged and block[name] in (None, "", "none"),
        )
        for name in sorted(block, key=lambda n: (order.get(n, len(order)), n))
    ]
