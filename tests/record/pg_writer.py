"""A writer process for ``test_postgres_crash.py``: appends to one stream of a PostgreSQL
store until it is killed, printing each acknowledged append.

``python -m tests.record.pg_writer URL SIGNING_KEY APPLIANCE_KEY USER_KEY STREAM SEED
[LEASE_WAIT]``. It prints ``R`` once its log is open, the stream recovered (opened on first
start) and leased to it, then ``A SEQ LEAF_HEX`` for each append only after ``Log.append``
returned (durable), one line each, flushed. Refused the stream's lease (another live writer
held it past ``LEASE_WAIT`` seconds), it prints the error and exits 1.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from record.digest import Domain, digest
from record.errors import LeaseHeld
from record.log import Log
from record.schema import TurnStarted
from record.seal import KeyPair


def main(
    url: str, signing: str, appliance: str, user: str, stream: str, seed: str, wait: str = "10"
) -> None:
    appliance_key = KeyPair.read(Path(appliance))
    recipients = [KeyPair.read(Path(user)).recipient, appliance_key.recipient]
    rnd = random.Random(int(seed))
    with Log.open(
        url, signing_key=Path(signing), appliance_key=appliance_key, lease_wait=float(wait)
    ) as log:
        if log.store.size(stream) == 0:
            log.open_stream(stream, recipients)
        try:
            log.checkpoint(stream)  # takes the lease; recovers the tree and data key
        except LeaseHeld as exc:
            print(exc.diagnostics(), file=sys.stderr, flush=True)
            sys.exit(1)
        print("R", flush=True)
        for turn in range(1 << 62):
            data = rnd.randbytes(rnd.choice((0, 16, 300, 5000)))
            body = TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))
            appended = log.append(stream, body)
            print(f"A {appended.seq} {appended.leaf_hash.hex()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:8])
