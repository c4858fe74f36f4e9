"""A turn whose model reply was cut mid-stream reconstructs like any other.

Found running the README's flow with the real model: a reply that never ended (the SDK gave
up) was recorded ``UNKNOWN`` with what arrived, the turn ``FAILED``; ``replay
--reconstruct`` then printed a traceback (the record's cut reached the SDK as a raw
exception). Now the cut reaches the SDK as the broken stream it was, and the reconstruction
reproduces the failed turn exactly. A real provider on loopback (Starlette, streaming SSE,
then dropping the connection) stands behind the real proxy; the CLI runs as a user runs it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from affidavit.cli import main
from harness.state import Home
from harness.up import _serve, running_appliance

CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "cut-model",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Half an ans"}}],
}


async def _completions(request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        yield f"data: {json.dumps(CHUNK)}\n\n".encode()
        raise ConnectionResetError("the provider went away mid-reply")

    return StreamingResponse(body(), media_type="text/event-stream")


def test_a_turn_whose_reply_was_cut_reconstructs_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", _completions, methods=["POST"])])
    home = Home(tmp_path / "home")
    with (
        _serve(app) as url,
        running_appliance(home, provider={"api": "openai", "base_url": url}, model="cut-model"),
    ):
        where = ["--home", str(home.root)]
        assert main(["session", "new", "--pin", "seed=1,max_tokens=16", "--json", *where]) == 0
        session = json.loads(capsys.readouterr().out)["session"]
        assert main(["turn", session, "hello", "--json", *where]) == 1
        turn = json.loads(capsys.readouterr().out)
        assert turn["outcome"] == "FAILED"
        capsys.readouterr()
        assert main(["replay", session, "0", "--reconstruct", "--json", *where]) == 0
        out, err = capsys.readouterr()
    assert "Traceback" not in err
    report = json.loads(out)
    assert report["ok"] is True and report["answer_identical"] is True
    assert [(s["request_seq"], s["identical"]) for s in report["steps"]] == [(3, True)]
