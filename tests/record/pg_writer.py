"""A writer process for ``test_postgres_crash.py``: appends to one stream of a PostgreSQL
store until it is killed, printing each acknowledged append.

``python -m tests.record.pg_writer URL SIGNING_KEY APPLIANCE_KEY USER_KEY STREAM SEED``.
It prints ``R`` once its log is open and the stream recovered (opened on first start), then
``A SEQ LEAF_HEX`` for each append only after ``Log.append`` returned (durable), one line
each, flushed.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from record.digest import Domain, digest
from record.log import Log
from record.schema import TurnStarted
from record.seal import KeyPair


def main(url: str, signing: str, appliance: str, user: str, stream: str, seed: str) -> None:
    appliance_key = KeyPair.read(Path(appliance))
    recipients = [KeyPair.read(Path(user)).recipient, appliance_key.recipient]
    rnd = random.Random(int(seed))
    with Log.open(url, signing_key=Path(signing), appliance_key=appliance_key) as log:
        if log.store.size(stream) == 0:
            log.open_stream(stream, recipients)
        log.checkpoint(stream)  # recovers the stream's tree and data key after a kill
        print("R", flush=True)
        for turn in range(1 << 62):
            data = rnd.randbytes(rnd.choice((0, 16, 300, 5000)))
            body = TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))
            appended = log.append(stream, body)
            print(f"A {appended.seq} {appended.leaf_hash.hex()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
