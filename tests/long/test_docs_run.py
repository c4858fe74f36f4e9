"""The docs run as written (#18): every command block of ``README.md``, ``docs/cli.md`` and
``docs/harness.md``, run literally, in order, by ``bash`` in a fresh folder with no state
(``make test-long``: it runs the real model).

A command block is a fenced block tagged ``sh`` (or untagged) whose lines start with a
command. Each line runs as written, with two fillings only: ``SESSION`` becomes the id the
last ``session new`` printed, and a line ending in ``&`` starts in the background (``up``:
the next line runs once it is serving). ``eval "$(…)"`` keeps the variables it exports for
the lines after it, as a shell would. A ```` ```python ```` block whose first line is
``# NAME.py`` is written to ``NAME.py`` first (``docs/harness.md``'s agent). Every line must
exit 0 and print no traceback; the lines that cannot run here are listed in ``EXCLUDED``
with the reason, and a line neither run nor listed fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/cli.md", "docs/harness.md")
#: Lines that cannot run here, as written in the docs, each with why.
EXCLUDED = {
    "make demo": "it sets up .venv in the checkout, then runs `affidavit demo`, which "
    "tests/harness/test_demo.py runs",
    "make test": "the suite this test is part of",
    "affidavit diverge --last 10 --webhook URL": "it would post to a real URL",
}
_COMMAND = re.compile(r"(affidavit|make|eval|python)\b")
_SESSION = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.M)


@dataclass
class Block:
    doc: str
    lines: list[str]
    files: dict[str, str] = field(default_factory=dict)  # written before the block runs


def blocks() -> Iterator[Block]:
    """The command blocks of the docs, in order, with the files their python blocks write."""
    for doc in DOCS:
        text = (REPO / doc).read_text("utf-8")
        found = re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)
        pending: dict[str, str] = {}
        commands: list[Block] = []
        for tag, body in found:
            first = body.split("\n", 1)[0]
            if tag == "python" and re.fullmatch(r"# [\w.-]+\.py", first):
                pending[first[2:]] = body
                continue
            lines = [line for line in body.splitlines() if line.strip()]
            if tag in ("sh", "") and lines and all(_COMMAND.match(line) for line in lines):
                commands.append(Block(doc, lines))
        for block in commands:  # a python file is written before the first block needs it
            for name in list(pending):
                if any(f"python {name}" in line for line in block.lines):
                    block.files[name] = pending.pop(name)
            yield block


def _bare(line: str) -> str:
    """The command without its trailing comment, as the exclusion list writes it."""
    return " ".join(shlex.split(line, comments=True))


class Shell:
    """Runs lines one by one in a folder, keeping exported variables and the last session."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
        self.env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = str(REPO)
        self.session: str | None = None
        self.background: list[subprocess.Popen[str]] = []
        self.ran: list[str] = []

    def run(self, line: str) -> None:
        if "SESSION" in line:
            assert self.session is not None, f"{line!r}: no session id printed before it"
            line = line.replace("SESSION", self.session)
        command = line.split("  #", 1)[0].rstrip()
        if command.endswith("&"):
            self._start(command.removesuffix("&").strip())
            return
        script = command
        if command.startswith("eval "):  # keep what it exports, as a shell would
            script = f"{command}\nenv -0"
        done = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True,
            text=True, timeout=1800,
        )  # fmt: skip
        assert "Traceback" not in done.stderr, f"{line!r} printed a traceback:\n{done.stderr}"
        assert done.returncode == 0, (
            f"{line!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        out = done.stdout
        if command.startswith("eval "):
            pairs = [item.split("=", 1) for item in out.split("\0") if "=" in item]
            self.env.update({k: v for k, v in pairs})
            out = ""
        sessions = _SESSION.findall(out)
        if "session new" in command and sessions:
            self.session = sessions[0]
        self.ran.append(line)

    def _start(self, command: str) -> None:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.background.append(process)
        appliance = self.cwd / ".affidavit" / "appliance.json"
        deadline = time.monotonic() + 600
        while not appliance.is_file():
            assert process.poll() is None, f"{command!r} stopped:\n{process.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"{command!r} did not come up in 10 minutes"
            time.sleep(0.5)
        self.ran.append(command + " &")

    def stop(self) -> None:
        for process in self.background:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_the_docs_command_blocks_are_found() -> None:
    """The reader sees the blocks: the README's agent and record flows, and the agent file."""
    found = list(blocks())
    everything = [line for block in found for line in block.lines]
    assert any(line.startswith("affidavit up &") for line in everything)
    assert any(line.startswith("affidavit log verify") for line in everything)
    assert any("agent.py" in block.files for block in found)
    listed = {_bare(line) for line in everything}
    assert set(EXCLUDED) <= listed, set(EXCLUDED) - listed  # no stale exclusions


@pytest.mark.timeout(1800)  # the real model answers two turns, a re-execution and an agent
def test_every_command_block_runs_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    skipped: list[str] = []
    try:
        for block in blocks():
            for name, text in block.files.items():
                (tmp_path / name).write_text(text)
            for line in block.lines:
                if _bare(line) in EXCLUDED:
                    skipped.append(_bare(line))
                    continue
                shell.run(line)
    finally:
        shell.stop()
    assert sorted(skipped) == sorted(EXCLUDED)
    assert shell.ran, "no command ran"
