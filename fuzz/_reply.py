"""What the proxy reads out of a provider's reply, shared by the three reply targets:
``reply_facts`` (fingerprint, reproducibility block), the tool calls it admits
(``egress_proxy.admission``, ``egress_proxy.tools``), the derived tool-call ids and their
rewriting (``egress_proxy.tool_ids``), and the annotation splice. None of them may raise:
a reply is whatever the upstream sent. What ``reply_facts`` keeps for the record must be
readable back by the record's reader (a review found a block nested 220 deep that was not).
"""

from __future__ import annotations

from egress_proxy.admission import reply_calls
from egress_proxy.providers import DIALECTS, reply_facts, splice_member
from egress_proxy.sse import EventSplitter
from egress_proxy.tool_ids import Deriver
from egress_proxy.tools import tool_call_ids
from fuzz.common import InvariantBroken
from record.digest import Domain, canonical_json, digest
from record.errors import SchemaError
from record.schema import ModelResponse, parse_body

_PROMPT = digest(Domain.PROMPT, b"{}")


def reply_checks(route: str, data: bytes) -> None:
    """Read ``data`` as a reply on ``route``; the first byte's low bit says streamed or not."""
    streamed = bool(data[:1]) and data[0] & 1 == 1
    body = data[1:]
    dialect = DIALECTS[route]
    fingerprint, block = reply_facts(body, streamed)
    if block is not None:
        recorded = ModelResponse(
            request_seq=0,
            outcome="COMMITTED",
            status=200,
            response_bytes=body,
            response_digest=digest(Domain.RESPONSE, body),
            fingerprint=fingerprint,
            reproducibility=block,
        )
        try:
            parse_body("model.response", canonical_json(recorded.model_dump(mode="json")))
        except SchemaError as exc:
            raise InvariantBroken(f"the record cannot read back what it keeps: {exc}") from None
    reply_calls(body)
    tool_call_ids(body)
    deriver = Deriver(dialect.name, _PROMPT, 1)
    deriver.scan(body, streamed)
    if streamed:
        splitter = EventSplitter()
        for event_block in splitter.feed(body):
            deriver.rewrite_event(event_block)
        if splitter.tail:
            deriver.rewrite_event(splitter.tail)
    else:
        deriver.rewrite_json(body)
        splice_member(body, "affidavit", {"record": "x"})
