"""``record.decoded`` word for word, on bytes written out here.

Redaction judges what the decoder makes of recorded bytes, so each of its readings is held
whole: which form bytes are, JSON inside JSON to its depth, HTTP split and de-chunked, the
event-stream fields, and each streaming dialect folded into the reply it stands for (pieces
joined, later values winning, indexes missing or odd), with what it did not fold kept.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from record.decoded import decode, decode_event_stream, decode_http, read


def _sse(*events: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


# -- forms -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "form", "value"),
    [
        (b' \n{"a": [1, "x"]}', "json", {"a": [1, "x"]}),
        (b"[1, 2]", "json", [1, 2]),
        (b"{not json", "text", "{not json"),
        (b"[", "text", "["),
        (b"plain words", "text", "plain words"),
        (b"", "text", ""),
        (b"caf\xc3\xa9", "text", "caf\u00e9"),
        (b"\xff\xfe", "binary", None),
        (b"{\xff", "binary", None),
        (
            b"HTTP/1.1 204 No Content\r\n\r\n",
            "http",
            {"head": "HTTP/1.1 204 No Content", "body": ""},
        ),
        (b"HTTP/2 200\n\n", "http", {"head": "HTTP/2 200\n\n", "body": ""}),
        (b"GET /x HTTP/1.1\r\n\r\nq", "http", {"head": "GET /x HTTP/1.1", "body": "q"}),
        (b"get /x HTTP/1.1\r\n\r\n", "text", "get /x HTTP/1.1\r\n\r\n"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "text", "HTTP/1.1 20 OK\r\n\r\n"),
        (b" HTTP/1.1 200 OK\r\n\r\n", "text", " HTTP/1.1 200 OK\r\n\r\n"),
    ],
)
def test_bytes_are_read_as_what_they_are(data: bytes, form: str, value: Any) -> None:
    got = read(data)
    assert (got.form, got.value) == (form, value)
    assert decode(data) == value


@pytest.mark.parametrize(
    "start", [b"data:", b"event:", b"id:", b"retry:", b":", b"\xef\xbb\xbfdata:"]
)
def test_each_field_and_a_comment_start_an_event_stream(start: bytes) -> None:
    got = read(b"  " + start + b" 1\n\n")
    assert got.form == "event-stream"
    assert read(b"datum: 1\n\n").form == "text"


def test_nesting_past_what_python_follows_is_shown_as_text() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    got = read(deep)
    assert (got.form, got.value) == ("text", deep.decode())


# -- JSON inside JSON ------------------------------------------------------------------------


def test_json_strings_that_are_objects_or_arrays_are_opened_to_a_depth_of_eight() -> None:
    inner: Any = {"end": True}
    for _ in range(9):
        inner = {"s": json.dumps(inner)}
    value = decode(json.dumps(inner).encode())
    opened = 0
    while isinstance(value, dict) and isinstance(value.get("s"), dict):
        value, opened = value["s"], opened + 1
    assert opened == 8
    assert isinstance(value["s"], str)  # the ninth level is left as its text
    assert decode(b'{"a": " [1, {\\"b\\": 2}]", "c": "{bad", "d": "12", "e": ["[3]"], "f": 4}') == {
        "a": [1, {"b": 2}],
        "c": "{bad",
        "d": "12",
        "e": [[3]],
        "f": 4,
    }


# -- HTTP ------------------------------------------------------------------------------------


def test_http_head_is_text_and_a_chunked_body_is_joined() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"transfer-encoding: gzip, Chunked\r\n\r\n"
        b'4;ext=1\r\n{"a"\r\n5\r\n: "b"\r\nA\r\n, "c": 12}\r\n0\r\nTrailer: x\r\n\r\n'
    )
    assert decode_http(data) == {
        "head": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        "transfer-encoding: gzip, Chunked",
        "body": {"a": "b", "c": 12},
    }


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", "zz\r\nabc\r\n0\r\n\r\n"),  # not a size
        (b"3", "3"),  # no line end
        (b"-1\r\nabc\r\n0\r\n\r\n", "-1\r\nabc\r\n0\r\n\r\n"),  # a negative size
        (b"3\r\nabc\r\n2\r\nde\r\n", "abcde"),  # no last chunk
        (b"3\r\nabc\r\n0\r\n\r\n2\r\nxx\r\n", "abc"),  # nothing after the last chunk
        (b" 3 \r\nabc\r\n0\r\n", "abc"),
    ],
)
def test_a_chunked_body_is_joined_or_kept_as_it_is(body: bytes, text: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert decode_http(head + body)["body"] == text


def test_a_body_is_dechunked_only_when_the_head_says_so() -> None:
    body = b"3\r\nabc\r\n0\r\n\r\n"
    for head in (
        b"HTTP/1.1 200 OK\r\nX-Note: chunked\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: unchunked\r\n",
    ):
        assert decode_http(head + b"\r\n" + body)["body"] == body.decode()
    assert (
        decode_http(b"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n")["head"] == "HTTP/1.1 200 OK\r\nX: \ufffd"
    )


# -- event streams ---------------------------------------------------------------------------


def test_event_fields_are_read_as_the_standard_says() -> None:
    data = (
        b": a comment\r\n"
        b"event: first\r\n"
        b"data:no space\r\n"
        b"data:  two spaces\r\n"
        b"id: 7\r\n"
        b"retry: 10\r\n"
        b"\r\n"
        b"event: named-only\n\n"
        b"data\n\n"
        b"id: only\n\n"
        b"data: [DONE] \rdata: after\r\r"
        b"data: last without a blank line"
    )
    out = decode_event_stream(data)
    assert out["events"] == 5
    assert out["reply"] is None
    assert out["other"] == [
        {"event": "first", "data": "no space\n two spaces"},
        "",
        "[DONE] \nafter",
        "last without a blank line",
    ]


def test_events_that_are_not_folded_are_kept_decoded() -> None:
    data = (
        b'data: [1, "{\\"a\\": 2}"]\n\n'
        b'data: "text"\n\n'
        b"data:  [DONE]  \n\n"
        b"data: {bad\n\n"
        b"event: e\ndata: {bad\n\n"
        b'data: {"type": 5}\n\n'
        b'data: {"type": "unknown.kind", "v": "[4]"}\n\n'
        b'data: {"no": "type"}\n\n'
    )
    out = decode_event_stream(data)
    assert out == {
        "events": 8,
        "reply": None,
        "other": [
            [1, {"a": 2}],
            "text",
            "{bad",
            {"event": "e", "data": "{bad"},
            {"type": 5},
            {"type": "unknown.kind", "v": [4]},
            {"no": "type"},
        ],
    }


def test_chat_chunks_are_folded_into_one_completion() -> None:
    data = _sse(
        {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"},
                      "finish_reason": None}]},
        {"id": "c1", "object": "chat.completion.chunk",
         "choices": [{"index": 0, "delta": {"content": "lo"}}, {"index": 1, "delta": {"content": "B"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "web_", "arguments": '{"u'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"name": "fetch", "arguments": 'rl": 1}'}},
            {"index": 1, "id": "call_2", "function": {"name": "x", "arguments": "[]"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "logprobs": None}],
         "usage": {"total_tokens": 7}},
    )  # fmt: skip
    out = decode_event_stream(data)
    assert out["events"] == 6 and out["other"] == []
    reply = out["reply"]
    assert list(reply) == ["id", "created", "model", "usage", "object", "choices"]
    assert reply == {
        "id": "c1",
        "created": 5,
        "model": "m",
        "usage": {"total_tokens": 7},
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello",
                    "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "web_fetch", "arguments": {"url": 1}}},
                        {"id": "call_2", "function": {"name": "x", "arguments": []}},
                    ],
                },
                "finish_reason": "tool_calls",
            },
            {"index": 1, "message": {"content": "B"}, "finish_reason": None},
        ],
    }  # fmt: skip


def test_chat_chunks_with_odd_indexes_and_members() -> None:
    data = _sse(
        {"choices": [{"delta": {"content": "a"}}, "not a choice", {"index": "x", "delta": {"content": "b"}}]},
        {"choices": [{"index": 2, "delta": "not a delta", "message": {"m": 1}, "extra": "e"}]},
        {"choices": [{"index": 0, "delta": {"content": None, "refusal": None, "n": 1}}]},
        {"choices": [{"index": 0, "delta": {"n": 2, "tool_calls": [
            "not a call",
            {"id": "t0", "function": {"name": "f"}},
            {"index": "odd", "id": "t1", "function": "whole"},
            {"index": 0, "function": {"arguments": None}},
        ]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": "not a list", "content": 3}}]},
        {"choices": "not a list", "type": "chunk"},
        done=False,
    )  # fmt: skip
    out = decode_event_stream(data)
    assert out["events"] == 6
    assert out["other"] == [{"choices": "not a list", "type": "chunk"}]
    assert out["reply"] == {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "content": 3,
                    "refusal": None,
                    "n": 2,
                    "tool_calls": "not a list",
                },
                "finish_reason": None,
            },
            {"index": 2, "message": {}, "finish_reason": None, "extra": "e"},
        ],
    }


def test_tool_calls_without_an_index_take_the_next_place() -> None:
    data = _sse(
        {"choices": [{"delta": {"tool_calls": [
            {"id": "t0", "function": {"name": "f"}},
            {"index": "odd", "id": "t1", "function": "whole"},
            {"index": 0, "function": {"arguments": None}},
            {"index": 0, "function": {"name": "g"}},
        ]}}]},
    )  # fmt: skip
    message = decode_event_stream(data)["reply"]["choices"][0]["message"]
    assert message == {
        "tool_calls": [
            {"id": "t0", "function": {"name": "fg", "arguments": None}},
            {"id": "t1", "function": "whole"},
        ]
    }


def test_a_chat_stream_with_no_choices_is_still_a_completion() -> None:
    out = decode_event_stream(_sse({"id": "c", "choices": []}))
    assert out["reply"] == {"id": "c", "object": "chat.completion", "choices": []}


def test_pieces_join_only_onto_text() -> None:
    data = _sse(
        {"choices": [{"index": 0, "delta": {"a": 1, "b": "x", "c": None}}]},
        {"choices": [{"index": 0, "delta": {"a": "s", "b": 2, "c": "t"}}]},
        {"choices": [{"index": 0, "delta": {"a": "u", "b": None, "c": "v"}}]},
    )
    message = decode_event_stream(data)["reply"]["choices"][0]["message"]
    assert message == {"a": "su", "b": 2, "c": "tv"}


def test_messages_events_are_folded_into_one_message() -> None:
    data = _sse(
        {"type": "message_start", "message": {"id": "m", "content": [{"type": "text", "text": "pre"}],
                                              "usage": {"input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "he"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "y"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta",
                                                              "partial_json": '{"k": '}},
        {"type": "content_block_delta", "index": 0, "delta": {"partial_json": '"[1]"}'}},
        {"type": "content_block_delta", "index": 2, "delta": {"partial_json": "{broken"}},
        {"type": "content_block_delta", "index": "odd", "delta": {"partial_json": 5}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
        {"type": "ping"},
        {"type": "message_stop"},
    )  # fmt: skip
    out = decode_event_stream(data)
    assert out["events"] == 13 and out["other"] == []
    assert out["reply"] == {
        "id": "m",
        "content": [
            {"type": "text", "text": "pre"},
            {"input": {"k": [1]}, "partial_json": 5},
            {"type": "text", "text": "hey"},
            {"input": "{broken"},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 9},
        "stop_reason": "end_turn",
    }


def test_messages_events_without_a_start() -> None:
    data = _sse(
        {"type": "message_delta", "delta": "not a delta", "usage": {"output_tokens": 2}},
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": "odd"},
        {"type": "message_start", "message": "not a message"},
        {"type": "content_block_start", "index": 0, "content_block": "not a block"},
        {"type": "content_block_delta", "index": 0, "delta": "not a delta"},
    )  # fmt: skip
    out = decode_event_stream(data)
    assert out["reply"] == {
        "usage": {"output_tokens": 2},
        "stop_reason": "max_tokens",
        "content": [],
    }
    assert [e["type"] for e in out["other"]] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
    ]


def test_message_usage_that_is_not_an_object_is_replaced() -> None:
    data = _sse(
        {"type": "message_start", "message": {"usage": "odd", "content": "odd"}},
        {"type": "message_delta", "usage": {"output_tokens": 4}},
    )
    assert decode_event_stream(data)["reply"] == {"usage": {"output_tokens": 4}, "content": []}


def test_content_blocks_alone_make_a_message() -> None:
    data = _sse(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_delta", "index": 3, "delta": {"text": "b"}},
    )
    assert decode_event_stream(data)["reply"] == {
        "type": "message",
        "content": [{"text": "a"}, {"text": "b"}],
    }


def test_a_responses_stream_keeps_its_last_response_and_joins_its_deltas() -> None:
    data = _sse(
        {"type": "response.created", "response": {"id": "r", "status": "in_progress"}},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "wor"},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "ld"},
        {"type": "response.output_text.delta", "delta": "hel"},
        {"type": "response.output_text.delta", "output_index": "odd", "delta": "lo "},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
        {"type": "response.output_text.delta", "output_index": 2, "delta": 5},
        {"type": "response.output_text.done", "output_index": 1, "text": "world"},
        {"type": "response.output_item.added", "item": {"id": "i"}},
        {"type": "response.other"},
        {"type": "response.completed", "response": {"id": "r", "status": "completed"}},
    )  # fmt: skip
    out = decode_event_stream(data)
    assert out["events"] == 12
    assert out["reply"] == {
        "id": "r",
        "status": "completed",
        "streamed": [
            {"output_index": 0, "type": "response.function_call_arguments", "text": {}},
            {"output_index": 0, "type": "response.output_text", "text": "hello "},
            {"output_index": 1, "type": "response.output_text", "text": "world"},
        ],
    }
    assert out["other"] == [
        {"type": "response.output_text.delta", "output_index": 2, "delta": 5},
        {"type": "response.output_text.done", "output_index": 1, "text": "world"},
        {"type": "response.output_item.added", "item": {"id": "i"}},
        {"type": "response.other"},
    ]


def test_responses_deltas_alone_make_a_response() -> None:
    data = _sse({"type": "response.output_text.delta", "delta": "x"})
    assert decode_event_stream(data)["reply"] == {
        "object": "response",
        "streamed": [{"output_index": 0, "type": "response.output_text", "text": "x"}],
    }
    only = decode_event_stream(_sse({"type": "response.created", "response": {"id": "r"}}))
    assert only["reply"] == {"id": "r"}


def test_chat_wins_over_messages_and_messages_over_responses() -> None:
    chat = {"choices": [{"delta": {"content": "c"}}]}
    message = {"type": "message_start", "message": {"id": "m"}}
    response = {"type": "response.created", "response": {"id": "r"}}
    both = decode_event_stream(_sse(response, message, chat))["reply"]
    assert both["object"] == "chat.completion"
    assert decode_event_stream(_sse(response, message))["reply"] == {"id": "m", "content": []}


def test_a_chunk_size_is_hexadecimal() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"10\r\n" + b"0123456789abcdef" + b"\r\n1F\r\n" + b"g" * 31 + b"\r\n0\r\n\r\n"
    assert decode_http(head + body)["body"] == "0123456789abcdef" + "g" * 31


def test_blank_lines_before_the_first_field_are_no_event() -> None:
    out = decode_event_stream(b"\n\r\n: comment\n\ndata: 1\n\n")
    assert out["events"] == 1 and out["other"] == [1]


def test_an_event_stream_that_is_not_utf8_is_read_with_replacements() -> None:
    out = decode_event_stream(b'data: {"choices": [{"delta": {"content": "a\xffb"}}]}\n\n')
    assert out["reply"]["choices"][0]["message"] == {"content": "a\ufffdb"}
    assert read(b"data: \xff\n\n").value == {"events": 1, "reply": None, "other": ["\ufffd"]}


def _chain(levels: int) -> str:
    """A JSON string holding an object whose ``s`` holds the next, ``levels`` deep."""
    inner: Any = {"end": True}
    for _ in range(levels - 1):
        inner = {"s": json.dumps(inner)}
    return json.dumps(inner)


def _opened(value: Any) -> int:
    levels = 0
    while isinstance(value, dict):
        levels, value = levels + 1, value.get("s")
    return levels


def test_json_inside_stream_events_and_replies_is_opened_eight_deep() -> None:
    chain = _chain(10)
    data = _sse(
        [chain],
        {"type": "unknown.kind", "s": chain},
        {"choices": [{"delta": {"content": chain}}]},
    )
    out = decode_event_stream(data)
    assert _opened(out["other"][0][0]) == 8
    assert _opened(out["other"][1]["s"]) == 8
    assert _opened(out["reply"]["choices"][0]["message"]["content"]) == 8


def test_a_choice_or_a_call_that_is_not_an_object_is_skipped_and_the_rest_folded() -> None:
    data = _sse(
        {"choices": ["not a choice", {"index": "x", "delta": {"content": "b", "tool_calls": [
            "not a call", {"index": 0, "id": "t"}]}}]},
    )  # fmt: skip
    choice = decode_event_stream(data)["reply"]["choices"]
    assert choice == [
        {
            "index": 0,
            "message": {"content": "b", "tool_calls": [{"id": "t"}]},
            "finish_reason": None,
        }
    ]


def test_a_content_delta_without_an_index_is_block_zero() -> None:
    data = _sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "a"}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}},
    )
    assert decode_event_stream(data)["reply"]["content"] == [{"type": "text", "text": "ab"}]
