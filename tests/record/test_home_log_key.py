"""``record.cli.home_log_key``: which appliance a home's streams on a shared store belong to."""

from __future__ import annotations

import json
from pathlib import Path

from record.checkpoint import Signer
from record.cli import SIGNING_KEY_FILE, home_log_key
from record.log import LOG_KEY_NAME


def test_the_key_appliance_json_names_counts_only_for_its_own_store(tmp_path: Path) -> None:
    assert home_log_key(tmp_path) is None  # a home with neither
    mine = Signer.load_or_create(tmp_path / SIGNING_KEY_FILE, LOG_KEY_NAME).vkey()
    assert home_log_key(tmp_path) == mine  # `up --store URL`'s key
    running = Signer.generate(LOG_KEY_NAME).vkey()
    record = str(tmp_path / "record.db")
    (tmp_path / "appliance.json").write_text(json.dumps({"store": record, "log_key": running}))
    assert home_log_key(tmp_path) == running
    assert home_log_key(tmp_path, Path(record)) == running
    # asked about another store (a database given with --store): not that appliance's key
    assert home_log_key(tmp_path, "postgresql://u@db.example/records") == mine
