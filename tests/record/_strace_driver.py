"""Driver for ``test_crash_safety``'s strace check (not a test module).

``python _strace_driver.py STORE N`` opens a Log on ``STORE``, opens one stream, writes
``START`` to stdout, then appends ``N`` entries one after another from this one thread and,
after each ``append`` has returned, writes ``ACK <seq>`` to stdout with a single ``write(1,
…)`` so that the trace shows exactly when each acknowledgement left the process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from record.digest import Domain, digest
from record.log import Log
from record.schema import TurnStarted
from record.seal import KeyPair

STREAM = "strace"


def main(argv: list[str]) -> int:
    store, count = Path(argv[1]), int(argv[2])
    key = KeyPair.generate()
    with Log.open(store, appliance_key=key) as log:
        log.open_stream(STREAM, [key.recipient])
        os.write(1, b"START\n")
        for i in range(count):
            data = bytes([0xFF, 0xFE, i % 256]) * (i + 1)  # not UTF-8
            body = TurnStarted(turn=i, input_bytes=data, input_digest=digest(Domain.INPUT, data))
            appended = log.append(STREAM, body)
            os.write(1, f"ACK {appended.seq}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
